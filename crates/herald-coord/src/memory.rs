//! The coordination protocol in memory, for tests of the fleet's logic: leases that expire on
//! tokio's clock, ownership keys created only if absent with growing create revisions,
//! releases that check the revision, a watch that reports every change. Several pollers of one
//! test share one [`MemoryCoordination`] through handles ([`MemoryCoordination::handle`]),
//! each of which can be cut off from it ([`MemoryCoordination::set_reachable`]) as a network
//! partition would cut one poller off from etcd. The test can also end a lease at once
//! ([`MemoryCoordination::expire`]) or make the coordinator lose its data
//! ([`MemoryCoordination::lose_data`]).
//!
//! Not for production: nothing is persisted and only one process sees it.
//!
//! Longer than 400 lines with its unit tests (the code is about 350).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use tokio::sync::broadcast;
use tokio::time::Instant;

use crate::coordination::{Change, Changes, Coordination, KeepAlive};
use crate::{CoordError, Ownership};

/// How often the leases' deadlines are checked.
const REAP_EVERY: Duration = Duration::from_millis(20);

/// A handle on an in-memory coordinator. Clones share the handle (and its reachability);
/// [`MemoryCoordination::handle`] makes another handle on the same coordinator.
#[derive(Clone)]
pub struct MemoryCoordination {
    shared: Arc<Shared>,
    reachable: Arc<AtomicBool>,
}

struct Shared {
    state: Mutex<State>,
    changes: broadcast::Sender<Change>,
}

struct State {
    revision: i64,
    next_lease: i64,
    generation: String,
    /// Member id → its lease.
    members: BTreeMap<String, i64>,
    owners: BTreeMap<u32, Ownership>,
    leases: HashMap<i64, Lease>,
}

struct Lease {
    ttl: Duration,
    deadline: Instant,
}

impl MemoryCoordination {
    /// A new, empty coordinator. Must be called within a tokio runtime: a task ends the leases
    /// whose deadline passed (it stops when the last handle is dropped).
    pub fn new() -> Self {
        let (changes, _) = broadcast::channel(1024);
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                revision: 1,
                next_lease: 1,
                generation: uuid::Uuid::now_v7().to_string(),
                members: BTreeMap::new(),
                owners: BTreeMap::new(),
                leases: HashMap::new(),
            }),
            changes,
        });
        tokio::spawn(reap(Arc::downgrade(&shared)));
        Self {
            shared,
            reachable: Arc::new(AtomicBool::new(true)),
        }
    }

    /// Another handle on the same coordinator, reachable, with a reachability of its own.
    pub fn handle(&self) -> Self {
        Self {
            shared: self.shared.clone(),
            reachable: Arc::new(AtomicBool::new(true)),
        }
    }

    /// Cuts this handle off (every call fails with [`CoordError::Unreachable`], its watches
    /// end) or connects it again. Other handles are not affected.
    pub fn set_reachable(&self, reachable: bool) {
        self.reachable.store(reachable, Ordering::SeqCst);
    }

    /// Ends `lease` now, as if its TTL passed: its keys are deleted.
    pub fn expire(&self, lease: i64) {
        let mut state = self.shared.lock();
        let changes = state.end_lease(lease);
        drop(state);
        self.shared.publish(changes);
    }

    /// The lease `member` registered under, if it is a member.
    pub fn lease_of(&self, member: &str) -> Option<i64> {
        self.shared.lock().members.get(member).copied()
    }

    /// Forgets everything, as an etcd cluster restored empty would: a new generation, and
    /// revisions starting again from the beginning.
    pub fn lose_data(&self) {
        let mut state = self.shared.lock();
        let released: Vec<u32> = state.owners.keys().copied().collect();
        state.revision = 1;
        state.generation = uuid::Uuid::now_v7().to_string();
        state.members.clear();
        state.owners.clear();
        state.leases.clear();
        drop(state);
        self.shared.publish(vec![Change { released }]);
    }

    fn reach(&self) -> Result<MutexGuard<'_, State>, CoordError> {
        if !self.reachable.load(Ordering::SeqCst) {
            return Err(CoordError::Unreachable);
        }
        Ok(self.shared.lock())
    }
}

impl Default for MemoryCoordination {
    fn default() -> Self {
        Self::new()
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn publish(&self, changes: Vec<Change>) {
        for change in changes {
            // No receiver is fine: nobody watches.
            let _ = self.changes.send(change);
        }
    }
}

impl State {
    /// Deletes the lease and every key on it; answers the changes to report.
    fn end_lease(&mut self, lease: i64) -> Vec<Change> {
        if self.leases.remove(&lease).is_none() {
            return Vec::new();
        }
        let members = self.members.len();
        self.members.retain(|_, l| *l != lease);
        let released: Vec<u32> = self
            .owners
            .iter()
            .filter(|(_, o)| o.lease == lease)
            .map(|(p, _)| *p)
            .collect();
        for partition in &released {
            self.owners.remove(partition);
        }
        if released.is_empty() && members == self.members.len() {
            return Vec::new();
        }
        self.revision += 1;
        vec![Change { released }]
    }

    fn live(&self, lease: i64) -> Result<(), CoordError> {
        if self.leases.contains_key(&lease) {
            Ok(())
        } else {
            Err(CoordError::LeaseLost)
        }
    }
}

/// Ends the leases whose deadline passed, until the coordinator is dropped.
async fn reap(shared: Weak<Shared>) {
    loop {
        tokio::time::sleep(REAP_EVERY).await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let now = Instant::now();
        let mut state = shared.lock();
        let due: Vec<i64> = state
            .leases
            .iter()
            .filter(|(_, l)| l.deadline <= now)
            .map(|(id, _)| *id)
            .collect();
        let changes: Vec<Change> = due
            .into_iter()
            .flat_map(|lease| state.end_lease(lease))
            .collect();
        drop(state);
        shared.publish(changes);
    }
}

/// The renewal of an in-memory lease.
pub struct MemoryKeepAlive {
    coord: MemoryCoordination,
    lease: i64,
}

impl KeepAlive for MemoryKeepAlive {
    async fn renew(&mut self) -> Result<bool, CoordError> {
        let mut state = self.coord.reach()?;
        Ok(match state.leases.get_mut(&self.lease) {
            Some(lease) => {
                lease.deadline = Instant::now() + lease.ttl;
                true
            }
            None => false,
        })
    }
}

impl Coordination for MemoryCoordination {
    type KeepAlive = MemoryKeepAlive;

    async fn grant(&self, ttl: Duration) -> Result<(i64, Duration), CoordError> {
        let mut state = self.reach()?;
        let id = state.next_lease;
        state.next_lease += 1;
        state.leases.insert(
            id,
            Lease {
                ttl,
                deadline: Instant::now() + ttl,
            },
        );
        Ok((id, ttl))
    }

    async fn keep_alive(&self, lease: i64) -> Result<MemoryKeepAlive, CoordError> {
        drop(self.reach()?);
        Ok(MemoryKeepAlive {
            coord: self.clone(),
            lease,
        })
    }

    async fn revoke(&self, lease: i64) -> Result<(), CoordError> {
        let mut state = self.reach()?;
        let changes = state.end_lease(lease);
        drop(state);
        self.shared.publish(changes);
        Ok(())
    }

    async fn put_member(&self, member: &str, lease: i64) -> Result<(), CoordError> {
        let mut state = self.reach()?;
        state.live(lease)?;
        state.members.insert(member.to_owned(), lease);
        state.revision += 1;
        drop(state);
        self.shared.publish(vec![Change::default()]);
        Ok(())
    }

    async fn members(&self) -> Result<Vec<String>, CoordError> {
        Ok(self.reach()?.members.keys().cloned().collect())
    }

    async fn owners(&self) -> Result<BTreeMap<u32, Ownership>, CoordError> {
        Ok(self.reach()?.owners.clone())
    }

    async fn try_acquire(
        &self,
        partition: u32,
        member: &str,
        lease: i64,
    ) -> Result<Option<i64>, CoordError> {
        let mut state = self.reach()?;
        if state.owners.contains_key(&partition) {
            return Ok(None);
        }
        state.live(lease)?;
        state.revision += 1;
        let revision = state.revision;
        state.owners.insert(
            partition,
            Ownership {
                owner: member.to_owned(),
                revision,
                lease,
            },
        );
        drop(state);
        self.shared.publish(vec![Change::default()]);
        Ok(Some(revision))
    }

    async fn release(
        &self,
        partition: u32,
        member: &str,
        revision: i64,
    ) -> Result<bool, CoordError> {
        let mut state = self.reach()?;
        let theirs = state
            .owners
            .get(&partition)
            .is_some_and(|o| o.owner == member && o.revision == revision);
        if !theirs {
            return Ok(false);
        }
        state.owners.remove(&partition);
        state.revision += 1;
        drop(state);
        self.shared.publish(vec![Change {
            released: vec![partition],
        }]);
        Ok(true)
    }

    async fn generation(&self) -> Result<String, CoordError> {
        Ok(self.reach()?.generation.clone())
    }

    async fn current_revision(&self) -> Result<i64, CoordError> {
        Ok(self.reach()?.revision)
    }

    async fn watch(&self) -> Result<Changes, CoordError> {
        drop(self.reach()?);
        let receiver = self.shared.changes.subscribe();
        let changes = futures::stream::unfold(
            Some((receiver, self.reachable.clone())),
            |state| async move {
                let (mut receiver, reachable) = state?;
                let next = receiver.recv().await;
                if !reachable.load(Ordering::SeqCst) {
                    return Some((Err(CoordError::Unreachable), None));
                }
                match next {
                    Ok(change) => Some((Ok(change), Some((receiver, reachable)))),
                    // Changes were missed: "look again" covers them.
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        Some((Ok(Change::default()), Some((receiver, reachable))))
                    }
                    Err(broadcast::error::RecvError::Closed) => None,
                }
            },
        );
        Ok(Box::pin(changes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;

    #[tokio::test(start_paused = true)]
    async fn a_lease_not_renewed_takes_its_keys_with_it() {
        let coord = MemoryCoordination::new();
        let (lease, _) = coord.grant(Duration::from_secs(2)).await.unwrap();
        coord.put_member("a", lease).await.unwrap();
        assert_eq!(coord.try_acquire(3, "a", lease).await.unwrap(), Some(3));
        let mut changes = coord.watch().await.unwrap();
        let mut keep = coord.keep_alive(lease).await.unwrap();
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert!(keep.renew().await.unwrap());
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert_eq!(
            coord.owners().await.unwrap().len(),
            1,
            "renewed: still held"
        );
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert!(coord.owners().await.unwrap().is_empty());
        assert!(coord.members().await.unwrap().is_empty());
        assert!(!keep.renew().await.unwrap(), "the lease is gone");
        let change = changes.next().await.unwrap().unwrap();
        assert_eq!(change.released, vec![3]);
    }

    #[tokio::test]
    async fn a_key_is_created_once_and_released_only_by_its_creator() {
        let coord = MemoryCoordination::new();
        let (a, _) = coord.grant(Duration::from_secs(10)).await.unwrap();
        let (b, _) = coord.grant(Duration::from_secs(10)).await.unwrap();
        let first = coord.try_acquire(0, "a", a).await.unwrap().unwrap();
        assert_eq!(coord.try_acquire(0, "b", b).await.unwrap(), None);
        assert!(!coord.release(0, "b", first).await.unwrap());
        assert!(!coord.release(0, "a", first - 1).await.unwrap());
        assert!(coord.release(0, "a", first).await.unwrap());
        let second = coord.try_acquire(0, "b", b).await.unwrap().unwrap();
        assert!(second > first, "create revisions grow");
        assert!(coord.current_revision().await.unwrap() >= second);
    }

    #[tokio::test]
    async fn a_handle_cut_off_fails_and_others_go_on() {
        let coord = MemoryCoordination::new();
        let other = coord.handle();
        let (lease, _) = coord.grant(Duration::from_secs(10)).await.unwrap();
        let mut keep = coord.keep_alive(lease).await.unwrap();
        coord.set_reachable(false);
        assert!(matches!(keep.renew().await, Err(CoordError::Unreachable)));
        assert!(matches!(
            coord.members().await,
            Err(CoordError::Unreachable)
        ));
        assert!(other.members().await.is_ok());
        coord.set_reachable(true);
        assert!(keep.renew().await.unwrap());
    }

    #[tokio::test]
    async fn losing_the_data_starts_a_new_generation_and_revisions_again() {
        let coord = MemoryCoordination::new();
        let before = coord.generation().await.unwrap();
        let (lease, _) = coord.grant(Duration::from_secs(10)).await.unwrap();
        for p in 0..5 {
            coord.try_acquire(p, "a", lease).await.unwrap();
        }
        let high = coord.current_revision().await.unwrap();
        coord.lose_data();
        assert_ne!(coord.generation().await.unwrap(), before);
        assert!(coord.current_revision().await.unwrap() < high);
        assert!(coord.owners().await.unwrap().is_empty());
        assert!(matches!(
            coord.try_acquire(0, "a", lease).await,
            Err(CoordError::LeaseLost)
        ));
    }
}
