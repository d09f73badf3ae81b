//! The poller. For every partition it owns it drains the outbox in a loop — claim a batch
//! (SKIP LOCKED, partial index), publish every job to its job type's stream in one pipelined
//! round trip, mark the batch PUBLISHED — until a claim comes back short, then waits for a
//! NOTIFY from the accept path or the poll interval. A separate loop re-drives rows that were
//! claimed or published but never confirmed. Every write carries the partition's fence.
//!
//! Longer than 400 lines: the partition loop, the drain and re-drive group commits and their
//! accounting share the `Poller`'s state; the wake-ups (`wake.rs`), the fleet, the configuration
//! and the metrics have files of their own.

pub mod config;
pub mod fleet;
pub mod maintenance;
pub mod metrics;
pub mod ownership;
mod wake;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use herald_core::job::Job;
use herald_core::{Fence, JobType};
use herald_queue::monitor::MonitoredStore;
use herald_store::group::{GroupCommit, GroupSettings};
use herald_store::outbox::{
    claim_pending_of, mark_published, redrive_stale_claims_many, redrive_stale_many,
    release_unpublished, LostBefore, Redriven,
};
use herald_store::StoreError;
use sqlx::PgPool;
use tokio::sync::{Notify, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::metrics as m;
pub use crate::ownership::{Ownership, StaticOwnership};
pub use crate::wake::Wakers;

/// Why a poller's round, acquisition or run failed. Callers act on [`PollerError::is_fenced`]
/// (stop the partition: a newer owner holds it) and [`PollerError::is_out_of_memory`] (the
/// queue store is full: pause, count it apart); everything else is retried or reported
/// (docs/ERRORS.md).
#[derive(Debug, thiserror::Error)]
pub enum PollerError {
    #[error(transparent)]
    Store(#[from] herald_store::StoreError),
    #[error(transparent)]
    Queue(#[from] herald_queue::QueueError),
    #[error("etcd: {0}")]
    Coord(#[from] herald_coord::CoordError),
    #[error("no queue store configured for job type {0}")]
    NoStore(JobType),
    #[error("a partition task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
    #[error("the publish limiter is closed")]
    Closed(#[from] tokio::sync::AcquireError),
}

impl PollerError {
    /// A newer owner's epoch holds the partition: this poller's write changed nothing.
    pub fn is_fenced(&self) -> bool {
        matches!(self, Self::Store(herald_store::StoreError::Fenced { .. }))
    }

    /// The queue store refused the publish past its `maxmemory`.
    pub fn is_out_of_memory(&self) -> bool {
        matches!(self, Self::Queue(err) if err.is_out_of_memory())
    }
}

/// How the poller paces itself.
#[derive(Debug, Clone)]
pub struct PollerSettings {
    /// Rows claimed per statement.
    pub batch_size: u32,
    /// Batches drained from one partition before it yields to the others.
    pub max_batches_per_tick: u32,
    /// How long a partition whose round came back short waits before claiming again
    /// (NOTIFY wakes it sooner).
    pub poll_interval: Duration,
    /// The longest such wait: every round in a row that comes back short without a NOTIFY
    /// in between doubles the wait, from `poll_interval` up to this. A NOTIFY or a full
    /// round starts again from `poll_interval`.
    pub idle_poll_interval: Duration,
    /// How often stale rows are looked for.
    pub redrive_interval: Duration,
    /// A PROCESSING/PUBLISHED row older than this goes back to PENDING, if its queue store
    /// no longer holds it.
    pub stale_after: Duration,
    /// Pause after the queue store refused a publish.
    pub publish_backoff: Duration,
    /// Most publishes in flight at once over all partitions (0: no limit, one per owned
    /// partition). 1 rebuilds the serial publisher Herald started from, for comparison.
    pub publish_concurrency: usize,
    /// How long a claim that starts alone waits for other partitions' (see
    /// [`GroupSettings::linger`]).
    pub linger: Duration,
    /// Retention and compaction, run by the owner of partition 0 ([`maintenance`]).
    pub retention: maintenance::RetentionSettings,
}

impl Default for PollerSettings {
    /// The settings of `herald poller`'s defaults.
    fn default() -> Self {
        config::PollerConfig::default().settings()
    }
}

/// The wait of a partition whose rounds keep coming back short: the poll interval, doubled
/// after every such wait that no NOTIFY cut short, up to the idle poll interval. An idle
/// fleet then asks the database a few times less often, and a partition with traffic (woken
/// by NOTIFY) or a backlog (full rounds) is back at the poll interval at once.
#[derive(Debug, Clone, Copy)]
struct IdleBackoff {
    base: Duration,
    max: Duration,
    current: Duration,
}

impl IdleBackoff {
    fn new(base: Duration, max: Duration) -> Self {
        Self {
            base,
            max: max.max(base),
            current: base,
        }
    }

    /// The wait now; the next one is twice as long (up to the maximum).
    fn next(&mut self) -> Duration {
        let now = self.current;
        self.current = (self.current * 2).min(self.max);
        now
    }

    fn reset(&mut self) {
        self.current = self.base;
    }
}

/// How far the clocks of PostgreSQL (a row's `claimed_at`) and a queue store (its entries'
/// ids) may disagree, plus the time a publish takes after its claim committed. A job claimed
/// less than this before its store's oldest entry may still be that entry's neighbour.
pub const CLOCK_MARGIN: Duration = Duration::from_secs(10);

/// A poller: its pool, the queue store of each job type, and its settings.
#[derive(Clone)]
pub struct Poller {
    pool: PgPool,
    stores: Arc<HashMap<JobType, Vec<MonitoredStore>>>,
    settings: PollerSettings,
    /// Bounds publishes over all partitions when `publish_concurrency` is set.
    publish_slots: Option<Arc<Semaphore>>,
    /// Drains every partition that asks at about the same time in one claim, one publish per
    /// store (no mark; none with `publish_concurrency` set: the starting point's shape).
    drainer: Option<GroupCommit<DrainRequest, Result<Drained, StoreError>>>,
    /// Re-drives every partition that asks at about the same time (their re-drive ticks are
    /// aligned) in two statements, reading each queue store's oldest entry once.
    redriver: GroupCommit<Fence, Redrove>,
    /// The moment every idle wait is aligned to: idle partitions wake on the same ticks, so
    /// the drainer asks for all of them in one claim instead of one claim per partition
    /// spread over the poll interval.
    ticks_from: tokio::time::Instant,
}

/// A partition task asking for one round of claim and publish.
#[derive(Clone)]
struct DrainRequest {
    fence: Fence,
    open: Vec<JobType>,
}

/// How one drain of a partition ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drained {
    /// A claim came back short: nothing due is left.
    Empty,
    /// The batch cap was reached with work left.
    MoreWork,
    /// Publishing failed; the claimed rows were released.
    PublishFailed,
    /// Every queue store this partition publishes to is full or unreachable: nothing was
    /// claimed, the rows stay PENDING.
    Paused,
}

impl Poller {
    /// `stores` holds every shard of each job type, in shard order.
    pub fn new(
        pool: PgPool,
        stores: HashMap<JobType, Vec<MonitoredStore>>,
        settings: PollerSettings,
    ) -> Self {
        let publish_slots = (settings.publish_concurrency > 0)
            .then(|| Arc::new(Semaphore::new(settings.publish_concurrency)));
        let stores = Arc::new(stores);
        let drainer = (settings.publish_concurrency == 0).then(|| {
            let (pool, stores, batch) = (pool.clone(), stores.clone(), settings.batch_size);
            GroupCommit::spawn(
                "drain",
                // At most 32 partitions (32 × --batch-size jobs) per round, so one publish
                // pipeline stays a few megabytes.
                GroupSettings {
                    max_group: 32,
                    parallel: 2,
                    linger: settings.linger,
                },
                move |requests: Arc<Vec<DrainRequest>>| {
                    let (pool, stores) = (pool.clone(), stores.clone());
                    async move { drain_together(&pool, &stores, batch, &requests).await }
                },
            )
        });
        let redriver = {
            let (pool, stores, stale_after) = (pool.clone(), stores.clone(), settings.stale_after);
            GroupCommit::spawn(
                "redrive",
                GroupSettings {
                    max_group: 4096,
                    parallel: 1,
                    linger: Duration::ZERO,
                },
                move |fences: Arc<Vec<Fence>>| {
                    let (pool, stores) = (pool.clone(), stores.clone());
                    async move { redrive_together(&pool, &stores, stale_after, &fences).await }
                },
            )
        };
        Self {
            pool,
            stores,
            settings,
            publish_slots,
            drainer,
            redriver,
            ticks_from: tokio::time::Instant::now(),
        }
    }

    /// How long until the next multiple of `every` since `ticks_from`.
    fn until_next_tick(&self, every: Duration) -> Duration {
        let every_ns = every.as_nanos().max(1);
        let into = self.ticks_from.elapsed().as_nanos() % every_ns;
        Duration::from_nanos((every_ns - into) as u64)
    }

    /// One round for one partition: through the shared drainer (every partition asking at
    /// about the same time in one claim and one publish per store), or on its own in
    /// the starting point's shape.
    async fn drain_round(&self, fence: Fence) -> Result<Drained, PollerError> {
        let Some(drainer) = &self.drainer else {
            return self.drain(fence).await;
        };
        let open = self.open_job_types(fence.partition);
        if open.is_empty() {
            return Ok(Drained::Paused);
        }
        Ok(drainer.write(DrainRequest { fence, open }).await??)
    }

    /// Runs until `cancel` with a fixed set of fences (one poller, no coordinator): one task
    /// per partition and the NOTIFY listener. On cancel every task finishes its in-flight
    /// batch and returns.
    pub async fn run_static(
        &self,
        fences: Vec<Fence>,
        cancel: CancellationToken,
    ) -> Result<(), PollerError> {
        ::metrics::gauge!(m::OWNED_PARTITIONS).set(fences.len() as f64);
        let wakers = Wakers::new(fences.iter().map(|f| f.partition));
        let mut tasks = tokio::task::JoinSet::new();
        tasks.spawn(wakers.clone().listen(self.pool.clone(), cancel.clone()));
        for fence in fences {
            let poller = self.clone();
            let waker = wakers.get(fence.partition);
            let cancel = cancel.clone();
            tasks.spawn(async move {
                if poller.run_partition(fence, waker, cancel).await == PartitionExit::Fenced {
                    tracing::error!(
                        partition = fence.partition,
                        "another poller took this partition over"
                    );
                }
            });
        }
        while let Some(joined) = tasks.join_next().await {
            joined?;
        }
        Ok(())
    }

    /// Drains one owned partition until `cancel` or until the fence no longer holds, and
    /// re-drives its stale rows every `redrive_interval`. Returns after the in-flight batch.
    pub async fn run_partition(
        &self,
        fence: Fence,
        waker: Arc<Notify>,
        cancel: CancellationToken,
    ) -> PartitionExit {
        match herald_store::outbox::redrive_orphaned(&self.pool, fence).await {
            Ok(0) => {}
            Ok(moved) => {
                tracing::warn!(
                    partition = fence.partition,
                    moved,
                    "took over rows a previous owner claimed and never published"
                );
                ::metrics::counter!(m::REDRIVEN, "to" => "pending").increment(moved);
            }
            Err(err) => {
                tracing::warn!(partition = fence.partition, error = %err, "re-driving orphaned rows failed; the stale re-drive will")
            }
        }
        // The owner of partition 0 runs the deployment's one maintenance loop, under this
        // partition's fence; it stops with the partition's task.
        let maintenance = (fence.partition == maintenance::MAINTENANCE_PARTITION
            && self.settings.retention.enabled())
        .then(|| {
            let stop = cancel.child_token();
            let task = tokio::spawn(maintenance::run(
                self.pool.clone(),
                fence,
                self.settings.retention.clone(),
                stop.clone(),
            ));
            (stop.drop_guard(), task)
        });
        let exit = self.drain_partition(fence, waker, cancel).await;
        if let Some((stop, task)) = maintenance {
            drop(stop);
            if let Err(err) = task.await {
                tracing::error!(error = %err, "the maintenance loop panicked");
            }
        }
        exit
    }

    /// [`Poller::run_partition`]'s claim and re-drive loop.
    async fn drain_partition(
        &self,
        fence: Fence,
        waker: Arc<Notify>,
        cancel: CancellationToken,
    ) -> PartitionExit {
        let redrive_every = self.settings.redrive_interval;
        let mut next_redrive = tokio::time::Instant::now() + self.until_next_tick(redrive_every);
        let mut idle = IdleBackoff::new(
            self.settings.poll_interval,
            self.settings.idle_poll_interval,
        );
        while !cancel.is_cancelled() {
            if tokio::time::Instant::now() >= next_redrive {
                next_redrive = tokio::time::Instant::now() + self.until_next_tick(redrive_every);
                self.redrive(fence).await;
            }
            let outcome = match self.drain_round(fence).await {
                Ok(outcome) => outcome,
                Err(err) => {
                    if err.is_fenced() {
                        ::metrics::counter!(m::FENCING_REJECTIONS).increment(1);
                        return PartitionExit::Fenced;
                    }
                    tracing::warn!(partition = fence.partition, error = %err, "drain failed; retrying after the poll interval");
                    Drained::Empty
                }
            };
            let pause = match outcome {
                Drained::MoreWork => {
                    idle.reset();
                    tokio::task::yield_now().await;
                    continue;
                }
                // Aligned: every idle partition of this poller claims in the same round
                // (the waits double from the poll interval, so their ticks stay shared).
                Drained::Empty if self.drainer.is_some() => self.until_next_tick(idle.next()),
                Drained::Empty => idle.next(),
                Drained::PublishFailed | Drained::Paused => {
                    idle.reset();
                    self.settings.publish_backoff
                }
            };
            tokio::select! {
                _ = cancel.cancelled() => break,
                _ = waker.notified(), if outcome == Drained::Empty => idle.reset(),
                _ = tokio::time::sleep(pause) => {}
            }
        }
        PartitionExit::Cancelled
    }

    /// Drains one partition: claim, publish, mark, until a claim comes back short or the
    /// batch cap is reached.
    pub async fn drain(&self, fence: Fence) -> Result<Drained, PollerError> {
        for _ in 0..self.settings.max_batches_per_tick {
            let open = self.open_job_types(fence.partition);
            if open.is_empty() {
                return Ok(Drained::Paused);
            }
            let jobs = claim_pending_of(&self.pool, fence, self.settings.batch_size, &open).await?;
            if jobs.is_empty() {
                return Ok(Drained::Empty);
            }
            ::metrics::counter!(m::CLAIMED).increment(jobs.len() as u64);
            let claimed = jobs.len();
            let ids: Vec<i64> = jobs.iter().map(|job| job.outbox_id).collect();
            let slot = match &self.publish_slots {
                Some(slots) => Some(slots.acquire().await?),
                None => None,
            };
            let published = self.publish(&jobs).await;
            drop(slot);
            if let Err(err) = published {
                let reason = if err.is_out_of_memory() {
                    "oom"
                } else {
                    "error"
                };
                ::metrics::counter!(m::PUBLISH_FAILURES, "reason" => reason).increment(1);
                tracing::warn!(partition = fence.partition, jobs = claimed, error = %err,
                    "publish failed; returning the batch to PENDING");
                release_unpublished(&self.pool, fence, &ids).await?;
                return Ok(Drained::PublishFailed);
            }
            let marked = mark_published(&self.pool, fence, &ids).await?;
            ::metrics::counter!(m::MARKED).increment(marked);
            if claimed < self.settings.batch_size as usize {
                return Ok(Drained::Empty);
            }
        }
        Ok(Drained::MoreWork)
    }

    /// The shard of `job_type` that `partition` publishes to.
    fn shard(&self, job_type: JobType, partition: u32) -> Option<&MonitoredStore> {
        shard_of(&self.stores, job_type, partition).map(|(_, store)| store)
    }

    /// The job types whose store (for this partition) can take more jobs. Rows of the others
    /// stay PENDING until their store drains below the threshold.
    fn open_job_types(&self, partition: u32) -> Vec<JobType> {
        JobType::ALL
            .into_iter()
            .filter(|job_type| match self.shard(*job_type, partition) {
                Some(store) if store.pressure().is_ok() => true,
                Some(_) => {
                    ::metrics::counter!(m::PUBLISH_PAUSED, "job_type" => job_type.as_str())
                        .increment(1);
                    false
                }
                None => false,
            })
            .collect()
    }

    async fn publish(&self, jobs: &[Job]) -> Result<(), PollerError> {
        let mut by_type: HashMap<JobType, Vec<Job>> = HashMap::new();
        for job in jobs {
            by_type.entry(job.job_type).or_default().push(job.clone());
        }
        for (job_type, jobs) in by_type {
            // Every job of a batch is from one partition, so all go to one shard.
            let store = self
                .shard(job_type, jobs[0].partition)
                .ok_or(PollerError::NoStore(job_type))?;
            if let Err(err) = store.store.publish(&jobs).await {
                // Read the store now, so a full one pauses this and every other partition.
                store.refresh().await;
                return Err(err.into());
            }
            ::metrics::counter!(m::PUBLISHED, "job_type" => job_type.as_str())
                .increment(jobs.len() as u64);
        }
        Ok(())
    }

    /// Both re-drive passes over one partition, shared with every partition that asks at about
    /// the same time: rows claimed or published but never confirmed (rule R3), and sends whose
    /// worker stopped renewing its claim's lease after CLAIMED (rule R4). Neither charges an
    /// attempt or makes a row DEAD. A deposed owner's re-drive changes nothing (the fence); the
    /// next claim notices and stops the task.
    async fn redrive(&self, fence: Fence) {
        match self.redriver.write(fence).await {
            Ok(Redrove {
                unconfirmed,
                stale_claims,
            }) => {
                count_redriven(fence, "redrive", Ok(unconfirmed));
                count_redriven(fence, "stale_claim", Ok(stale_claims));
            }
            Err(err) => count_redriven(fence, "redrive", Err(err)),
        }
    }
}

/// What one shared re-drive pass moved in one partition.
#[derive(Debug, Clone, Copy)]
struct Redrove {
    unconfirmed: Redriven,
    stale_claims: Redriven,
}

/// For each queue store, the moment before which the unconfirmed jobs of the partitions that
/// publish to it can only have been lost by it: its oldest entry's time minus
/// [`CLOCK_MARGIN`] (no limit when the stream is empty; nothing at all when the store cannot
/// be read, since nothing can be told apart then). Each store is read once.
async fn lost_before(
    stores: &HashMap<JobType, Vec<MonitoredStore>>,
    partitions: impl Iterator<Item = u32>,
) -> HashMap<u32, LostBefore> {
    let mut oldest: HashMap<(JobType, usize), Option<i64>> = HashMap::new();
    let mut by_partition = HashMap::new();
    for partition in partitions {
        let mut lost_before = LostBefore::default();
        for job_type in JobType::ALL {
            let Some((index, store)) = shard_of(stores, job_type, partition) else {
                continue;
            };
            let ms = match oldest.get(&(job_type, index)) {
                Some(ms) => *ms,
                None => {
                    let ms = match store.store.oldest_entry_ms().await {
                        Ok(Some(oldest)) => Some(oldest as i64 - CLOCK_MARGIN.as_millis() as i64),
                        Ok(None) => None,
                        Err(err) => {
                            tracing::warn!(%job_type, shard = index, error = %err,
                                "cannot read the queue store's oldest entry; its jobs are not re-driven this pass");
                            Some(0)
                        }
                    };
                    oldest.insert((job_type, index), ms);
                    ms
                }
            };
            lost_before.set(job_type, ms);
        }
        by_partition.insert(partition, lost_before);
    }
    by_partition
}

/// One re-drive pass over many partitions: each queue store's oldest entry read once, then
/// one statement for the unconfirmed rows and one for the stale claims of all of them.
async fn redrive_together(
    pool: &PgPool,
    stores: &HashMap<JobType, Vec<MonitoredStore>>,
    stale_after: Duration,
    fences: &[Fence],
) -> Result<Vec<Redrove>, StoreError> {
    let started = Instant::now();
    let lost = lost_before(stores, fences.iter().map(|f| f.partition)).await;
    let asked: Vec<(Fence, LostBefore)> = fences.iter().map(|f| (*f, lost[&f.partition])).collect();
    let unconfirmed = redrive_stale_many(pool, &asked, stale_after).await?;
    let stale_claims = redrive_stale_claims_many(pool, fences).await?;
    ::metrics::histogram!(m::REDRIVE_PASS_DURATION).record(started.elapsed().as_secs_f64());
    Ok(unconfirmed
        .into_iter()
        .zip(stale_claims)
        .map(|(unconfirmed, stale_claims)| Redrove {
            unconfirmed,
            stale_claims,
        })
        .collect())
}

/// The shard of `job_type` that `partition` publishes to.
fn shard_of(
    stores: &HashMap<JobType, Vec<MonitoredStore>>,
    job_type: JobType,
    partition: u32,
) -> Option<(usize, &MonitoredStore)> {
    let shards = stores.get(&job_type).filter(|shards| !shards.is_empty())?;
    let index = partition as usize % shards.len();
    Some((index, &shards[index]))
}

/// One round for many partitions: one claim statement for all of them, which leaves the rows
/// PUBLISHED, and one pipelined publish per queue store; no mark. A store that refuses its
/// publish gets its jobs' rows released (uncharged) and their partitions back off;
/// the other stores' jobs stay as claimed. Answers each request's outcome, in order.
async fn drain_together(
    pool: &PgPool,
    stores: &HashMap<JobType, Vec<MonitoredStore>>,
    batch_size: u32,
    requests: &[DrainRequest],
) -> Result<Vec<Result<Drained, StoreError>>, StoreError> {
    let asked: Vec<(Fence, Vec<JobType>)> =
        requests.iter().map(|r| (r.fence, r.open.clone())).collect();
    // A failed claim changed nothing: the group may be tried again request by request.
    // Claimed as PUBLISHED: no mark statement after the publish (see `ClaimAs::Published`).
    let claimed = herald_store::outbox::claim_pending_many(
        pool,
        &asked,
        batch_size,
        herald_store::outbox::ClaimAs::Published,
    )
    .await?;
    let mut by_store: HashMap<(JobType, usize), Vec<Job>> = HashMap::new();
    let mut fence_of: HashMap<u32, Fence> = HashMap::new();
    for (request, jobs) in requests.iter().zip(&claimed) {
        let Ok(jobs) = jobs else { continue };
        fence_of.insert(request.fence.partition, request.fence);
        ::metrics::counter!(m::CLAIMED).increment(jobs.len() as u64);
        for job in jobs {
            match shard_of(stores, job.job_type, job.partition) {
                Some((index, _)) => by_store
                    .entry((job.job_type, index))
                    .or_default()
                    .push(job.clone()),
                None => {
                    tracing::error!(job_type = %job.job_type, "no queue store configured for a claimed job; the re-drive returns it")
                }
            }
        }
    }
    let mut failed_partitions = std::collections::HashSet::new();
    for ((job_type, index), jobs) in by_store {
        let store = &stores[&job_type][index];
        match store.store.publish(&jobs).await {
            Ok(_) => {
                ::metrics::counter!(m::PUBLISHED, "job_type" => job_type.as_str())
                    .increment(jobs.len() as u64);
            }
            Err(err) => {
                store.refresh().await;
                let reason = if err.is_out_of_memory() {
                    "oom"
                } else {
                    "error"
                };
                ::metrics::counter!(m::PUBLISH_FAILURES, "reason" => reason).increment(1);
                tracing::warn!(jobs = jobs.len(), error = %err,
                    "publish failed; returning the jobs to PENDING");
                let mut by_partition: HashMap<u32, Vec<i64>> = HashMap::new();
                for job in &jobs {
                    by_partition
                        .entry(job.partition)
                        .or_default()
                        .push(job.outbox_id);
                }
                for (partition, ids) in by_partition {
                    failed_partitions.insert(partition);
                    if let Err(err) = release_unpublished(pool, fence_of[&partition], &ids).await {
                        tracing::warn!(partition, error = %err,
                            "releasing unpublished rows failed; the re-drive returns them");
                    }
                }
            }
        }
    }
    Ok(requests
        .iter()
        .zip(claimed)
        .map(|(request, jobs)| {
            let jobs = jobs?;
            Ok(if failed_partitions.contains(&request.fence.partition) {
                Drained::PublishFailed
            } else if jobs.len() < batch_size as usize {
                Drained::Empty
            } else {
                Drained::MoreWork
            })
        })
        .collect())
}

/// Logs and counts what one re-drive pass (`stage`) moved.
fn count_redriven(
    fence: Fence,
    stage: &'static str,
    result: Result<herald_store::outbox::Redriven, herald_store::StoreError>,
) {
    match result {
        Ok(moved) => {
            if moved.pending > 0 {
                tracing::warn!(
                    partition = fence.partition,
                    stage,
                    pending = moved.pending,
                    "re-drove outbox rows nobody finished"
                );
            }
            ::metrics::counter!(m::REDRIVEN, "to" => "pending").increment(moved.pending);
        }
        Err(err) => {
            tracing::warn!(partition = fence.partition, stage, error = %err, "re-drive failed")
        }
    }
}

/// Why a partition task returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PartitionExit {
    /// Asked to stop (shutdown or handoff); the in-flight batch finished.
    Cancelled,
    /// A newer owner recorded a higher epoch: this poller must not write the partition again.
    Fenced,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_idle_partition_waits_longer_each_time_up_to_the_idle_interval() {
        let mut idle = IdleBackoff::new(Duration::from_millis(500), Duration::from_secs(2));
        let waits: Vec<Duration> = (0..5).map(|_| idle.next()).collect();
        assert_eq!(
            waits,
            [500, 1000, 2000, 2000, 2000].map(Duration::from_millis)
        );
        idle.reset();
        assert_eq!(idle.next(), Duration::from_millis(500));
    }

    #[test]
    fn an_idle_interval_below_the_poll_interval_means_no_backoff() {
        let mut idle = IdleBackoff::new(Duration::from_secs(1), Duration::from_millis(100));
        assert_eq!(idle.next(), Duration::from_secs(1));
        assert_eq!(idle.next(), Duration::from_secs(1));
    }
}
