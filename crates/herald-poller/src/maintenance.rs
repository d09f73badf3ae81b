//! The maintenance loop: retention of DONE outbox rows, compaction of closed messages'
//! histories, and removal of old closed messages and receipts (`herald_store::retention`). One loop runs per deployment: the poller that owns
//! partition 0 runs it beside that partition's task, under that partition's fence, so it moves
//! with the partition at a handoff and a deposed owner's statements change nothing.

use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use herald_store::archive::{ArchiveDir, Kind, RollUp};

use herald_store::outbox::Fence;
use herald_store::retention::{
    compact_histories, remove_done_jobs, remove_messages, remove_receipts,
};
use herald_store::StoreError;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::metrics as m;

/// The partition whose owner runs the maintenance loop.
pub const MAINTENANCE_PARTITION: u32 = 0;

/// Pause between two statements of one pass, so retention never holds locks or a connection
/// for long and the pipeline's own statements run between its batches.
const BETWEEN_BATCHES: Duration = Duration::from_millis(50);

/// What is kept for how long, and how the loop paces itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetentionSettings {
    /// DONE outbox rows older than this are removed (`None`: kept for ever).
    pub done_jobs: Option<Duration>,
    /// Closed messages accepted longer ago than this get their history folded into one
    /// event (`None`: never).
    pub compact_after: Option<Duration>,
    /// Closed messages accepted longer ago than this are removed whole (with their ledger
    /// rows), and so are receipts received longer ago with their replayed parking rows
    /// (`None`: kept for ever). Messages go only once `done_jobs` retention has passed their
    /// send rows.
    pub messages: Option<Duration>,
    /// Time between two passes.
    pub interval: Duration,
    /// Rows looked at per statement: per partition (DONE outbox rows), or messages, or receipts.
    pub batch: u32,
    /// Removed messages and receipts are first written here (`herald_store::archive`).
    pub archive: Option<PathBuf>,
}

impl RetentionSettings {
    /// Whether there is anything to do at all.
    pub fn enabled(&self) -> bool {
        self.done_jobs.is_some() || self.compact_after.is_some() || self.messages.is_some()
    }
}

/// Runs passes every `settings.interval` until `cancel`, or until `fence` no longer holds
/// (the partition went to another poller, whose loop takes over).
pub async fn run(
    pool: PgPool,
    fence: Fence,
    settings: RetentionSettings,
    cancel: CancellationToken,
) {
    if !settings.enabled() {
        return;
    }
    passes(pool, fence, settings, cancel).await;
    // The gauges of a loop that stopped would otherwise keep their last value beside the next
    // owner's: a hold this loop saw is the next owner's to report.
    ::metrics::gauge!(m::RETENTION_WAITING).set(0.0);
}

/// The loop of passes `run` runs.
async fn passes(
    pool: PgPool,
    fence: Fence,
    settings: RetentionSettings,
    cancel: CancellationToken,
) {
    let archive = settings.archive.clone().map(ArchiveDir::new);
    tracing::info!(
        epoch = fence.epoch,
        "running the maintenance loop (retention, compaction)"
    );
    loop {
        let started = std::time::Instant::now();
        match pass(&pool, fence, &settings, archive.as_ref(), &cancel).await {
            Ok(()) => {
                ::metrics::histogram!(m::RETENTION_PASS_DURATION)
                    .record(started.elapsed().as_secs_f64());
                let now = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .unwrap_or_default();
                ::metrics::gauge!(m::RETENTION_LAST_PASS).set(now.as_secs_f64());
            }
            Err(StoreError::Fenced { .. }) => {
                ::metrics::counter!(m::FENCING_REJECTIONS).increment(1);
                tracing::warn!(
                    epoch = fence.epoch,
                    "the maintenance fence no longer holds; stopping this maintenance loop"
                );
                return;
            }
            Err(err) => {
                tracing::warn!(error = %err, "a maintenance pass failed; the next one goes on from where it stopped")
            }
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(settings.interval) => {}
        }
    }
}

/// One pass: every batch that is due, then stops.
async fn pass(
    pool: &PgPool,
    fence: Fence,
    settings: &RetentionSettings,
    archive: Option<&ArchiveDir>,
    cancel: &CancellationToken,
) -> Result<(), StoreError> {
    if let Some(age) = settings.done_jobs {
        loop {
            let done = remove_done_jobs(pool, fence, age, settings.batch).await?;
            ::metrics::counter!(m::RETENTION_REMOVED, "what" => "done_jobs")
                .increment(done.removed);
            ::metrics::gauge!(m::RETENTION_WAITING).set(done.waiting as f64);
            if !done.more || !pause(cancel).await {
                break;
            }
        }
    }
    if let Some(age) = settings.compact_after {
        loop {
            let done = compact_histories(pool, fence, age, settings.batch).await?;
            ::metrics::counter!(m::RETENTION_COMPACTED).increment(done.compacted);
            ::metrics::counter!(m::RETENTION_REMOVED, "what" => "events").increment(done.folded);
            if done.examined < u64::from(settings.batch.max(1)) || !pause(cancel).await {
                break;
            }
        }
    }
    if let Some(age) = settings.messages {
        if settings.done_jobs.is_some() {
            loop {
                let done = remove_messages(pool, fence, age, settings.batch, archive).await?;
                ::metrics::counter!(m::RETENTION_REMOVED, "what" => "messages")
                    .increment(done.removed);
                ::metrics::counter!(m::RETENTION_REMOVED, "what" => "message_rows")
                    .increment(done.rows);
                if !done.more || !pause(cancel).await {
                    break;
                }
            }
        }
        loop {
            let done = remove_receipts(pool, fence, age, settings.batch, archive).await?;
            ::metrics::counter!(m::RETENTION_REMOVED, "what" => "receipts").increment(done.removed);
            ::metrics::counter!(m::RETENTION_REMOVED, "what" => "parked")
                .increment(done.parked_removed);
            if !done.more || !pause(cancel).await {
                break;
            }
        }
    }
    for (table, age) in herald_store::retention::oldest_retained(pool).await? {
        ::metrics::gauge!(m::RETENTION_OLDEST, "table" => table).set(age.unwrap_or(0.0));
    }
    for (table, bytes) in herald_store::retention::table_sizes(pool).await? {
        ::metrics::gauge!(m::RETENTION_TABLE_BYTES, "table" => table).set(bytes as f64);
    }
    if let Some(archive) = archive {
        roll_up(archive).await;
    }
    Ok(())
}

/// Merges the archive files of every hour that is over (one per removal statement) into a few
/// files per hour. A failure is logged and tried again next pass: it removes nothing.
async fn roll_up(archive: &ArchiveDir) {
    for kind in [Kind::Messages, Kind::Receipts] {
        let dir = archive.clone();
        let done = tokio::task::spawn_blocking(move || dir.roll_up(kind, SystemTime::now())).await;
        match done {
            Ok(Ok(done)) if done != RollUp::default() => tracing::info!(
                kind = kind.as_str(),
                files = done.files,
                parts = done.parts,
                leftovers_removed = done.leftovers_removed,
                groups_skipped = done.groups_skipped,
                "archive files rolled up"
            ),
            Ok(Ok(_)) => {}
            Ok(Err(err)) => {
                tracing::warn!(kind = kind.as_str(), error = %err, "rolling up archive files failed; next pass tries again")
            }
            Err(err) => tracing::warn!(error = %err, "the archive roll-up task failed"),
        }
    }
}

/// Waits between two batches; false when cancelled.
async fn pause(cancel: &CancellationToken) -> bool {
    tokio::select! {
        _ = cancel.cancelled() => false,
        _ = tokio::time::sleep(BETWEEN_BATCHES) => true,
    }
}
