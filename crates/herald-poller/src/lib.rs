//! The poller. For every partition it owns it drains the outbox in a loop — claim a batch
//! (SKIP LOCKED, partial index), publish every job to its job type's stream in one pipelined
//! round trip, mark the batch PUBLISHED — until a claim comes back short, then waits for a
//! NOTIFY from the accept path or the poll interval. A separate loop re-drives rows that were
//! claimed or published but never confirmed. Every write carries the partition's fence.

pub mod metrics;
pub mod ownership;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use herald_core::job::Job;
use herald_core::{Fence, JobType};
use herald_queue::QueueStore;
use herald_store::accept::OUTBOX_CHANNEL;
use herald_store::outbox::{claim_pending, mark_published, redrive_stale, release_unpublished};
use sqlx::PgPool;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::metrics as m;
pub use crate::ownership::{Ownership, StaticOwnership};

/// How the poller paces itself.
#[derive(Debug, Clone)]
pub struct PollerSettings {
    /// Rows claimed per statement.
    pub batch_size: u32,
    /// Batches drained from one partition before it yields to the others.
    pub max_batches_per_tick: u32,
    /// Longest an idle partition waits before claiming again (NOTIFY wakes it sooner).
    pub poll_interval: Duration,
    /// How often stale rows are looked for.
    pub redrive_interval: Duration,
    /// A PROCESSING/PUBLISHED row older than this goes back to PENDING.
    pub stale_after: Duration,
    /// Claims a row may use before it becomes DEAD.
    pub max_attempts: u32,
    /// Pause after the queue store refused a publish.
    pub publish_backoff: Duration,
}

impl Default for PollerSettings {
    fn default() -> Self {
        Self {
            batch_size: 500,
            max_batches_per_tick: 20,
            poll_interval: Duration::from_millis(500),
            redrive_interval: Duration::from_secs(5),
            stale_after: Duration::from_secs(120),
            max_attempts: 10,
            publish_backoff: Duration::from_secs(1),
        }
    }
}

/// A poller: its pool, the queue store of each job type, and its settings.
#[derive(Clone)]
pub struct Poller {
    pool: PgPool,
    stores: Arc<HashMap<JobType, QueueStore>>,
    settings: PollerSettings,
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
}

impl Poller {
    pub fn new(
        pool: PgPool,
        stores: HashMap<JobType, QueueStore>,
        settings: PollerSettings,
    ) -> Self {
        Self {
            pool,
            stores: Arc::new(stores),
            settings,
        }
    }

    /// Runs until `cancel`: one drain task per owned partition, the NOTIFY listener, the
    /// re-drive loop. On cancel, every task finishes its in-flight batch and returns.
    pub async fn run(&self, fences: Vec<Fence>, cancel: CancellationToken) -> anyhow::Result<()> {
        ::metrics::gauge!(m::OWNED_PARTITIONS).set(fences.len() as f64);
        let wakers: Arc<HashMap<u32, Arc<Notify>>> = Arc::new(
            fences
                .iter()
                .map(|fence| (fence.partition, Arc::new(Notify::new())))
                .collect(),
        );
        let mut tasks = tokio::task::JoinSet::new();
        tasks.spawn(listen_for_new_rows(
            self.pool.clone(),
            wakers.clone(),
            cancel.clone(),
        ));
        for fence in &fences {
            let poller = self.clone();
            let waker = wakers[&fence.partition].clone();
            let cancel = cancel.clone();
            let fence = *fence;
            tasks.spawn(async move { poller.drain_forever(fence, waker, cancel).await });
        }
        let poller = self.clone();
        let redrive_cancel = cancel.clone();
        tasks.spawn(async move { poller.redrive_forever(fences, redrive_cancel).await });
        while let Some(joined) = tasks.join_next().await {
            joined?;
        }
        Ok(())
    }

    async fn drain_forever(&self, fence: Fence, waker: Arc<Notify>, cancel: CancellationToken) {
        while !cancel.is_cancelled() {
            let outcome = match self.drain(fence).await {
                Ok(outcome) => outcome,
                Err(err) => {
                    tracing::warn!(partition = fence.partition, error = %err, "drain failed; retrying after the poll interval");
                    Drained::Empty
                }
            };
            let pause = match outcome {
                Drained::MoreWork => {
                    tokio::task::yield_now().await;
                    continue;
                }
                Drained::Empty => self.settings.poll_interval,
                Drained::PublishFailed => self.settings.publish_backoff,
            };
            tokio::select! {
                _ = cancel.cancelled() => break,
                _ = waker.notified(), if outcome == Drained::Empty => {}
                _ = tokio::time::sleep(pause) => {}
            }
        }
    }

    /// Drains one partition: claim, publish, mark, until a claim comes back short or the
    /// batch cap is reached.
    pub async fn drain(&self, fence: Fence) -> anyhow::Result<Drained> {
        for _ in 0..self.settings.max_batches_per_tick {
            let jobs = claim_pending(&self.pool, fence, self.settings.batch_size).await?;
            if jobs.is_empty() {
                return Ok(Drained::Empty);
            }
            ::metrics::counter!(m::CLAIMED).increment(jobs.len() as u64);
            let claimed = jobs.len();
            let ids: Vec<i64> = jobs.iter().map(|job| job.outbox_id).collect();
            if let Err(err) = self.publish(&jobs).await {
                ::metrics::counter!(m::PUBLISH_FAILURES).increment(1);
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

    async fn publish(&self, jobs: &[Job]) -> anyhow::Result<()> {
        let mut by_type: HashMap<JobType, Vec<Job>> = HashMap::new();
        for job in jobs {
            by_type.entry(job.job_type).or_default().push(job.clone());
        }
        for (job_type, jobs) in by_type {
            let store = self.stores.get(&job_type).ok_or_else(|| {
                anyhow::anyhow!("no queue store configured for job type {job_type}")
            })?;
            store.publish(&jobs).await?;
            ::metrics::counter!(m::PUBLISHED, "job_type" => job_type.as_str())
                .increment(jobs.len() as u64);
        }
        Ok(())
    }

    async fn redrive_forever(&self, fences: Vec<Fence>, cancel: CancellationToken) {
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(self.settings.redrive_interval) => {}
            }
            let started = Instant::now();
            for fence in &fences {
                if cancel.is_cancelled() {
                    return;
                }
                match redrive_stale(
                    &self.pool,
                    *fence,
                    self.settings.stale_after,
                    self.settings.max_attempts,
                )
                .await
                {
                    Ok(moved) => {
                        if moved.pending > 0 || moved.dead > 0 {
                            tracing::warn!(
                                partition = fence.partition,
                                pending = moved.pending,
                                dead = moved.dead,
                                "re-drove stale outbox rows"
                            );
                        }
                        ::metrics::counter!(m::REDRIVEN, "to" => "pending")
                            .increment(moved.pending);
                        ::metrics::counter!(m::REDRIVEN, "to" => "dead").increment(moved.dead);
                    }
                    Err(err) => {
                        tracing::warn!(partition = fence.partition, error = %err, "re-drive failed")
                    }
                }
            }
            ::metrics::histogram!(m::REDRIVE_PASS_DURATION).record(started.elapsed().as_secs_f64());
        }
    }
}

/// Wakes a partition's drain task when the accept path commits a row in it. Polling stays
/// the fallback: a lost notification only delays a row by the poll interval.
async fn listen_for_new_rows(
    pool: PgPool,
    wakers: Arc<HashMap<u32, Arc<Notify>>>,
    cancel: CancellationToken,
) {
    while !cancel.is_cancelled() {
        let mut listener = match sqlx::postgres::PgListener::connect_with(&pool).await {
            Ok(listener) => listener,
            Err(err) => {
                tracing::warn!(error = %err, "cannot LISTEN; relying on polling for now");
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_secs(5)) => continue,
                }
            }
        };
        if let Err(err) = listener.listen(OUTBOX_CHANNEL).await {
            tracing::warn!(error = %err, "LISTEN failed; relying on polling for now");
            continue;
        }
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                received = listener.recv() => match received {
                    Ok(notification) => {
                        if let Some(waker) = notification
                            .payload()
                            .parse::<u32>()
                            .ok()
                            .and_then(|p| wakers.get(&p))
                        {
                            waker.notify_one();
                        }
                    }
                    Err(err) => {
                        tracing::warn!(error = %err, "LISTEN connection lost; reconnecting");
                        break;
                    }
                }
            }
        }
    }
}
