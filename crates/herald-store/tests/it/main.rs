//! The store against a real PostgreSQL: schema, accept, the outbox life cycle, the worker's
//! statements. Each test gets its own database on the binary's server
//! (`herald_testkit::shared`); a test that needs a server of its own starts one.

mod accept;
mod outbox;
mod plans;
mod retention;
mod schema;
mod worker;

use herald_testkit::TestDatabase;
use sqlx::PgPool;

/// A fresh database with Herald's schema installed for `partitions`, on the binary's shared
/// server (cloned from a migrated template).
pub async fn migrated(partitions: u32) -> (TestDatabase, PgPool) {
    let db = TestDatabase::migrated(partitions)
        .await
        .expect("migrated database");
    let pool = db.pool(8).await.expect("connect");
    (db, pool)
}

pub use herald_testkit::shared::message;

pub async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.expect(sql)
}
