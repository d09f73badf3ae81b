//! The worker's metrics, declared in one place.

/// Jobs handled, by job type and outcome.
pub const JOBS: &str = "herald_jobs_total";
/// Provider calls, by call (submit, lookup) and outcome (accepted, rejected, transient,
/// unknown).
pub const PROVIDER_CALLS: &str = "herald_provider_calls_total";
pub const PROVIDER_CALL_DURATION: &str = "herald_provider_call_duration_seconds";
/// Entries taken over from a consumer that stopped acknowledging.
pub const RECLAIMED: &str = "herald_jobs_reclaimed_total";
pub const READ_ERRORS: &str = "herald_queue_read_errors_total";
/// Entries that could not be decoded into a job.
pub const MALFORMED: &str = "herald_queue_malformed_entries_total";
/// Receipts applied, by the state they set.
pub const RECEIPT_STATES: &str = "herald_receipt_states_total";
/// Input parked with its raw body, by job type.
pub const PARKED: &str = "herald_parked_total";
/// Messages marked UNKNOWN by reconciliation.
pub const UNKNOWN: &str = "herald_unknown_total";
/// Ownership confirmations (outbox DONE + message CLAIMED in one transaction), by job type.
pub const CONFIRMED: &str = "herald_ownership_confirmed_total";
pub const IN_FLIGHT: &str = "herald_worker_jobs_in_flight";
/// Batches whose handler panicked, by job type: their entries stay pending and are reclaimed.
pub const HANDLER_PANICS: &str = "herald_worker_handler_panics_total";
pub const CONCURRENCY_LIMIT: &str = "herald_worker_concurrency_limit";
/// Sends whose attempts are used up while the outcome of the last one is unknown: their next
/// attempt asks the provider by key instead of submitting.
pub const SETTLING: &str = "herald_sends_settling_total";
/// Receipts waiting for their send to be recorded (`held_receipts`).
pub const HELD: &str = "herald_receipts_held";
/// Held receipts queued again once their send was recorded.
pub const RELEASED: &str = "herald_receipts_released_total";
/// Receipts that more than one recorded send could be for: their gateway reused the provider
/// id within the receipt timestamp's resolution plus the clock skew.
pub const AMBIGUOUS: &str = "herald_receipts_ambiguous_total";

/// The `outcome` values of [`JOBS`] for sends and for receipts.
pub const SEND_OUTCOMES: [&str; 12] = [
    "accepted",
    "accepted_again",
    "already_accepted",
    "rejected",
    "rejected_internal",
    "retry",
    "retry_unknown",
    "retry_not_owned",
    "dead",
    "stale_copy",
    "store_error",
    "wrong_job_type",
];
pub const STATUS_OUTCOMES: [&str; 6] = [
    "applied",
    "parked",
    "held",
    "stale_copy",
    "store_error",
    "wrong_job_type",
];
/// The `state` values of [`RECEIPT_STATES`].
pub const RECEIPT_STATE_VALUES: [&str; 4] = ["ENROUTE", "DELIVERED", "UNDELIVERED", "EXPIRED"];
/// The `outcome` values of [`PROVIDER_CALLS`].
pub const PROVIDER_OUTCOMES: [&str; 4] = ["accepted", "rejected", "transient", "unknown"];

pub fn describe() {
    metrics::describe_counter!(
        CONFIRMED,
        "Ownership confirmations (outbox DONE + message CLAIMED), by job type."
    );
    metrics::describe_counter!(JOBS, "Jobs handled, by job type and outcome.");
    metrics::describe_counter!(
        PROVIDER_CALLS,
        "Provider calls, by call (submit, lookup by key) and outcome."
    );
    metrics::describe_counter!(
        SETTLING,
        "Sends whose attempts are used up with the last outcome unknown: settled by asking the provider by key."
    );
    metrics::describe_gauge!(HELD, "Receipts waiting for their send to be recorded.");
    metrics::describe_counter!(
        RELEASED,
        "Held receipts queued again once their send was recorded."
    );
    metrics::describe_counter!(
        AMBIGUOUS,
        "Receipts more than one recorded send could be for (the gateway reused a provider id within the receipt timestamp's resolution)."
    );
    metrics::describe_histogram!(
        PROVIDER_CALL_DURATION,
        metrics::Unit::Seconds,
        "Provider submit calls, from request to answer."
    );
    metrics::describe_counter!(
        RECLAIMED,
        "Stream entries reclaimed from a stopped consumer."
    );
    metrics::describe_counter!(READ_ERRORS, "Failed reads of a job type's stream.");
    metrics::describe_counter!(MALFORMED, "Stream entries that are not a valid job.");
    metrics::describe_counter!(RECEIPT_STATES, "Receipts applied, by the state they set.");
    metrics::describe_counter!(
        PARKED,
        "Input parked with its raw body and reason, by job type."
    );
    metrics::describe_counter!(
        UNKNOWN,
        "Messages with no final receipt in the window, marked UNKNOWN."
    );
    metrics::describe_gauge!(IN_FLIGHT, "Jobs being handled now, by job type.");
    metrics::describe_counter!(
        HANDLER_PANICS,
        "Batches whose handler panicked; their entries are reclaimed, by job type."
    );
    metrics::describe_gauge!(
        CONCURRENCY_LIMIT,
        "The worker's concurrency limit, by job type."
    );
    register_at_zero();
}

/// Registers every counter with each of its label values at zero, so `rate()` and `increase()`
/// read 0 from the first scrape instead of nothing.
fn register_at_zero() {
    for (job_type, outcomes) in [
        ("send", &SEND_OUTCOMES[..]),
        ("status", &STATUS_OUTCOMES[..]),
    ] {
        for outcome in outcomes {
            metrics::counter!(JOBS, "job_type" => job_type, "outcome" => *outcome).increment(0);
        }
        for counter in [
            RECLAIMED,
            READ_ERRORS,
            MALFORMED,
            PARKED,
            CONFIRMED,
            HANDLER_PANICS,
        ] {
            metrics::counter!(counter, "job_type" => job_type).increment(0);
        }
    }
    for state in RECEIPT_STATE_VALUES {
        metrics::counter!(RECEIPT_STATES, "state" => state).increment(0);
    }
    for outcome in PROVIDER_OUTCOMES {
        for call in ["submit", "lookup"] {
            metrics::counter!(PROVIDER_CALLS, "call" => call, "outcome" => outcome).increment(0);
        }
    }
    metrics::counter!(UNKNOWN).increment(0);
    metrics::counter!(SETTLING).increment(0);
    metrics::counter!(RELEASED).increment(0);
    metrics::counter!(AMBIGUOUS).increment(0);
    let _ = metrics::histogram!(PROVIDER_CALL_DURATION);
    herald_store::group::register_metrics("ledger");
    herald_store::group::register_metrics("confirm");
}
