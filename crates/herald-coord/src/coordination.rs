//! What the poller fleet needs from a coordinator, as a trait: etcd ([`crate::Coordinator`])
//! in production, and [`crate::memory::MemoryCoordination`], the same protocol in memory, for
//! testing the fleet's assignment, handoff and fencing logic in milliseconds.
//!
//! The protocol both keep: leases with a TTL that a member renews; keys bound to a lease
//! vanish when it ends; an ownership key is created only if absent, and its create revision
//! (which only grows) orders acquisitions; a release deletes the key only if it is still the
//! one its owner created; a watch reports every change of a member or ownership key.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use futures::stream::BoxStream;

use crate::{CoordError, Ownership};

/// One watch message: something changed under the prefix ("look again"), and which
/// partitions' ownership keys were deleted by it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Change {
    pub released: Vec<u32>,
}

/// The changes of member and ownership keys, as they happen. It ends (or yields an error)
/// when the coordinator's connection broke; the caller watches again.
pub type Changes = BoxStream<'static, Result<Change, CoordError>>;

/// Renews one lease.
pub trait KeepAlive: Send + 'static {
    /// Renews the lease once. `Ok(true)`: renewed for its whole TTL; `Ok(false)`: the
    /// coordinator says the lease is gone (expired or revoked); an error: no answer.
    fn renew(&mut self) -> impl Future<Output = Result<bool, CoordError>> + Send;
}

/// A coordinator: membership, partition ownership keys and the watch over both.
pub trait Coordination: Clone + Send + Sync + 'static {
    type KeepAlive: KeepAlive;

    /// Grants a lease of `ttl` (whole seconds, at least the coordinator's minimum) and
    /// answers its id and the TTL granted.
    fn grant(
        &self,
        ttl: Duration,
    ) -> impl Future<Output = Result<(i64, Duration), CoordError>> + Send;

    /// Opens the renewal of `lease`.
    fn keep_alive(
        &self,
        lease: i64,
    ) -> impl Future<Output = Result<Self::KeepAlive, CoordError>> + Send;

    /// Ends `lease` now: every key on it is deleted.
    fn revoke(&self, lease: i64) -> impl Future<Output = Result<(), CoordError>> + Send;

    /// Registers `member` under `lease`.
    fn put_member(
        &self,
        member: &str,
        lease: i64,
    ) -> impl Future<Output = Result<(), CoordError>> + Send;

    /// The live members' ids, sorted.
    fn members(&self) -> impl Future<Output = Result<Vec<String>, CoordError>> + Send;

    /// Every partition that has an owner.
    fn owners(&self) -> impl Future<Output = Result<BTreeMap<u32, Ownership>, CoordError>> + Send;

    /// Creates the partition's ownership key for `member` on `lease` if nobody holds it.
    /// Answers the key's create revision, or `None` when another owner holds it.
    fn try_acquire(
        &self,
        partition: u32,
        member: &str,
        lease: i64,
    ) -> impl Future<Output = Result<Option<i64>, CoordError>> + Send;

    /// Deletes the partition's ownership key if it is still the one `member` created at
    /// `revision`. Answers whether it deleted it.
    fn release(
        &self,
        partition: u32,
        member: &str,
        revision: i64,
    ) -> impl Future<Output = Result<bool, CoordError>> + Send;

    /// The coordinator's generation: an id that changes only when it lost its data (its
    /// revisions then start again).
    fn generation(&self) -> impl Future<Output = Result<String, CoordError>> + Send;

    /// The current revision.
    fn current_revision(&self) -> impl Future<Output = Result<i64, CoordError>> + Send;

    /// Watches every member and ownership key.
    fn watch(&self) -> impl Future<Output = Result<Changes, CoordError>> + Send;
}
