//! What the worker's test binaries share: a real PostgreSQL with Herald's schema.

use herald_core::PartitionCount;
use herald_testkit::LocalPostgres;
use sqlx::PgPool;

/// A PostgreSQL server of its own (stopped when the first value is dropped) with a database
/// migrated to Herald's schema with `partitions` outbox partitions.
pub async fn migrated(partitions: u32) -> (LocalPostgres, PgPool) {
    let pg = LocalPostgres::start().await.unwrap();
    let url = pg.create_database("herald").await.unwrap();
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(8)
        .connect(&url)
        .await
        .unwrap();
    herald_store::migrate::migrate(&pool, PartitionCount::new(partitions).unwrap())
        .await
        .unwrap();
    (pg, pool)
}

/// The single number `sql` answers.
pub async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}
