//! Installing and upgrading the schema. Runs only through `herald migrate` (and the Helm hook),
//! never implicitly when a role starts.

use herald_core::PartitionCount;
use sqlx::PgPool;

use crate::StoreError;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations");

/// A lock id only `herald migrate` takes, so concurrent runs (two Helm hooks) serialise.
const MIGRATE_LOCK: i64 = 0x6865_7261_6c64;

/// Applies every migration, records the partition count on first install (refusing a
/// different count later) and creates any missing outbox partitions.
pub async fn migrate(pool: &PgPool, partitions: PartitionCount) -> Result<(), StoreError> {
    let mut conn = pool.acquire().await?;
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(MIGRATE_LOCK)
        .execute(&mut *conn)
        .await?;
    let result = migrate_locked(&mut conn, partitions).await;
    sqlx::query("SELECT pg_advisory_unlock($1)")
        .bind(MIGRATE_LOCK)
        .execute(&mut *conn)
        .await?;
    result
}

async fn migrate_locked(
    conn: &mut sqlx::PgConnection,
    partitions: PartitionCount,
) -> Result<(), StoreError> {
    MIGRATOR.run(&mut *conn).await?;
    let mut tx = sqlx::Connection::begin(&mut *conn).await?;
    let recorded: Option<String> =
        sqlx::query_scalar("SELECT value FROM herald_settings WHERE name = 'partitions'")
            .fetch_optional(&mut *tx)
            .await?;
    match recorded {
        Some(value) => {
            let recorded = parse_count(&value)?;
            if recorded != partitions.get() {
                return Err(StoreError::PartitionCountMismatch {
                    recorded,
                    requested: partitions.get(),
                });
            }
        }
        None => {
            sqlx::query("INSERT INTO herald_settings (name, value) VALUES ('partitions', $1)")
                .bind(partitions.get().to_string())
                .execute(&mut *tx)
                .await?;
        }
    }
    sqlx::query("SELECT herald_create_outbox_partitions($1)")
        .bind(partitions.get() as i32)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(())
}

/// The partition count recorded at install. Every role reads it at start.
pub async fn partition_count(pool: &PgPool) -> Result<PartitionCount, StoreError> {
    let recorded: Option<String> =
        sqlx::query_scalar("SELECT value FROM herald_settings WHERE name = 'partitions'")
            .fetch_optional(pool)
            .await
            .map_err(|err| match &err {
                // undefined_table: the schema was never installed.
                sqlx::Error::Database(db) if db.code().as_deref() == Some("42P01") => {
                    StoreError::NotMigrated
                }
                _ => StoreError::Database(err),
            })?;
    let value = recorded.ok_or(StoreError::NotMigrated)?;
    PartitionCount::new(parse_count(&value)?).map_err(|err| StoreError::Corrupt(err.to_string()))
}

fn parse_count(value: &str) -> Result<u32, StoreError> {
    value
        .parse()
        .map_err(|_| StoreError::Corrupt(format!("herald_settings.partitions = {value:?}")))
}
