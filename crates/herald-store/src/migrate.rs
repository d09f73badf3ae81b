//! Installing and upgrading the schema. Runs only through `herald migrate` (and the Helm hook),
//! never implicitly when a role starts.

use std::time::Duration;

use herald_core::PartitionCount;
use sqlx::migrate::{MigrateError, Migration, Migrator};
use sqlx::PgPool;

use crate::StoreError;

static MIGRATOR: Migrator = sqlx::migrate!("../../migrations");

/// A lock id only `herald migrate` takes, so concurrent runs (two Helm hooks) serialise.
const MIGRATE_LOCK: i64 = 0x6865_7261_6c64;

/// How a migration waits for the table locks a schema change needs on a live database.
///
/// A statement such as `ALTER TABLE messages ADD COLUMN` needs an exclusive lock, and while it
/// waits for one (behind a long transaction) every accept that touches the table queues behind
/// it: intake stops. With a lock timeout the statement gives up instead, its migration is
/// rolled back whole, accepts go on, and the migration is tried again after a pause.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LockPolicy {
    /// Longest one statement waits for a lock; also the longest it holds accepts up.
    pub lock_timeout: Duration,
    /// How many times a migration that ran out of lock time is tried before `migrate` fails.
    pub attempts: u32,
}

impl Default for LockPolicy {
    fn default() -> Self {
        Self {
            lock_timeout: Duration::from_secs(2),
            attempts: 30,
        }
    }
}

/// PostgreSQL's `lock_not_available`: `lock_timeout` ran out.
const LOCK_NOT_AVAILABLE: &str = "55P03";

/// Applies every migration, records the partition count on first install (refusing a
/// different count later) and creates any missing outbox partitions, with the default
/// [`LockPolicy`].
pub async fn migrate(pool: &PgPool, partitions: PartitionCount) -> Result<(), StoreError> {
    migrate_with_locks(pool, partitions, LockPolicy::default()).await
}

/// [`migrate`], where each statement waits at most `policy.lock_timeout` for a lock; a
/// migration that ran out is rolled back and tried again, up to `policy.attempts` times, with
/// a pause that lets the accepts queued behind it through.
pub async fn migrate_with_locks(
    pool: &PgPool,
    partitions: PartitionCount,
    policy: LockPolicy,
) -> Result<(), StoreError> {
    migrate_with(pool, &MIGRATOR, partitions, policy).await
}

/// The migrations this build applies, in order (tests apply a prefix of them to stand for an
/// older release's schema).
pub fn migrations() -> &'static [Migration] {
    &MIGRATOR.migrations
}

/// Applies only the migrations up to and including `version`, as an older release would have
/// left the schema. For upgrade tests; `herald migrate` always applies them all.
pub async fn migrate_up_to(
    pool: &PgPool,
    version: i64,
    partitions: PartitionCount,
) -> Result<(), StoreError> {
    let prefix = Migrator {
        migrations: MIGRATOR
            .migrations
            .iter()
            .filter(|m| m.version <= version)
            .cloned()
            .collect::<Vec<_>>()
            .into(),
        ignore_missing: MIGRATOR.ignore_missing,
        locking: MIGRATOR.locking,
        no_tx: MIGRATOR.no_tx,
    };
    migrate_with(pool, &prefix, partitions, LockPolicy::default()).await
}

async fn migrate_with(
    pool: &PgPool,
    migrator: &Migrator,
    partitions: PartitionCount,
    policy: LockPolicy,
) -> Result<(), StoreError> {
    let mut conn = pool.acquire().await?;
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(MIGRATE_LOCK)
        .execute(&mut *conn)
        .await?;
    // A session setting: every migration's transaction and the partition step below run
    // under it. Reset before the connection goes back to the pool.
    sqlx::query(&format!(
        "SET lock_timeout = '{}ms'",
        policy.lock_timeout.as_millis().max(1)
    ))
    .execute(&mut *conn)
    .await?;
    let mut attempt = 1;
    let result = loop {
        match migrate_locked(&mut conn, migrator, partitions).await {
            Err(err) if is_lock_timeout(&err) && attempt < policy.attempts.max(1) => {
                let pause = policy.lock_timeout.min(Duration::from_secs(5)) * attempt.min(5);
                tracing::warn!(
                    attempt,
                    of = policy.attempts,
                    lock_timeout = ?policy.lock_timeout,
                    ?pause,
                    "a migration waited its whole lock timeout (a long transaction holds a \
                     table it changes); rolled back so accepts go on, trying again"
                );
                attempt += 1;
                tokio::time::sleep(pause).await;
            }
            other => break other,
        }
    };
    sqlx::query("RESET lock_timeout")
        .execute(&mut *conn)
        .await?;
    sqlx::query("SELECT pg_advisory_unlock($1)")
        .bind(MIGRATE_LOCK)
        .execute(&mut *conn)
        .await?;
    result
}

/// Whether `err` is a statement that ran out of `lock_timeout`, in a migration or after.
pub fn is_lock_timeout(err: &StoreError) -> bool {
    let db = match err {
        StoreError::Migrate(MigrateError::Execute(sqlx::Error::Database(db))) => db,
        StoreError::Migrate(MigrateError::ExecuteMigration(sqlx::Error::Database(db), _)) => db,
        StoreError::Database(sqlx::Error::Database(db)) => db,
        _ => return false,
    };
    db.code().as_deref() == Some(LOCK_NOT_AVAILABLE)
}

async fn migrate_locked(
    conn: &mut sqlx::PgConnection,
    migrator: &Migrator,
    partitions: PartitionCount,
) -> Result<(), StoreError> {
    // `run_direct`: `run` over a `&mut PgConnection` is not `Send` for every lifetime, so a
    // migration could not be awaited in a spawned task.
    migrator.run_direct(&mut *conn).await?;
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
