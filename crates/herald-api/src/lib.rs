//! Herald's HTTP API. `POST /v1/messages` (and its batch form) validates the request and
//! commits the message and its outbox row in one PostgreSQL transaction
//! before answering 202; nothing else is on that path (rule R1). `GET /v1/messages/{id}`
//! answers the derived state and the whole history. Every error is `application/problem+json`
//! naming the offending field; nothing is half-written. Who may call which route is decided in
//! [`auth`]: client and operator keys, and signed receipts from providers.

pub mod access;
pub mod auth;
pub mod config;
pub mod guard;
mod handlers;
pub mod metrics;
pub mod openapi;
pub mod operations;
pub mod problem;
pub mod validate;
mod views;

/// The wire types live in `herald-client`, shared with every caller of the API.
use herald_client::wire;

pub use config::ApiConfig;

use std::sync::Arc;

use axum::routing::{get, post};
use axum::Router;
use herald_core::PartitionCount;
use herald_store::accept::{accept_each, Accepted, KeyReused, NewMessage};
use herald_store::group::{GroupCommit, GroupSettings};
use herald_store::receipts::{accept_receipts, NewReceipt, RECEIPTS_PER_JOB};
use herald_store::wakeups::Wakeups;
use sqlx::PgPool;

/// Limits on what a client may send.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Largest request body accepted, in bytes (413 past it).
    pub max_body_bytes: usize,
    /// Most messages in one batch request.
    pub max_batch: usize,
    /// Refuse a message without an idempotency key: a retry after an unknown outcome (a lost
    /// connection during the commit) can then never store a message twice.
    pub require_idempotency_key: bool,
    /// Longest a request may go without an answer; then 503 (`outcome-unknown` for a write,
    /// which may still commit; `timeout` for a read).
    pub request_timeout: std::time::Duration,
    /// Requests per second per API key (None: unlimited).
    pub rate_limit: Option<guard::RateLimit>,
}

impl Default for Limits {
    /// The limits of `herald api`'s defaults.
    fn default() -> Self {
        config::ApiConfig::default()
            .limits()
            .expect("the default limits are valid")
    }
}

/// Everything the handlers share, behind one `Arc`: axum clones the state for every extractor
/// and middleware layer of every request, and a clone of this is one reference count instead
/// of one per field (its clone and drop were 2 to 3 % of the API's CPU on single accepts).
#[derive(Clone)]
pub struct ApiState(Arc<Shared>);

impl std::ops::Deref for ApiState {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}

/// What [`ApiState`] holds.
pub struct Shared {
    pub pool: PgPool,
    pub partitions: PartitionCount,
    pub limits: Limits,
    /// Bearer keys with their scopes, and each gateway's receipt secrets.
    pub credentials: Arc<auth::Credentials>,
    /// Wakes the pollers of the partitions an accept wrote, after its commit.
    pub wakeups: Wakeups,
    /// Single-message accepts, group-committed: concurrent requests share a transaction.
    pub messages: GroupCommit<NewMessage, Result<Accepted, KeyReused>>,
    /// Receipts, group-committed likewise: a request is one HTTP request's receipts (one for
    /// the single endpoint, an array's for the batch endpoint), answered with their ids.
    pub receipts: GroupCommit<Vec<NewReceipt>, Vec<i64>>,
    /// Each key's token bucket, when `limits.rate_limit` is set.
    pub rate_limiter: Option<Arc<guard::CallerLimiter>>,
}

/// Most receipts one receipt group commits (plus one request's): 256 batch requests of 100
/// receipts each would otherwise be one 25,600-row transaction.
pub const RECEIPT_GROUP_ROWS: usize = 2_000;

/// The settings of the API's two group writers.
#[derive(Debug, Clone, Copy)]
pub struct Groups {
    /// Single-message accepts.
    pub accepts: GroupSettings,
    /// Receipt requests, single and batch.
    pub receipts: GroupSettings,
}

impl Default for Groups {
    /// The groups of `herald api`'s defaults.
    fn default() -> Self {
        config::ApiConfig::default()
            .groups()
            .expect("the default groups are valid")
    }
}

/// Partitions written within this long of each other share one NOTIFY statement.
pub const WAKEUP_WINDOW: std::time::Duration = std::time::Duration::from_millis(5);

impl ApiState {
    /// The state with its background writers (wake-ups, group commits) started on `pool`.
    pub fn new(
        pool: PgPool,
        partitions: PartitionCount,
        limits: Limits,
        credentials: auth::Credentials,
        groups: Groups,
    ) -> Self {
        let messages_pool = pool.clone();
        let receipts_pool = pool.clone();
        let wakeups = Wakeups::spawn(pool.clone(), WAKEUP_WINDOW);
        let receipt_wakeups = wakeups.clone();
        Self(Arc::new(Shared {
            wakeups,
            messages: GroupCommit::spawn(
                "accept",
                groups.accepts,
                move |messages: Arc<Vec<NewMessage>>| {
                    let pool = messages_pool.clone();
                    async move { accept_each(&pool, &messages).await }
                },
            ),
            receipts: GroupCommit::spawn_weighed(
                "receipts",
                groups.receipts,
                // A batch request holds up to MAX_RECEIPT_BATCH receipts: bound the rows of one
                // transaction, not only its requests.
                (RECEIPT_GROUP_ROWS, |request: &Vec<NewReceipt>| {
                    request.len()
                }),
                move |requests: Arc<Vec<Vec<NewReceipt>>>| {
                    let pool = receipts_pool.clone();
                    let wakeups = receipt_wakeups.clone();
                    async move { accept_receipt_requests(&pool, &wakeups, &requests).await }
                },
            ),
            rate_limiter: limits
                .rate_limit
                .map(|limit| Arc::new(guard::CallerLimiter::new(limit))),
            pool,
            partitions,
            limits,
            credentials: Arc::new(credentials),
        }))
    }
}

/// Writes every request's receipts in one statement (all or nothing for the group, so for each
/// request), with one status job per [`RECEIPTS_PER_JOB`] receipts, wakes the partitions of
/// those jobs after the commit, and hands each request its ids, in order.
async fn accept_receipt_requests(
    pool: &PgPool,
    wakeups: &Wakeups,
    requests: &[Vec<NewReceipt>],
) -> Result<Vec<Vec<i64>>, herald_store::StoreError> {
    let all: Vec<&NewReceipt> = requests.iter().flatten().collect();
    let mut ids = accept_receipts(pool, &all).await?.into_iter();
    // A job goes to the partition of its first receipt (`accept_receipts`).
    wakeups.wake(all.chunks(RECEIPTS_PER_JOB).map(|job| job[0].partition));
    Ok(requests
        .iter()
        .map(|request| ids.by_ref().take(request.len()).collect())
        .collect())
}

/// The `/v1` routes, each behind its credential: client routes need a client or operator key,
/// operator routes an operator key, and receipt routes a signature by the gateway's secret
/// (checked over the body by their handlers). Client and operator keys are rate-limited per
/// key, every request has a timeout (`guard.rs`), and every request gets an id and an
/// access-log line (`access.rs`). The binary merges the health and metrics routes next to them.
pub fn router(state: ApiState) -> Router {
    let client = Router::new()
        .route("/v1/messages", post(handlers::accept_one))
        .route("/v1/messages/batch", post(handlers::accept_batch))
        .route("/v1/messages/{id}", get(handlers::get_message))
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            guard::rate_limit,
        ))
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            auth::require_client,
        ));
    let operator = Router::new()
        .route("/v1/partitions", get(handlers::list_partitions))
        .route("/v1/dead", get(operations::list_dead))
        .route("/v1/dead/{id}/redrive", post(operations::redrive_dead))
        .route("/v1/parking", get(operations::list_parked))
        .route("/v1/parking/{id}/replay", post(operations::replay_parked))
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            guard::rate_limit,
        ))
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            auth::require_operator,
        ));
    let provider = Router::new()
        .route(
            "/v1/providers/{gateway}/receipts",
            post(operations::accept_receipt),
        )
        .route(
            "/v1/providers/{gateway}/receipts/batch",
            post(operations::accept_receipt_batch),
        );
    Router::new()
        .route("/v1/openapi.json", get(openapi::serve))
        .merge(client)
        .merge(operator)
        .merge(provider)
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            guard::request_timeout,
        ))
        .layer(axum::middleware::from_fn(access::request_id_and_access_log))
        .with_state(state)
}
