//! The store's metrics, declared in one place. Every statement is measured under a fixed
//! operation, each with its own duration histogram, and failures are counted by operation.

use std::future::Future;
use std::time::Instant;

/// Failed statements, by operation.
pub const STORE_ERRORS: &str = "herald_store_errors_total";
/// Outbox rows that used their last attempt and became DEAD, by where it was decided
/// (`retry`: the provider answered every attempt without an effect; `settled`: the last
/// attempt's outcome was unknown and the provider, asked by key, has no submit).
pub const DEAD: &str = "herald_dead_total";

/// A measured database operation. Each has its own histogram so a stage can be read alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    Accept,
    Claim,
    Mark,
    Release,
    Redrive,
    Confirm,
    LedgerWrite,
    Retry,
    Fail,
    TakeLease,
    Backlog,
    ReceiptApply,
    Reconcile,
    Renew,
    Hold,
    Retention,
}

impl Operation {
    pub const ALL: [Operation; 16] = [
        Operation::Accept,
        Operation::Claim,
        Operation::Mark,
        Operation::Release,
        Operation::Redrive,
        Operation::Confirm,
        Operation::LedgerWrite,
        Operation::Retry,
        Operation::Fail,
        Operation::TakeLease,
        Operation::Backlog,
        Operation::ReceiptApply,
        Operation::Reconcile,
        Operation::Renew,
        Operation::Hold,
        Operation::Retention,
    ];

    /// The operation's label value in [`STORE_ERRORS`].
    pub fn label(self) -> &'static str {
        match self {
            Operation::Accept => "accept",
            Operation::Claim => "claim",
            Operation::Mark => "mark",
            Operation::Release => "release",
            Operation::Redrive => "redrive",
            Operation::Confirm => "confirm",
            Operation::LedgerWrite => "ledger_write",
            Operation::Retry => "retry",
            Operation::Fail => "fail",
            Operation::TakeLease => "take_lease",
            Operation::Backlog => "backlog",
            Operation::ReceiptApply => "receipt_apply",
            Operation::Reconcile => "reconcile",
            Operation::Renew => "renew",
            Operation::Hold => "hold",
            Operation::Retention => "retention",
        }
    }

    /// The name of the operation's duration histogram.
    pub fn histogram(self) -> &'static str {
        match self {
            Operation::Accept => "herald_accept_transaction_duration_seconds",
            Operation::Claim => "herald_outbox_claim_duration_seconds",
            Operation::Mark => "herald_outbox_mark_duration_seconds",
            Operation::Release => "herald_outbox_release_duration_seconds",
            Operation::Redrive => "herald_outbox_redrive_duration_seconds",
            Operation::Confirm => "herald_ownership_confirm_duration_seconds",
            Operation::LedgerWrite => "herald_ledger_write_duration_seconds",
            Operation::Retry => "herald_retry_schedule_duration_seconds",
            Operation::Fail => "herald_failure_record_duration_seconds",
            Operation::TakeLease => "herald_lease_record_duration_seconds",
            Operation::Backlog => "herald_backlog_query_duration_seconds",
            Operation::ReceiptApply => "herald_receipt_mapping_duration_seconds",
            Operation::Reconcile => "herald_reconcile_duration_seconds",
            Operation::Renew => "herald_claim_renew_duration_seconds",
            Operation::Hold => "herald_receipt_hold_duration_seconds",
            Operation::Retention => "herald_retention_statement_duration_seconds",
        }
    }

    fn help(self) -> &'static str {
        match self {
            Operation::Accept => "Accept transaction: message and outbox row.",
            Operation::Claim => "Claim of a batch of PENDING outbox rows (SKIP LOCKED).",
            Operation::Mark => "Marking a published batch PUBLISHED.",
            Operation::Release => "Returning an unpublished batch to PENDING.",
            Operation::Redrive => "Re-drive of stale PROCESSING/PUBLISHED rows.",
            Operation::Confirm => "Worker ownership confirmation: outbox DONE + CLAIMED.",
            Operation::LedgerWrite => "Ledger row + ACCEPTED event after a provider id.",
            Operation::Retry => "Scheduling a retry after a failed provider call.",
            Operation::Fail => "Recording a permanent failure.",
            Operation::TakeLease => "Recording a partition's fencing epoch.",
            Operation::Backlog => "The partition overview and backlog gauge queries.",
            Operation::ReceiptApply => {
                "Finishing a batch of status jobs: each DONE with its receipts parked, held or applied."
            }
            Operation::Reconcile => "Marking silent messages UNKNOWN.",
            Operation::Renew => "Renewing the leases of a worker's claims in flight.",
            Operation::Hold => {
                "Holding receipts whose send is not recorded yet, releasing or parking them."
            }
            Operation::Retention => {
                "One retention statement: DONE outbox rows, closed messages or receipts removed, or histories compacted."
            }
        }
    }
}

/// Declares the store's metrics with their help text and units.
pub fn describe() {
    for op in Operation::ALL {
        metrics::describe_histogram!(op.histogram(), metrics::Unit::Seconds, op.help());
    }
    metrics::describe_counter!(STORE_ERRORS, "Failed database operations, by operation.");
    metrics::describe_counter!(
        DEAD,
        "Outbox rows that became DEAD, by stage (retry, settled)."
    );
    // Registered empty, so every stage shows from the first scrape (a zero count, not nothing).
    for op in Operation::ALL {
        let _ = metrics::histogram!(op.histogram());
        metrics::counter!(STORE_ERRORS, "operation" => op.label()).increment(0);
    }
    for stage in ["retry", "settled"] {
        metrics::counter!(DEAD, "stage" => stage).increment(0);
    }
}

/// Runs `fut`, recording its duration under `op` and counting it when it fails.
pub async fn measured<T, E, F>(op: Operation, fut: F) -> Result<T, E>
where
    F: Future<Output = Result<T, E>>,
{
    let started = Instant::now();
    let result = fut.await;
    metrics::histogram!(op.histogram()).record(started.elapsed().as_secs_f64());
    if result.is_err() {
        metrics::counter!(STORE_ERRORS, "operation" => op.label()).increment(1);
    }
    result
}
