//! Fencing epochs in PostgreSQL. The epoch of a partition only grows; every outbox write of
//! the poller checks it (see [`crate::outbox::Fence`]).

use sqlx::PgPool;

use crate::metrics::{measured, Operation};
use crate::outbox::Fence;
use crate::StoreError;

/// Records `epoch` as the partition's current one if it is newer than the recorded one.
/// Returns false when a newer owner already recorded a higher epoch: the caller is deposed.
pub async fn record_epoch(
    pool: &PgPool,
    partition: u32,
    owner: &str,
    epoch: i64,
) -> Result<bool, StoreError> {
    let done = measured(
        Operation::TakeLease,
        sqlx::query(
            "INSERT INTO partition_leases (partition, owner, epoch) VALUES ($1, $2, $3)
             ON CONFLICT (partition) DO UPDATE
                 SET owner = EXCLUDED.owner, epoch = EXCLUDED.epoch, acquired_at = now()
                 WHERE partition_leases.epoch < EXCLUDED.epoch",
        )
        .bind(partition as i32)
        .bind(owner)
        .bind(epoch)
        .execute(pool),
    )
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Takes a partition with the next epoch, deposing whoever held it. For a single poller that
/// owns every partition without a coordinator; the etcd fleet uses [`record_epoch`].
pub async fn take_over(pool: &PgPool, partition: u32, owner: &str) -> Result<Fence, StoreError> {
    let epoch: i64 = measured(
        Operation::TakeLease,
        sqlx::query_scalar(
            "INSERT INTO partition_leases (partition, owner, epoch) VALUES ($1, $2, 1)
             ON CONFLICT (partition) DO UPDATE
                 SET owner = EXCLUDED.owner, epoch = partition_leases.epoch + 1,
                     acquired_at = now()
             RETURNING epoch",
        )
        .bind(partition as i32)
        .bind(owner)
        .fetch_one(pool),
    )
    .await?;
    Ok(Fence { partition, epoch })
}
