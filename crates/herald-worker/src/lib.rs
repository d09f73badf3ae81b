//! The worker server. One server consumes one job type's stream with its own concurrency
//! limit (a semaphore of its own, never shared with another job type) and runs that type's
//! handler for every job, concurrently. A job is acknowledged and deleted only after its
//! handler recorded an outcome in PostgreSQL; entries a dead consumer left behind are
//! reclaimed after an idle timeout.

pub mod config;
pub mod metrics;
pub mod provider;
pub mod recorder;
pub mod send;
pub mod status;

use std::sync::Arc;
use std::time::Duration;

use herald_core::job::Job;
use herald_core::{JobKind, JobType};
use herald_queue::{Delivery, QueueStore};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::metrics as m;

/// How a worker server consumes its stream.
#[derive(Debug, Clone)]
pub struct WorkerSettings {
    /// This consumer's name in the group (unique per process).
    pub consumer: String,
    /// Jobs handled at once.
    pub concurrency: usize,
    /// Most entries read (and handed to the handler) together.
    pub max_batch: usize,
    /// Most batches handled at once per shard (0: as many as `concurrency` allows). A bound
    /// makes entries gather in the stream while the batches in flight run, so the next read
    /// takes many at once: the status handler's cost is per statement, not per receipt.
    pub batches_in_flight: usize,
    /// Longest a read blocks waiting for new entries.
    pub read_block: Duration,
    /// An entry unacknowledged this long by its consumer is taken over.
    pub reclaim_idle: Duration,
    /// How often idle entries are looked for.
    pub reclaim_interval: Duration,
}

impl Default for WorkerSettings {
    fn default() -> Self {
        Self {
            consumer: "worker".to_owned(),
            concurrency: 64,
            max_batch: 256,
            batches_in_flight: 0,
            read_block: Duration::from_secs(1),
            reclaim_idle: Duration::from_secs(60),
            reclaim_interval: Duration::from_secs(15),
        }
    }
}

/// What a handler decided about one job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handled {
    /// An outcome is recorded in PostgreSQL: acknowledge and delete the entry.
    Done,
    /// Nothing could be recorded (the database is down): leave the entry pending so it is
    /// reclaimed and handled again.
    Keep,
}

/// A job type's handler: it names the job type it does, and the runtime hands it only
/// decoded jobs of that type, read together. Everything around the handler lives once, in
/// this runtime: reading and reclaiming entries, dropping (counted and logged) entries that
/// are not jobs or are another type's, the concurrency limit, the in-flight gauge, a panic
/// caught and counted (the batch's entries stay pending and are reclaimed), and acknowledging
/// exactly the entries whose outcome the handler recorded. Adding a job type is a variant of
/// `herald_core::JobType` and a handler (`docs/DESIGN.md`, "The worker server"); the worker's
/// tests run a job type of their own (`tests/third_job_type.rs`).
pub trait Handler: Send + Sync + 'static {
    /// The enum the job type is a variant of: [`JobType`] for Herald's own handlers.
    type Kind: JobKind;

    /// The job type this handler does.
    const JOB_TYPE: Self::Kind;

    /// Handles jobs read together, each with the entry id it came in, answering each entry id
    /// with its outcome. A handler that can share statements between jobs (the send handler
    /// confirms a whole batch in one) does; any handler may handle them one by one.
    fn handle(
        &self,
        jobs: BatchJobs<Self::Kind>,
        cancel: CancellationToken,
    ) -> impl std::future::Future<Output = BatchAnswers> + Send;
}

/// Jobs of a batch, each with the entry id it came in.
pub type BatchJobs<K = JobType> = Vec<(String, Job<K>)>;
/// Entry ids with what their handler decided.
pub type BatchAnswers = Vec<(String, Handled)>;

/// Splits entries read together into the jobs of `job_type` and the answers (Done) for the
/// entries dropped: another type's job, or not a job at all. Each dropped copy is counted and
/// logged; its outbox row stays the proof that the work is owed, and re-drives it.
fn decode_batch<K: JobKind>(
    job_type: K,
    deliveries: Vec<Delivery<K>>,
) -> (BatchJobs<K>, BatchAnswers) {
    let name = job_type.name();
    let mut jobs = Vec::with_capacity(deliveries.len());
    let mut dropped = Vec::new();
    for delivery in deliveries {
        let entry_id = delivery.entry_id;
        match delivery.job {
            Ok(job) if job.job_type == job_type => jobs.push((entry_id, job)),
            Ok(job) => {
                ::metrics::counter!(m::JOBS, "job_type" => name, "outcome" => "wrong_job_type")
                    .increment(1);
                tracing::error!(entry = %entry_id, stream = name, job_type = job.job_type.name(),
                    outbox_id = job.outbox_id, "another job type's job is on this stream; dropping this copy (its outbox row stays the proof)");
                dropped.push((entry_id, Handled::Done));
            }
            Err(raw) => {
                ::metrics::counter!(m::MALFORMED, "job_type" => name).increment(1);
                tracing::error!(entry = %entry_id, stream = name, raw = %raw,
                    "stream entry is not a valid job; dropping this copy (its outbox row stays the proof)");
                dropped.push((entry_id, Handled::Done));
            }
        }
    }
    (jobs, dropped)
}

/// Runs the server over every shard of its job type until `cancel`; in-flight jobs finish
/// before it returns. One reader per shard; all share the server's one semaphore.
pub async fn run<H: Handler>(
    stores: Vec<QueueStore<H::Kind>>,
    handler: Arc<H>,
    settings: WorkerSettings,
    cancel: CancellationToken,
) {
    let semaphore = Arc::new(Semaphore::new(settings.concurrency));
    run_with_semaphore(stores, handler, settings, semaphore, cancel).await
}

/// [`run`] with a semaphore the caller owns. Giving two job types one semaphore rebuilds the
/// shared worker server whose outage motivated one server per job type: the load tester uses
/// it to show the starvation side by side with the bulkheads.
pub async fn run_with_semaphore<H: Handler>(
    stores: Vec<QueueStore<H::Kind>>,
    handler: Arc<H>,
    settings: WorkerSettings,
    semaphore: Arc<Semaphore>,
    cancel: CancellationToken,
) {
    if let Some(store) = stores.first() {
        ::metrics::gauge!(m::CONCURRENCY_LIMIT, "job_type" => store.job_type().name())
            .set(settings.concurrency as f64);
    }
    let readers = stores.into_iter().map(|store| {
        read_shard(
            store,
            handler.clone(),
            semaphore.clone(),
            settings.clone(),
            cancel.clone(),
        )
    });
    futures::future::join_all(readers).await;
}

async fn read_shard<H: Handler>(
    store: QueueStore<H::Kind>,
    handler: Arc<H>,
    semaphore: Arc<Semaphore>,
    settings: WorkerSettings,
    cancel: CancellationToken,
) {
    let job_type = store.job_type().name();
    let mut tasks = tokio::task::JoinSet::new();
    while let Err(err) = store.ensure_group().await {
        tracing::warn!(error = %err, "cannot create the consumer group yet; retrying");
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
    let mut next_reclaim = tokio::time::Instant::now() + settings.reclaim_interval;
    while !cancel.is_cancelled() {
        while let Some(joined) = tasks.try_join_next() {
            report_panic(job_type, joined);
        }
        if settings.batches_in_flight > 0 && tasks.len() >= settings.batches_in_flight {
            tokio::select! {
                _ = cancel.cancelled() => break,
                Some(joined) = tasks.join_next() => {
                    report_panic(job_type, joined);
                    continue;
                }
            }
        }
        // Read only as many entries as there are free slots, waiting for at least one.
        let one = tokio::select! {
            _ = cancel.cancelled() => break,
            permit = semaphore.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
        };
        let free = (semaphore.available_permits() + 1).min(settings.max_batch.max(1));
        drop(one);
        let deliveries = if tokio::time::Instant::now() >= next_reclaim {
            next_reclaim = tokio::time::Instant::now() + settings.reclaim_interval;
            store
                .reclaim_idle(&settings.consumer, settings.reclaim_idle, free)
                .await
                .inspect(|found| {
                    if !found.is_empty() {
                        tracing::warn!(
                            count = found.len(),
                            "reclaimed entries of a consumer that stopped"
                        );
                        ::metrics::counter!(m::RECLAIMED, "job_type" => job_type)
                            .increment(found.len() as u64);
                    }
                })
        } else {
            tokio::select! {
                _ = cancel.cancelled() => break,
                read = store.read(&settings.consumer, free, settings.read_block) => read,
            }
        };
        let deliveries = match deliveries {
            Ok(deliveries) => deliveries,
            Err(err) => {
                ::metrics::counter!(m::READ_ERRORS, "job_type" => job_type).increment(1);
                tracing::warn!(error = %err, "reading the stream failed; retrying");
                tokio::select! {
                    _ = cancel.cancelled() => break,
                    _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
                }
            }
        };
        if deliveries.is_empty() {
            continue;
        }
        // One task per batch read: a slot for each entry, one acknowledgement round trip for
        // every entry whose outcome is recorded.
        let Ok(permits) = semaphore
            .clone()
            .acquire_many_owned(deliveries.len() as u32)
            .await
        else {
            break;
        };
        let store = store.clone();
        let handler = handler.clone();
        let cancel = cancel.clone();
        tasks.spawn(async move {
            // Counted out on drop, so a panicking handler does not stay counted.
            let _in_flight = InFlight::new(store.job_type().name(), deliveries.len());
            let (jobs, mut handled) = decode_batch(H::JOB_TYPE, deliveries);
            if !jobs.is_empty() {
                if !handled.is_empty() {
                    // The dropped copies first, so a handler that panics does not send them
                    // round again (logged and counted once more at each reclaim).
                    let dropped: Vec<String> = handled.iter().map(|(id, _)| id.clone()).collect();
                    match store.ack_and_delete(&dropped).await {
                        Ok(()) => handled.clear(),
                        // Tried again with the handler's answers.
                        Err(err) => tracing::warn!(error = %err, entries = dropped.len(),
                            "acknowledging dropped entries failed"),
                    }
                }
                handled.extend(handler.handle(jobs, cancel).await);
            }
            let done: Vec<String> = handled
                .into_iter()
                .filter(|(_, handled)| *handled == Handled::Done)
                .map(|(entry_id, _)| entry_id)
                .collect();
            if let Err(err) = store.ack_and_delete(&done).await {
                // The outcomes are recorded; the entries will be reclaimed and seen as done.
                tracing::warn!(error = %err, entries = done.len(), "acknowledging failed");
            }
            drop(permits);
        });
    }
    while let Some(joined) = tasks.join_next().await {
        report_panic(job_type, joined);
    }
}

/// Says loudly that a batch's handler panicked. Nothing is lost: its entries were not
/// acknowledged, so they stay pending and are reclaimed and handled again.
fn report_panic(job_type: &'static str, joined: Result<(), tokio::task::JoinError>) {
    if let Err(err) = joined {
        if err.is_panic() {
            ::metrics::counter!(m::HANDLER_PANICS, "job_type" => job_type).increment(1);
            tracing::error!(job_type, error = %err, "a batch's handler panicked; its entries will be reclaimed");
        }
    }
}

/// A batch's jobs in the in-flight gauge, for as long as the value lives.
struct InFlight {
    job_type: &'static str,
    count: f64,
}

impl InFlight {
    fn new(job_type: &'static str, count: usize) -> Self {
        let count = count as f64;
        ::metrics::gauge!(m::IN_FLIGHT, "job_type" => job_type).increment(count);
        Self { job_type, count }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        ::metrics::gauge!(m::IN_FLIGHT, "job_type" => self.job_type).decrement(self.count);
    }
}
