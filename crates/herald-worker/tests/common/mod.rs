//! What the worker's test binaries share: a real PostgreSQL with Herald's schema.

use herald_testkit::TestDatabase;
use sqlx::PgPool;

/// A database of its own on the binary's shared PostgreSQL server, migrated to Herald's
/// schema with `partitions` outbox partitions.
pub async fn migrated(partitions: u32) -> (TestDatabase, PgPool) {
    let db = TestDatabase::migrated(partitions).await.unwrap();
    let pool = db.pool(8).await.unwrap();
    (db, pool)
}

/// The single number `sql` answers.
pub async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}
