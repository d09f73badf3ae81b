//! The poller's metrics, declared in one place.

pub const CLAIMED: &str = "herald_outbox_claimed_total";
pub const PUBLISHED: &str = "herald_jobs_published_total";
pub const MARKED: &str = "herald_outbox_marked_total";
pub const PUBLISH_FAILURES: &str = "herald_publish_failures_total";
pub const REDRIVEN: &str = "herald_outbox_redriven_total";
pub const REDRIVE_PASS_DURATION: &str = "herald_redrive_pass_duration_seconds";
pub const OWNED_PARTITIONS: &str = "herald_poller_owned_partitions";

pub fn describe() {
    metrics::describe_counter!(CLAIMED, "Outbox rows claimed (PENDING to PROCESSING).");
    metrics::describe_counter!(PUBLISHED, "Jobs published to a queue store, by job type.");
    metrics::describe_counter!(MARKED, "Outbox rows marked PUBLISHED.");
    metrics::describe_counter!(
        PUBLISH_FAILURES,
        "Batches the queue store refused; their rows went back to PENDING."
    );
    metrics::describe_counter!(
        REDRIVEN,
        "Stale outbox rows re-driven, by destination (pending, dead)."
    );
    metrics::describe_histogram!(
        REDRIVE_PASS_DURATION,
        metrics::Unit::Seconds,
        "One re-drive pass over every owned partition."
    );
    metrics::describe_gauge!(OWNED_PARTITIONS, "Partitions this poller owns.");
}
