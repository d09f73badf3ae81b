//! The store against a real PostgreSQL: schema, accept, the outbox life cycle, the worker's
//! statements. Each test gets its own database on the binary's server
//! (`herald_testkit::shared`); a test that needs a server of its own starts one.

mod accept;
mod outbox;
mod plans;
mod schema;
mod worker;

use herald_store::accept::{fingerprint, NewMessage};
use herald_testkit::TestDatabase;
use sqlx::PgPool;
use uuid::Uuid;

/// A fresh database with Herald's schema installed for `partitions`, on the binary's shared
/// server (cloned from a migrated template).
pub async fn migrated(partitions: u32) -> (TestDatabase, PgPool) {
    let db = TestDatabase::migrated(partitions)
        .await
        .expect("migrated database");
    let pool = db.pool(8).await.expect("connect");
    (db, pool)
}

/// A valid message for `partition`.
pub fn message(partition: u32, key: Option<&str>, text: &str) -> NewMessage {
    let body = serde_json::json!({ "text": text });
    NewMessage {
        id: Uuid::now_v7(),
        partition,
        recipient: "+15550100".to_owned(),
        fingerprint: fingerprint("+15550100", None, &body),
        body,
        idempotency_key: key.map(str::to_owned),
        created_by: None,
    }
}

pub async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.expect(sql)
}
