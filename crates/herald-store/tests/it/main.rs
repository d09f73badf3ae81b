//! The store against a real PostgreSQL: schema, accept, the outbox life cycle, the worker's
//! statements. Each test starts its own server.

mod accept;
mod outbox;
mod plans;
mod schema;
mod worker;

use herald_core::PartitionCount;
use herald_store::accept::{fingerprint, NewMessage};
use herald_testkit::LocalPostgres;
use sqlx::PgPool;
use uuid::Uuid;

/// A fresh server with Herald's schema installed for `partitions`.
pub async fn migrated(partitions: u32) -> (LocalPostgres, PgPool) {
    let pg = LocalPostgres::start().await.expect("start postgres");
    let url = pg.create_database("herald").await.expect("create database");
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(8)
        .connect(&url)
        .await
        .expect("connect");
    herald_store::migrate::migrate(&pool, PartitionCount::new(partitions).unwrap())
        .await
        .expect("migrate");
    (pg, pool)
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
