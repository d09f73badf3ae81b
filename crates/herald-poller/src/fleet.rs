//! The poller fleet: partitions leased through etcd, fenced in PostgreSQL.
//!
//! Each poller joins with a member key on its own lease. Whenever a member or ownership key
//! changes (an etcd watch, no polling), every poller recomputes the assignment from the live
//! member set ([`herald_core::assignment::assign`]) and reconciles: it first stops the
//! partitions that are no longer its own — the partition task finishes its in-flight batch,
//! then the ownership key is deleted so the next owner starts at once — and then creates the
//! ownership keys of the partitions assigned to it that nobody holds. A new key is recorded in
//! `partition_leases` before the first claim, with its create revision; PostgreSQL answers the
//! fencing epoch (its own counter, one more than the previous owner's), so the previous
//! owner's statements change nothing from then on, and an etcd that lost its data (revisions
//! starting again) cannot strand the partitions. When the lease cannot be renewed
//! for half its TTL, the poller stops every partition before the lease can expire, then joins
//! again with a new lease.
//!
//! Longer than 400 lines: the fleet's one loop (join, watch, hand off, fence) with the
//! reasons each step is ordered as it is.

use std::collections::{BTreeMap, HashMap};

use futures::StreamExt;
use std::time::{Duration, Instant};

use herald_coord::{Changes, Coordination, Coordinator, LeaseHealth, Membership};
use herald_core::{assignment::assign, Fence, PartitionCount};
use sqlx::PgPool;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::metrics as m;
use crate::{PartitionExit, Poller, PollerError, Wakers};

#[derive(Debug, Clone)]
pub struct FleetSettings {
    /// This poller's member id (unique in the fleet).
    pub member: String,
    /// The lease TTL; the poller stops writing after TTL / 2 without a renewal.
    pub lease_ttl: Duration,
    /// Longest wait for in-flight batches when stopping (shutdown or lease at risk).
    pub drain_timeout: Duration,
}

/// A poller that shares the partitions with the rest of the fleet, through etcd
/// ([`Coordinator`], the default) or any other [`Coordination`] (the fleet's tests use
/// [`herald_coord::MemoryCoordination`]).
pub struct Fleet<C = Coordinator> {
    pub poller: Poller,
    pub coord: C,
    pub pool: PgPool,
    pub partitions: PartitionCount,
    pub settings: FleetSettings,
}

struct Running {
    fence: Fence,
    /// The ownership key's create revision in etcd (the fence's epoch is PostgreSQL's).
    revision: i64,
    cancel: CancellationToken,
    task: JoinHandle<PartitionExit>,
}

enum Exit {
    Shutdown,
    LeaseLost,
}

impl<C: Coordination> Fleet<C> {
    /// Runs until `cancel`: joins, owns its share, hands partitions over as the fleet changes,
    /// and on cancel drains, deletes its keys (by revoking its lease) and returns.
    pub async fn run(&self, cancel: CancellationToken) -> Result<(), PollerError> {
        let wakers = Wakers::new(self.partitions.all());
        let listener = tokio::spawn(wakers.clone().listen(self.pool.clone(), cancel.clone()));
        while !cancel.is_cancelled() {
            let mut membership = match Membership::join(
                &self.coord,
                &self.settings.member,
                self.settings.lease_ttl,
            )
            .await
            {
                Ok(membership) => membership,
                Err(err) => {
                    tracing::warn!(error = %err, "cannot join the fleet (etcd unreachable?); retrying");
                    tokio::select! {
                        _ = cancel.cancelled() => break,
                        _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
                    }
                }
            };
            tracing::info!(member = %self.settings.member, lease = membership.lease, "joined the fleet");
            match self.serve(&mut membership, &wakers, &cancel).await {
                Exit::Shutdown => {
                    membership.leave(&self.coord).await;
                    tracing::info!("left the fleet: partitions released");
                }
                Exit::LeaseLost => {
                    ::metrics::counter!(m::LEASE_LOSSES).increment(1);
                    // If etcd is back and the old lease still lives, revoking it frees our old
                    // keys now instead of after the TTL.
                    let _ =
                        tokio::time::timeout(Duration::from_secs(1), membership.leave(&self.coord))
                            .await;
                }
            }
        }
        let _ = listener.await;
        Ok(())
    }

    async fn serve(
        &self,
        membership: &mut Membership,
        wakers: &Wakers,
        cancel: &CancellationToken,
    ) -> Exit {
        let mut owned: BTreeMap<u32, Running> = BTreeMap::new();
        let mut released_at: HashMap<u32, Instant> = HashMap::new();
        let (exits_tx, mut exits) = mpsc::unbounded_channel::<u32>();
        let mut watch = None;
        loop {
            if watch.is_none() {
                match self.coord.watch().await {
                    Ok(stream) => watch = Some(stream),
                    Err(err) => tracing::warn!(error = %err, "cannot watch etcd; retrying"),
                }
            }
            let retry = match self
                .reconcile(
                    membership.lease,
                    &mut owned,
                    &mut released_at,
                    wakers,
                    &exits_tx,
                )
                .await
            {
                Ok(()) => watch.is_none(),
                Err(err) => {
                    tracing::warn!(error = %err, "rebalancing failed; retrying");
                    true
                }
            };
            ::metrics::gauge!(m::OWNED_PARTITIONS).set(owned.len() as f64);
            tokio::select! {
                _ = cancel.cancelled() => {
                    self.stop_all(&mut owned).await;
                    return Exit::Shutdown;
                }
                health = membership.at_risk() => {
                    tracing::error!(?health, "lease at risk: stopping every partition before it can expire");
                    self.stop_all(&mut owned).await;
                    ::metrics::gauge!(m::OWNED_PARTITIONS).set(0.0);
                    debug_assert_ne!(health, LeaseHealth::Held);
                    return Exit::LeaseLost;
                }
                changed = next_change(&mut watch, &mut released_at), if watch.is_some() => {
                    if !changed {
                        watch = None;
                    }
                }
                Some(partition) = exits.recv() => {
                    tracing::debug!(partition, "a partition task ended");
                }
                _ = tokio::time::sleep(Duration::from_secs(1)), if retry => {}
            }
        }
    }

    /// Brings ownership in line with the assignment: release first, then acquire.
    async fn reconcile(
        &self,
        lease: i64,
        owned: &mut BTreeMap<u32, Running>,
        released_at: &mut HashMap<u32, Instant>,
        wakers: &Wakers,
        exits: &mpsc::UnboundedSender<u32>,
    ) -> Result<(), PollerError> {
        let me = self.settings.member.as_str();
        let mut members = self.coord.members().await?;
        if !members.iter().any(|m| m == me) {
            self.coord.put_member(me, lease).await?;
            members.push(me.to_owned());
            members.sort();
        }
        let owners = self.coord.owners().await?;
        released_at.retain(|p, _| !owners.contains_key(p));
        let target = assign(&members, self.partitions);
        let mine = |p: u32| members[target[p as usize]] == me;

        // Stop what is no longer ours (or whose task ended), all at once, then release.
        let leaving: Vec<u32> = owned
            .iter()
            .filter(|(p, running)| {
                let key_held = owners
                    .get(p)
                    .is_some_and(|o| o.owner == me && o.revision == running.revision);
                !mine(**p) || !key_held || running.task.is_finished()
            })
            .map(|(p, _)| *p)
            .collect();
        let stopping: Vec<Running> = leaving.iter().filter_map(|p| owned.remove(p)).collect();
        for running in &stopping {
            running.cancel.cancel();
        }
        let released = futures::future::join_all(stopping.into_iter().map(|running| async move {
            let partition = running.fence.partition;
            let exit = tokio::time::timeout(self.settings.drain_timeout, running.task).await;
            if !matches!(exit, Ok(Ok(PartitionExit::Cancelled))) {
                tracing::warn!(partition, ?exit, "partition task did not end cleanly");
            }
            let released = self.coord.release(partition, me, running.revision).await?;
            if released {
                tracing::info!(
                    partition,
                    epoch = running.fence.epoch,
                    "drained and released"
                );
            }
            Ok::<bool, herald_coord::CoordError>(released)
        }))
        .await;
        // Every result is looked at before an error is answered: one failed release must not
        // leave the others uncounted.
        let mut failed: Option<PollerError> = None;
        for result in released {
            match result {
                Ok(true) => ::metrics::counter!(m::RELEASES).increment(1),
                Ok(false) => {}
                Err(err) => {
                    failed.get_or_insert(err.into());
                }
            }
        }

        // A key this poller holds with no task draining it (an acquisition or a release that
        // failed half way, or a key rewritten under this poller's name) would keep its
        // partition from every poller until the key's lease ends, which for a live poller is
        // never: it is released, so the partition's assigned owner takes it anew.
        for (partition, ownership) in &owners {
            if ownership.owner != me || owned.contains_key(partition) || leaving.contains(partition)
            {
                continue;
            }
            match self.coord.release(*partition, me, ownership.revision).await {
                Ok(true) => tracing::warn!(
                    partition,
                    revision = ownership.revision,
                    "released a partition key this poller held without draining it"
                ),
                Ok(false) => {}
                Err(err) => {
                    failed.get_or_insert(err.into());
                }
            }
        }

        // Acquire what is ours and free. A partition still held by its previous owner is
        // taken when the watch reports its key deleted.
        let free: Vec<u32> = self
            .partitions
            .all()
            .filter(|p| mine(*p) && !owned.contains_key(p) && !owners.contains_key(p))
            .collect();
        // Acquired concurrently: the handoff gap of the last partition is one round trip, not
        // one per partition.
        let acquired: Vec<Result<Option<(Fence, i64)>, PollerError>> = futures::stream::iter(free)
            .map(|partition| self.acquire(partition, lease))
            .buffer_unordered(16)
            .collect()
            .await;
        for fence in acquired {
            // A failed acquisition released its key (see `acquire`); the others still start.
            let (fence, revision) = match fence {
                Ok(Some(acquired)) => acquired,
                Ok(None) => continue,
                Err(err) => {
                    failed.get_or_insert(err);
                    continue;
                }
            };
            let partition = fence.partition;
            if let Some(released) = released_at.remove(&partition) {
                ::metrics::histogram!(m::HANDOFF_GAP).record(released.elapsed().as_secs_f64());
            }
            ::metrics::counter!(m::ACQUISITIONS).increment(1);
            let cancel = CancellationToken::new();
            let poller = self.poller.clone();
            let waker = wakers.get(partition);
            let task_cancel = cancel.clone();
            let exits = exits.clone();
            let task = tokio::spawn(async move {
                let exit = poller.run_partition(fence, waker, task_cancel).await;
                if exit == PartitionExit::Fenced {
                    tracing::error!(
                        partition,
                        epoch = fence.epoch,
                        "fenced: a newer owner took the partition"
                    );
                }
                let _ = exits.send(partition);
                exit
            });
            owned.insert(
                partition,
                Running {
                    fence,
                    revision,
                    cancel,
                    task,
                },
            );
        }
        match failed {
            Some(err) => Err(err),
            None => Ok(()),
        }
    }

    /// Creates the partition's ownership key and records the ownership in PostgreSQL, which
    /// answers its fencing epoch. `None` when someone else holds the key, or PostgreSQL already
    /// records a newer ownership (this acquisition was overtaken). Answers the fence and the
    /// key's create revision.
    async fn acquire(
        &self,
        partition: u32,
        lease: i64,
    ) -> Result<Option<(Fence, i64)>, PollerError> {
        let me = self.settings.member.as_str();
        let Some(revision) = self.coord.try_acquire(partition, me, lease).await? else {
            return Ok(None);
        };
        let recorded = match self.record(partition, revision).await {
            Ok(recorded) => recorded,
            Err(err) => {
                // The key is this poller's but no task will drain it: give it back at once
                // (the next round's sweep would otherwise).
                if let Err(release) = self.coord.release(partition, me, revision).await {
                    tracing::warn!(partition, error = %release, "releasing a key whose ownership could not be recorded failed");
                }
                return Err(err);
            }
        };
        let Some(epoch) = recorded else {
            // A newer ownership is already recorded: never write.
            ::metrics::counter!(m::FENCING_REJECTIONS).increment(1);
            tracing::error!(
                partition,
                revision,
                "a newer ownership is already recorded; not claiming"
            );
            self.coord.release(partition, me, revision).await?;
            return Ok(None);
        };
        Ok(Some((Fence { partition, epoch }, revision)))
    }

    /// Records the ownership taken at `revision` in PostgreSQL, which answers its fencing epoch
    /// (None: a newer ownership is already recorded).
    async fn record(&self, partition: u32, revision: i64) -> Result<Option<i64>, PollerError> {
        let taken = herald_store::leases::Acquisition {
            generation: &self.coord.generation().await?,
            revision,
            current_revision: self.coord.current_revision().await?,
        };
        let me = self.settings.member.as_str();
        Ok(herald_store::leases::record_epoch(&self.pool, partition, me, taken).await?)
    }

    /// Stops every partition task (each finishes its in-flight batch), bounded by the drain
    /// timeout; tasks still running after it are aborted (their rows are re-driven).
    async fn stop_all(&self, owned: &mut BTreeMap<u32, Running>) {
        for running in owned.values() {
            running.cancel.cancel();
        }
        let deadline = tokio::time::Instant::now() + self.settings.drain_timeout;
        for (partition, running) in std::mem::take(owned) {
            let abort = running.task.abort_handle();
            if tokio::time::timeout_at(deadline, running.task)
                .await
                .is_err()
            {
                tracing::warn!(partition, "in-flight batch did not finish in time; aborted");
                abort.abort();
            }
        }
    }
}

/// Waits for the next watch message; records when ownership keys were deleted. Returns false
/// when the watch ended (it is then re-created).
async fn next_change(watch: &mut Option<Changes>, released_at: &mut HashMap<u32, Instant>) -> bool {
    let Some(stream) = watch.as_mut() else {
        return false;
    };
    let mut note = |change: herald_coord::Change| {
        for partition in change.released {
            released_at.entry(partition).or_insert_with(Instant::now);
        }
    };
    match stream.next().await {
        Some(Ok(change)) => {
            note(change);
            // Coalesce a burst (a handoff of many partitions) into one reconcile.
            while let Ok(Some(Ok(more))) =
                tokio::time::timeout(Duration::from_millis(20), stream.next()).await
            {
                note(more);
            }
            true
        }
        Some(Err(_)) | None => false,
    }
}
