//! Which partitions this poller may write, and with which fencing epochs. The etcd fleet
//! plugs in behind the same trait.

use herald_core::{Fence, PartitionCount};
use sqlx::PgPool;

/// A source of partition ownership.
#[allow(async_fn_in_trait)]
pub trait Ownership {
    /// Acquires partitions and records their epochs in PostgreSQL; returns the fences.
    async fn acquire(&self) -> Result<Vec<Fence>, crate::PollerError>;
}

/// One poller owns every partition, taking each with the next epoch (deposing any earlier
/// holder's writes). For a single poller without a coordinator.
pub struct StaticOwnership {
    pub pool: PgPool,
    pub owner: String,
    pub partitions: PartitionCount,
}

impl Ownership for StaticOwnership {
    async fn acquire(&self) -> Result<Vec<Fence>, crate::PollerError> {
        let mut fences = Vec::with_capacity(self.partitions.get() as usize);
        for partition in self.partitions.all() {
            fences.push(herald_store::leases::take_over(&self.pool, partition, &self.owner).await?);
        }
        Ok(fences)
    }
}
