//! Fencing epochs in PostgreSQL. The epoch of a partition is PostgreSQL's own counter and only
//! grows, whatever happens to the coordinator; every outbox write of the poller checks it (see
//! [`crate::outbox::Fence`]).

use sqlx::PgPool;

use crate::metrics::{measured, Operation};
use crate::outbox::Fence;
use crate::StoreError;

/// Where an ownership was taken in the coordinator: its generation (a new one after the
/// coordinator lost its data), the ownership key's create revision, and the coordinator's
/// current revision when it is recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Acquisition<'a> {
    pub generation: &'a str,
    pub revision: i64,
    pub current_revision: i64,
}

/// Records a new ownership of `partition` and answers its fencing epoch: the recorded epoch
/// plus one (PostgreSQL's own counter, which keeps growing whatever happens to the
/// coordinator). `None` when a newer ownership of the same generation is already recorded
/// (this acquisition was overtaken): the caller never writes. An ownership of another
/// generation, or one recorded at a revision above the coordinator's current one (its history
/// went back: a restore), is superseded.
pub async fn record_epoch(
    pool: &PgPool,
    partition: u32,
    owner: &str,
    taken: Acquisition<'_>,
) -> Result<Option<i64>, StoreError> {
    let epoch: Option<i64> = measured(
        Operation::TakeLease,
        sqlx::query_scalar(
            "INSERT INTO partition_leases (partition, owner, epoch, coord_generation,
                                           coord_revision)
             VALUES ($1, $2, 1, $3, $4)
             ON CONFLICT (partition) DO UPDATE
                 SET owner = EXCLUDED.owner, epoch = partition_leases.epoch + 1,
                     coord_generation = EXCLUDED.coord_generation,
                     coord_revision = EXCLUDED.coord_revision, acquired_at = now()
                 WHERE partition_leases.coord_generation IS DISTINCT FROM EXCLUDED.coord_generation
                    OR coalesce(partition_leases.coord_revision, partition_leases.epoch)
                           < EXCLUDED.coord_revision
                    OR coalesce(partition_leases.coord_revision, partition_leases.epoch) > $5
             RETURNING epoch",
        )
        .bind(partition as i32)
        .bind(owner)
        .bind(taken.generation)
        .bind(taken.revision)
        .bind(taken.current_revision)
        .fetch_optional(pool),
    )
    .await?;
    Ok(epoch)
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
