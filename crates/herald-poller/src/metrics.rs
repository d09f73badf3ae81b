//! The poller's metrics, declared in one place.

pub const CLAIMED: &str = "herald_outbox_claimed_total";
pub const PUBLISHED: &str = "herald_jobs_published_total";
pub const MARKED: &str = "herald_outbox_marked_total";
pub const PUBLISH_FAILURES: &str = "herald_publish_failures_total";
pub const PUBLISH_PAUSED: &str = "herald_publish_paused_total";
pub const REDRIVEN: &str = "herald_outbox_redriven_total";
pub const REDRIVE_PASS_DURATION: &str = "herald_redrive_pass_duration_seconds";
pub const OWNED_PARTITIONS: &str = "herald_poller_owned_partitions";
pub const FENCING_REJECTIONS: &str = "herald_fencing_rejections_total";
pub const HANDOFF_GAP: &str = "herald_partition_handoff_gap_seconds";
pub const ACQUISITIONS: &str = "herald_partition_acquisitions_total";
pub const RELEASES: &str = "herald_partition_releases_total";
pub const LEASE_LOSSES: &str = "herald_lease_losses_total";
pub const RETENTION_REMOVED: &str = "herald_retention_removed_total";
pub const RETENTION_COMPACTED: &str = "herald_retention_compacted_total";
pub const RETENTION_WAITING: &str = "herald_retention_waiting_partitions";
pub const RETENTION_PASS_DURATION: &str = "herald_retention_pass_duration_seconds";
pub const RETENTION_LAST_PASS: &str = "herald_retention_last_pass_timestamp_seconds";
pub const RETENTION_OLDEST: &str = "herald_retention_oldest_row_age_seconds";
/// Bytes on disk of each table retention keeps bounded, after each pass.
pub const RETENTION_TABLE_BYTES: &str = "herald_retention_table_bytes";

pub fn describe() {
    metrics::describe_counter!(CLAIMED, "Outbox rows claimed (PENDING to PROCESSING).");
    metrics::describe_counter!(PUBLISHED, "Jobs published to a queue store, by job type.");
    metrics::describe_counter!(MARKED, "Outbox rows marked PUBLISHED.");
    metrics::describe_counter!(
        PUBLISH_FAILURES,
        "Batches the queue store refused, by reason (oom, error); their rows went back to PENDING."
    );
    metrics::describe_counter!(
        PUBLISH_PAUSED,
        "Claims skipped for a job type because its queue store was full or unreachable."
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
    metrics::describe_counter!(
        FENCING_REJECTIONS,
        "Statements refused because a newer owner recorded a higher epoch."
    );
    metrics::describe_histogram!(
        HANDOFF_GAP,
        metrics::Unit::Seconds,
        "Time a partition had no owner: from its ownership key's deletion to the next acquisition."
    );
    metrics::describe_counter!(ACQUISITIONS, "Partitions acquired by this poller.");
    metrics::describe_counter!(
        RELEASES,
        "Partitions released by this poller after draining."
    );
    metrics::describe_counter!(
        LEASE_LOSSES,
        "Times this poller stopped claiming because its lease was at risk or lost."
    );
    metrics::describe_counter!(
        herald_coord::membership::RENEW_FAILURES,
        "Lease renewals that did not get through."
    );
    metrics::describe_counter!(
        RETENTION_REMOVED,
        "Rows retention removed, by what: done_jobs (DONE outbox rows), events (history events folded into compact ones), messages (closed messages removed whole), message_rows (their messages, events and ledger rows), receipts, parked (replayed parking rows of removed receipts)."
    );
    metrics::describe_counter!(
        herald_store::retention::ARCHIVED_ROWS,
        "Rows written to --archive-dir before their removal, by what: messages (with their events and ledger rows), receipts (with their parking rows)."
    );
    metrics::describe_counter!(
        herald_store::retention::ARCHIVED_BYTES,
        metrics::Unit::Bytes,
        "Compressed bytes written to --archive-dir, by what."
    );
    metrics::describe_counter!(
        RETENTION_COMPACTED,
        "Closed messages whose history was folded into one compact event."
    );
    metrics::describe_gauge!(
        RETENTION_WAITING,
        "Partitions whose DONE-row retention waits on a row older than the retention whose work is still open (0 once the loop stops)."
    );
    metrics::describe_histogram!(
        RETENTION_PASS_DURATION,
        metrics::Unit::Seconds,
        "One maintenance pass: retention and compaction until nothing more is due."
    );
    metrics::describe_gauge!(
        RETENTION_OLDEST,
        metrics::Unit::Seconds,
        "Age of the oldest row still kept, by table (messages, message_events, ledger, outbox, receipts, parking; 0: empty), after each maintenance pass."
    );
    metrics::describe_gauge!(
        RETENTION_TABLE_BYTES,
        metrics::Unit::Bytes,
        "Bytes on disk of each table retention keeps bounded (heap, indexes, TOAST, partitions summed), after each maintenance pass."
    );
    metrics::describe_gauge!(
        RETENTION_LAST_PASS,
        "Unix time the last maintenance pass finished (set only by the loop's one runner, the owner of partition 0)."
    );
    for counter in [
        CLAIMED,
        MARKED,
        FENCING_REJECTIONS,
        ACQUISITIONS,
        RELEASES,
        LEASE_LOSSES,
        herald_coord::membership::RENEW_FAILURES,
    ] {
        metrics::counter!(counter).increment(0);
    }
    let _ = metrics::histogram!(REDRIVE_PASS_DURATION);
    let _ = metrics::histogram!(HANDOFF_GAP);
    for what in ["messages", "receipts"] {
        metrics::counter!(herald_store::retention::ARCHIVED_ROWS, "what" => what).increment(0);
        metrics::counter!(herald_store::retention::ARCHIVED_BYTES, "what" => what).increment(0);
    }
    for to in ["pending", "dead"] {
        metrics::counter!(REDRIVEN, "to" => to).increment(0);
    }
    for reason in ["oom", "error"] {
        metrics::counter!(PUBLISH_FAILURES, "reason" => reason).increment(0);
    }
    for job_type in herald_core::JobType::ALL {
        metrics::counter!(PUBLISHED, "job_type" => job_type.as_str()).increment(0);
        metrics::counter!(PUBLISH_PAUSED, "job_type" => job_type.as_str()).increment(0);
    }
}
