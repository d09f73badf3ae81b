//! The status handler: applies a provider's delivery receipt to its message (rules R5, R6,
//! R7). The receipt is decoded, its status mapped and its timestamp parsed; any of these
//! failing parks the raw receipt with the reason. The message is found by (gateway, provider
//! id). The state is appended and the job marked DONE in one statement, so a crash at any point
//! leaves the job to be handled again, never half-applied.

use std::collections::HashMap;
use std::time::Duration;

use herald_core::job::Job;
use herald_core::receipt::{decode, map_status, parse_timestamp};
use herald_core::JobType;
use herald_queue::Delivery;
use herald_store::outbox::defer_job;
use herald_store::receipts::{
    apply_receipt, load_receipt, mark_silent_unknown, message_for_receipt, park,
};
use herald_store::StoreError;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::metrics as m;
use crate::{Handled, Handler};

#[derive(Debug, Clone)]
pub struct StatusSettings {
    /// Operator-configured status aliases, upper case: `ACKD` → `DELIVRD`.
    pub aliases: HashMap<String, String>,
    /// Attempts to find the receipt's message (the send may not be recorded yet) before the
    /// receipt is parked.
    pub max_attempts: u32,
    /// Wait before looking for the message again.
    pub retry_after: Duration,
}

impl Default for StatusSettings {
    fn default() -> Self {
        Self {
            aliases: HashMap::new(),
            max_attempts: 10,
            retry_after: Duration::from_secs(2),
        }
    }
}

pub struct StatusHandler {
    pub pool: PgPool,
    pub settings: StatusSettings,
}

/// What became of one receipt.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Applied {
    State(&'static str),
    Parked(String),
    Deferred,
    StaleCopy,
}

impl Handler for StatusHandler {
    async fn handle(&self, delivery: Delivery, _cancel: CancellationToken) -> Handled {
        let job = match delivery.job {
            Ok(job) if job.job_type == JobType::Status => job,
            Ok(job) => {
                outcome("wrong_job_type");
                tracing::error!(entry = %delivery.entry_id, job_type = %job.job_type, outbox_id = job.outbox_id,
                    "a non-status job is on the status stream; dropping this copy (its outbox row stays the proof)");
                return Handled::Done;
            }
            Err(raw) => {
                ::metrics::counter!(m::MALFORMED, "job_type" => "status").increment(1);
                tracing::error!(entry = %delivery.entry_id, raw = %raw,
                    "stream entry is not a valid job; dropping this copy (its outbox row stays the proof)");
                return Handled::Done;
            }
        };
        match self.apply(&job).await {
            Ok(Applied::State(state)) => {
                outcome("applied");
                ::metrics::counter!(m::RECEIPT_STATES, "state" => state).increment(1);
                Handled::Done
            }
            Ok(Applied::Parked(reason)) => {
                outcome("parked");
                ::metrics::counter!(m::PARKED, "job_type" => "status").increment(1);
                tracing::warn!(outbox_id = job.outbox_id, %reason, "receipt parked with its raw body");
                Handled::Done
            }
            Ok(Applied::Deferred) => {
                outcome("deferred");
                Handled::Done
            }
            Ok(Applied::StaleCopy) => {
                outcome("stale_copy");
                Handled::Done
            }
            Err(err) => {
                outcome("store_error");
                tracing::error!(outbox_id = job.outbox_id, error = %err, "could not record the receipt's outcome; leaving the entry to be reclaimed");
                Handled::Keep
            }
        }
    }
}

impl StatusHandler {
    #[tracing::instrument(skip_all, fields(outbox_id = job.outbox_id, partition = job.partition, message_id))]
    async fn apply(&self, job: &Job) -> Result<Applied, StoreError> {
        let parked = |outcome: Option<i64>, reason: String| match outcome {
            Some(_) => Applied::Parked(reason),
            None => Applied::StaleCopy,
        };
        let Some(receipt_id) = job.payload.get("receipt_id").and_then(|v| v.as_i64()) else {
            let raw = job.payload.to_string();
            let reason = "status job without a receipt_id".to_owned();
            let id = park(
                &self.pool,
                job.partition,
                job.outbox_id,
                JobType::Status,
                None,
                raw.as_bytes(),
                &reason,
            )
            .await?;
            return Ok(parked(id, reason));
        };
        let Some(receipt) = load_receipt(&self.pool, receipt_id).await? else {
            let reason = format!("receipt {receipt_id} does not exist");
            let id = park(
                &self.pool,
                job.partition,
                job.outbox_id,
                JobType::Status,
                None,
                job.payload.to_string().as_bytes(),
                &reason,
            )
            .await?;
            return Ok(parked(id, reason));
        };
        let receipt = &receipt;
        let park_receipt = |reason: String| async move {
            let id = park(
                &self.pool,
                job.partition,
                job.outbox_id,
                JobType::Status,
                Some(receipt.id),
                &receipt.raw,
                &reason,
            )
            .await?;
            Ok::<_, StoreError>(parked(id, reason))
        };
        let decoded = match decode(&receipt.raw) {
            Ok(decoded) => decoded,
            Err(err) => return park_receipt(err.to_string()).await,
        };
        let state = match map_status(&decoded.status, &self.settings.aliases) {
            Ok(state) => state,
            Err(err) => return park_receipt(err.to_string()).await,
        };
        let provider_time = match parse_timestamp(&decoded.timestamp) {
            Ok(time) => time,
            Err(err) => return park_receipt(err.to_string()).await,
        };
        let message_id = message_for_receipt(
            &self.pool,
            &receipt.gateway,
            &decoded.provider_id,
            receipt.received_at,
        )
        .await?;
        let Some(message_id) = message_id else {
            let reason = format!(
                "no message was sent through gateway {:?} with provider id {:?}",
                receipt.gateway, decoded.provider_id
            );
            if job.attempt >= self.settings.max_attempts as i32 {
                return park_receipt(format!("{reason} (after {} attempts)", job.attempt)).await;
            }
            // The send may not be recorded yet (the receipt outran the worker's ledger write).
            return Ok(
                if defer_job(
                    &self.pool,
                    job.partition,
                    job.outbox_id,
                    &reason,
                    self.settings.retry_after,
                )
                .await?
                {
                    Applied::Deferred
                } else {
                    Applied::StaleCopy
                },
            );
        };
        tracing::Span::current().record("message_id", tracing::field::display(message_id));
        let detail = serde_json::json!({
            "gateway": receipt.gateway,
            "provider_id": decoded.provider_id,
            "provider_status": decoded.status,
            "provider_time": provider_time,
            "receipt_id": receipt.id,
        });
        Ok(
            if apply_receipt(
                &self.pool,
                job.partition,
                job.outbox_id,
                message_id,
                state,
                detail,
            )
            .await?
            {
                Applied::State(state.as_str())
            } else {
                Applied::StaleCopy
            },
        )
    }
}

fn outcome(label: &'static str) {
    ::metrics::counter!(m::JOBS, "job_type" => "status", "outcome" => label).increment(1);
}

/// Rule R7: every `interval`, messages accepted longer than `window` ago without a final
/// receipt become UNKNOWN (counted on their own), until `cancel`.
pub async fn reconcile_silent(
    pool: PgPool,
    window: Duration,
    interval: Duration,
    cancel: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
        loop {
            match mark_silent_unknown(&pool, window, 1000).await {
                Ok(0) => break,
                Ok(count) => {
                    ::metrics::counter!(m::UNKNOWN).increment(count);
                    tracing::warn!(count, "no final receipt within the window: marked UNKNOWN");
                }
                Err(err) => {
                    tracing::warn!(error = %err, "reconciliation failed; retrying next interval");
                    break;
                }
            }
        }
    }
}
