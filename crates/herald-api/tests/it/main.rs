//! The API over HTTP against a real PostgreSQL: accept, idempotency, history, every kind of
//! bad request, and who may call what (keys, scopes, signed receipts). Tests of anything but
//! credentials run the API as a development run without any.

mod accept;
mod access;
mod auth;
mod client;
mod errors;
mod guard;
mod lists;
mod openapi;
mod outcome;
mod receipts;

use herald_api::auth::Credentials;
use herald_api::{ApiState, Limits};
use herald_core::PartitionCount;
use herald_testkit::TestDatabase;
use reqwest::Response;
use serde_json::Value;
use sqlx::PgPool;

pub struct TestApi {
    pub base: String,
    pub pool: PgPool,
    pub client: reqwest::Client,
    _db: TestDatabase,
}

impl TestApi {
    pub async fn start(credentials: Credentials, limits: Limits) -> Self {
        let db = TestDatabase::migrated(8).await.expect("database");
        let pool = db.pool(8).await.expect("connect");
        let state = ApiState::new(
            pool.clone(),
            PartitionCount::new(8).unwrap(),
            limits,
            credentials,
            herald_api::Groups::default(),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            axum::serve(listener, herald_api::router(state))
                .await
                .unwrap();
        });
        Self {
            base,
            pool,
            client: reqwest::Client::new(),
            _db: db,
        }
    }

    /// A development run without credentials.
    pub async fn default() -> Self {
        Self::with_limits(Limits::default()).await
    }

    /// A development run without credentials, with `limits`.
    pub async fn with_limits(limits: Limits) -> Self {
        Self::start(Credentials::open_for_development(), limits).await
    }

    pub fn post(&self, path: &str) -> reqwest::RequestBuilder {
        self.client.post(format!("{}{path}", self.base))
    }

    pub fn get(&self, path: &str) -> reqwest::RequestBuilder {
        self.client.get(format!("{}{path}", self.base))
    }

    /// The JSON answer of a GET, whatever its status.
    pub async fn get_json(&self, path: &str) -> Value {
        self.get(path).send().await.unwrap().json().await.unwrap()
    }

    /// `count` DEAD send rows without messages, spread over the partitions; their ids.
    pub async fn dead_rows(&self, count: i32) -> Vec<i64> {
        sqlx::query_scalar(
            "INSERT INTO outbox (partition, job_type, status, last_error)
             SELECT n % 8, 'send', 'DEAD', 'out of attempts' FROM generate_series(1, $1) n
             RETURNING id",
        )
        .bind(count)
        .fetch_all(&self.pool)
        .await
        .unwrap()
    }

    /// Rows in messages, outbox and message_events (an accept writes no event: QUEUED is
    /// derived from the message row, so the third is 0 until a worker claims).
    pub async fn rows(&self) -> (i64, i64, i64) {
        sqlx::query_as(
            "SELECT (SELECT count(*) FROM messages), (SELECT count(*) FROM outbox),
                    (SELECT count(*) FROM message_events)",
        )
        .fetch_one(&self.pool)
        .await
        .unwrap()
    }
}

/// Asserts a problem+json answer with `status` naming `field`; returns the body.
pub async fn assert_problem(response: Response, status: u16, field: Option<&str>) -> Value {
    assert_eq!(response.status().as_u16(), status);
    let content_type = response
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_owned());
    assert_eq!(content_type.as_deref(), Some("application/problem+json"));
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["status"], status);
    assert!(body["type"]
        .as_str()
        .unwrap()
        .starts_with("urn:herald:problem:"));
    assert!(!body["detail"].as_str().unwrap().is_empty());
    assert_eq!(body["field"].as_str(), field, "{body}");
    body
}
