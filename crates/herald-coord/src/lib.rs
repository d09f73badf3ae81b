//! Herald's coordination through etcd. Each poller keeps a member key under its own lease;
//! a partition's ownership key is created in a transaction only if it is absent and is bound to
//! the owner's lease, so it vanishes when the owner stops renewing. The key's create revision
//! orders acquisitions (within one generation of etcd, revisions only grow); the poller records
//! it, with the generation, in PostgreSQL before it claims, and PostgreSQL answers the fencing
//! epoch (see `herald_store::leases`).
//!
//! Keys, under a configurable prefix (default `/herald`):
//! - `{prefix}/members/{poller id}` = poller id, on the member's lease;
//! - `{prefix}/owners/{partition:04}` = owner's poller id, on the owner's lease;
//! - `{prefix}/generation` = a random id written once by the first poller that finds it absent:
//!   it changes only when etcd lost its data, and tells revisions of two lives of etcd apart.

pub mod coordination;
pub mod etcd;
pub mod membership;
pub mod memory;

pub use coordination::{Change, Changes, Coordination, KeepAlive};
pub use etcd::{check_endpoints, Coordinator, EtcdAccess, EtcdKeepAlive};
pub use membership::{LeaseHealth, Membership};
pub use memory::MemoryCoordination;

#[derive(Debug, thiserror::Error)]
pub enum CoordError {
    #[error("etcd: {0}")]
    Etcd(#[from] etcd_client::Error),
    #[error("etcd holds an unreadable key {key:?}: {reason}")]
    BadKey { key: String, reason: String },
    #[error("the lease was lost")]
    LeaseLost,
    #[error("the coordinator ended the stream")]
    Closed,
    #[error("the coordinator cannot be reached")]
    Unreachable,
    #[error("etcd configuration: {0}")]
    Config(String),
}

/// Who owns a partition, and since which revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ownership {
    pub owner: String,
    /// The ownership key's create revision (PostgreSQL assigns the fencing epoch).
    pub revision: i64,
    pub lease: i64,
}
