//! Provider receipts in, and the operator's views: DEAD rows and parked input, each with its
//! way back (re-drive, replay).
//!
//! Longer than 400 lines: the receipt routes (single and batch, signed per gateway) and the
//! operator routes (DEAD and parking, each listed and sent back) are small handlers that share
//! this file's paging and problem answers; a new family of routes goes to a file of its own.

use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use herald_core::{partition_of, PartitionCount};
use herald_store::receipts::{NewReceipt, Replay};
use serde::Deserialize;

use crate::auth::{self, Caller};
use crate::metrics::{RECEIPTS, REJECTED};
use crate::problem::Problem;
use crate::{wire, ApiState};

/// Receipts of one message must stay in order, so they are routed by gateway and provider id
/// when the body reveals it, by gateway alone otherwise (the body is stored as it came).
pub fn receipt_partition(gateway: &str, raw: &[u8], partitions: PartitionCount) -> u32 {
    let id = herald_core::receipt::routing_id(raw).unwrap_or_default();
    partition_of(&format!("{gateway}:{id}"), partitions)
}

/// A gateway name: 1 to 64 letters, digits, '-' or '_'.
pub(crate) fn check_gateway(gateway: &str) -> Result<(), Problem> {
    let valid = !gateway.is_empty()
        && gateway.len() <= 64
        && gateway
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if valid {
        return Ok(());
    }
    Err(Problem::new(
        StatusCode::BAD_REQUEST,
        "invalid-gateway",
        "The gateway name is invalid",
        "a gateway name has 1 to 64 letters, digits, '-' or '_'",
    )
    .with_field("gateway"))
}

/// What both receipt endpoints check first: that the gateway has a secret, a body within the
/// limit, signed by one of the gateway's secrets (unless this is a development run without
/// receipt secrets), and not empty. Answers the body and its content type. A refused post has
/// written nothing.
async fn receipt_request(
    state: &ApiState,
    gateway: &str,
    headers: &HeaderMap,
    body: Body,
) -> Result<(axum::body::Bytes, Option<String>), Problem> {
    let secrets = auth::receipt_secrets(state, gateway)?;
    if secrets.is_none() {
        check_gateway(gateway)?;
    }
    let limit = state.limits.max_body_bytes;
    let raw = axum::body::to_bytes(body, limit)
        .await
        .map_err(|_| Problem::too_large(limit))?;
    if let Some(secrets) = secrets {
        auth::verify_receipt(state, gateway, secrets, headers, &raw)?;
    }
    if raw.is_empty() {
        return Err(Problem::invalid_field(
            "body",
            "a receipt body must not be empty",
        ));
    }
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    Ok((raw, content_type))
}

/// `POST /v1/providers/{gateway}/receipts`: stores the body byte for byte with a `status` job
/// and answers 202 only after the commit. Nothing is mapped or dropped here.
#[utoipa::path(
    post,
    path = "/v1/providers/{gateway}/receipts",
    tag = "providers",
    params(
        ("gateway" = String, Path, description = "The gateway's name, as configured with its receipt secret"),
        ("Herald-Signature" = String, Header, description = "t=<unix seconds>,v1=<hex HMAC-SHA256 of \"<t>.<body>\" with the gateway's secret>"),
    ),
    request_body(content = Object, description = "The provider's receipt, stored byte for byte (any content type)"),
    responses(
        (status = 202, description = "Stored with its status job, after the commit", body = crate::wire::ReceiptStored),
        (status = 400, description = "A bad gateway name", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 413, description = "The body is over the limit", body = crate::problem::Problem, content_type = "application/problem+json"),
        crate::openapi::ReceiptProblems,
    ),
    security(("receipt_signature" = []))
)]
pub(crate) async fn accept_receipt(
    State(state): State<ApiState>,
    Path(gateway): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let (raw, content_type) = match receipt_request(&state, &gateway, &headers, body).await {
        Ok(request) => request,
        Err(problem) => return reject(problem),
    };
    // Concurrent receipts share one transaction (group commit); each is answered after the
    // commit that holds it.
    match store_one(&state, gateway, &raw, content_type).await {
        Ok(id) => (
            StatusCode::ACCEPTED,
            Json(wire::ReceiptStored { receipt_id: id }),
        )
            .into_response(),
        Err(err) => {
            tracing::error!(error = %err, "storing a receipt failed");
            reject(Problem::write_failed(&err))
        }
    }
}

/// Stores one raw body as one receipt through the group committer (which wakes the poller of
/// its status job) and counts it; answers its id after the commit.
async fn store_one(
    state: &ApiState,
    gateway: String,
    raw: &[u8],
    content_type: Option<String>,
) -> Result<i64, herald_store::StoreError> {
    let partition = receipt_partition(&gateway, raw, state.partitions);
    let receipt = NewReceipt {
        gateway,
        raw: raw.to_vec(),
        content_type,
        partition,
    };
    let id = state
        .receipts
        .write(vec![receipt])
        .await?
        .first()
        .copied()
        // Committed, but without the receipt's id: it may be stored, so the gateway is told
        // the outcome is unknown (its retry is deduplicated by the status worker).
        .ok_or_else(|| {
            herald_store::StoreError::OutcomeUnknown("storing a receipt answered no id".into())
        })?;
    metrics::counter!(RECEIPTS).increment(1);
    Ok(id)
}

/// `POST /v1/providers/{gateway}/receipts/batch`: a JSON array of receipts, for gateways that
/// post many at once. Each element is stored byte for byte as its own receipt with its own
/// `status` job, all in one statement, and answered 202 with the receipt ids in order only
/// after the commit. A body that is not a JSON array cannot be split: it is stored whole as one
/// receipt (the status worker parks it with its raw bytes) and answered 400.
#[utoipa::path(
    post,
    path = "/v1/providers/{gateway}/receipts/batch",
    tag = "providers",
    params(
        ("gateway" = String, Path, description = "The gateway's name"),
        ("Herald-Signature" = String, Header, description = "As for a single receipt, over the whole body"),
    ),
    request_body(content = Vec<Object>, description = "A JSON array of receipts; each element is stored byte for byte as its own receipt"),
    responses(
        (status = 202, description = "Every receipt stored, ids in request order", body = crate::wire::ReceiptsStored),
        (status = 400, description = "Not a JSON array (kept whole, parked)", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 413, description = "The body is over the limit", body = crate::problem::Problem, content_type = "application/problem+json"),
        crate::openapi::ReceiptProblems,
    ),
    security(("receipt_signature" = []))
)]
pub(crate) async fn accept_receipt_batch(
    State(state): State<ApiState>,
    Path(gateway): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let (raw, content_type) = match receipt_request(&state, &gateway, &headers, body).await {
        Ok(request) => request,
        Err(problem) => return reject(problem),
    };
    let items: Vec<Box<serde_json::value::RawValue>> = match serde_json::from_slice(&raw) {
        Ok(items) => items,
        Err(err) => return unsplittable(&state, gateway, &raw, content_type, err).await,
    };
    if items.is_empty() || items.len() > state.limits.max_batch {
        return reject(Problem::invalid_field(
            "body",
            format!(
                "a receipt batch has 1 to {} receipts, got {}",
                state.limits.max_batch,
                items.len()
            ),
        ));
    }
    let receipts: Vec<NewReceipt> = items
        .iter()
        .map(|item| {
            let raw = item.get().as_bytes();
            NewReceipt {
                gateway: gateway.clone(),
                raw: raw.to_vec(),
                content_type: content_type.clone(),
                partition: receipt_partition(&gateway, raw, state.partitions),
            }
        })
        .collect();
    let count = receipts.len();
    // The batch's receipts share a transaction with concurrent receipt requests, all of the
    // batch in the same one.
    match state.receipts.write(receipts).await {
        Ok(ids) => {
            metrics::counter!(RECEIPTS).increment(ids.len() as u64);
            (
                StatusCode::ACCEPTED,
                Json(wire::ReceiptsStored { receipt_ids: ids }),
            )
                .into_response()
        }
        Err(err) => {
            tracing::error!(error = %err, %gateway, receipts = count, "storing a batch of receipts failed");
            reject(Problem::write_failed(&err))
        }
    }
}

/// A batch body that is not a JSON array: kept whole as one receipt, so the status worker
/// parks it with its raw bytes, and refused with 400 so the gateway sees its mistake.
async fn unsplittable(
    state: &ApiState,
    gateway: String,
    raw: &[u8],
    content_type: Option<String>,
    err: serde_json::Error,
) -> Response {
    match store_one(state, gateway.clone(), raw, content_type).await {
        Ok(id) => {
            tracing::warn!(%gateway, receipt_id = id, error = %err,
                "a receipt batch is not a JSON array; stored whole to be parked with its raw body");
            reject(Problem::new(
                StatusCode::BAD_REQUEST,
                "invalid-receipt-batch",
                "A receipt batch must be a JSON array of receipts",
                format!("{err}; the body was stored as receipt {id} and will be parked with its raw bytes"),
            )
            .with_field("body"))
        }
        Err(err) => {
            tracing::error!(error = %err, %gateway, "storing an unsplittable receipt batch failed");
            reject(Problem::write_failed(&err))
        }
    }
}

/// `?after=<id>&limit=<n>` of the list routes: a page of rows with ids above `after`.
#[derive(Deserialize)]
pub(crate) struct ListQuery {
    limit: Option<i64>,
    after: Option<i64>,
}

/// A page's size and where it starts, or the problem with the query string.
fn page(query: Result<Query<ListQuery>, QueryRejection>) -> Result<(i64, i64), Problem> {
    let Query(query) = query.map_err(|rejection| {
        Problem::new(
            StatusCode::BAD_REQUEST,
            "invalid-query",
            "The query string is not valid",
            format!("{}: `after` is the last id of the previous page and `limit` a page size of 1 to 1000, both whole numbers", rejection.body_text()),
        )
    })?;
    Ok((
        query.after.unwrap_or(0),
        query.limit.unwrap_or(100).clamp(1, 1000),
    ))
}

/// The link to the page after `rows` (one more row than the page was fetched, to know), or
/// null on the last page; `rows` is cut to the page.
fn next_page<T>(
    route: &str,
    rows: &mut Vec<T>,
    limit: i64,
    id: impl Fn(&T) -> i64,
) -> Option<String> {
    if rows.len() as i64 <= limit {
        return None;
    }
    rows.truncate(limit as usize);
    let last = rows.last().map(id).unwrap_or_default();
    Some(format!("{route}?after={last}&limit={limit}"))
}

/// `GET /v1/dead`: DEAD outbox rows, oldest first, a page at a time (`?after=&limit=`, `next`
/// links the following page), and how many there are.
#[utoipa::path(
    get,
    path = "/v1/dead",
    tag = "operators",
    params(
        ("after" = Option<i64>, Query, description = "Start after this id (0: from the first)"),
        ("limit" = Option<i64>, Query, description = "Rows per page, 1 to 1000 (default 100)"),
    ),
    responses(
        (status = 200, description = "A page of DEAD outbox rows, oldest first, and how many there are", body = crate::wire::DeadList),
        (status = 400, description = "A bad after or limit", body = crate::problem::Problem, content_type = "application/problem+json"),
        crate::openapi::OperatorProblems,
    ),
    security(("bearer" = []))
)]
pub(crate) async fn list_dead(
    State(state): State<ApiState>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Response {
    let (after, limit) = match page(query) {
        Ok(page) => page,
        Err(problem) => return reject(problem),
    };
    let rows = herald_store::outbox::list_dead(&state.pool, after, limit + 1).await;
    let count = herald_store::outbox::count_dead(&state.pool).await;
    match (rows, count) {
        (Ok(mut rows), Ok(count)) => {
            let next = next_page("/v1/dead", &mut rows, limit, |row| row.id);
            Json(wire::DeadList {
                count,
                dead: rows.into_iter().map(crate::views::dead_row).collect(),
                next,
            })
            .into_response()
        }
        (Err(err), _) | (_, Err(err)) => {
            tracing::error!(error = %err, "listing DEAD rows failed");
            reject(Problem::unavailable())
        }
    }
}

/// `POST /v1/dead/{id}/redrive`: the row goes back to PENDING with a fresh attempt budget.
#[utoipa::path(
    post,
    path = "/v1/dead/{id}/redrive",
    tag = "operators",
    params(("id" = i64, Path, description = "The DEAD outbox row's id")),
    responses(
        (status = 202, description = "The row is PENDING again with a fresh attempt budget", body = crate::wire::Redriven),
        (status = 400, description = "The id is not a number", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such DEAD row", body = crate::problem::Problem, content_type = "application/problem+json"),
        crate::openapi::OperatorProblems,
    ),
    security(("bearer" = []))
)]
pub(crate) async fn redrive_dead(
    State(state): State<ApiState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Response {
    let Ok(id) = id.parse::<i64>() else {
        return reject(invalid_id(&id));
    };
    match herald_store::outbox::redrive_dead(&state.pool, id).await {
        Ok(Some(partition)) => {
            tracing::warn!(
                outbox_id = id,
                partition,
                operator = caller.label(),
                "operator re-drove a DEAD row"
            );
            (
                StatusCode::ACCEPTED,
                Json(wire::Redriven {
                    id,
                    partition,
                    status: "PENDING".to_owned(),
                }),
            )
                .into_response()
        }
        Ok(None) => reject(Problem::new(
            StatusCode::NOT_FOUND,
            "not-found",
            "No such DEAD row",
            format!("no outbox row {id} is DEAD"),
        )),
        Err(err) => {
            tracing::error!(error = %err, "re-driving a DEAD row failed");
            reject(Problem::unavailable())
        }
    }
}

/// `GET /v1/parking`: parked input not replayed yet, with raw body and reason.
#[utoipa::path(
    get,
    path = "/v1/parking",
    tag = "operators",
    params(
        ("after" = Option<i64>, Query, description = "Start after this id (0: from the first)"),
        ("limit" = Option<i64>, Query, description = "Rows per page, 1 to 1000 (default 100)"),
    ),
    responses(
        (status = 200, description = "A page of parked input not replayed yet, with its raw body and reason", body = crate::wire::ParkedList),
        (status = 400, description = "A bad after or limit", body = crate::problem::Problem, content_type = "application/problem+json"),
        crate::openapi::OperatorProblems,
    ),
    security(("bearer" = []))
)]
pub(crate) async fn list_parked(
    State(state): State<ApiState>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Response {
    let (after, limit) = match page(query) {
        Ok(page) => page,
        Err(problem) => return reject(problem),
    };
    match herald_store::receipts::list_parked(&state.pool, after, limit + 1).await {
        Ok(mut rows) => {
            let next = next_page("/v1/parking", &mut rows, limit, |row| row.id);
            Json(wire::ParkedList {
                parked: rows.into_iter().map(crate::views::parked_item).collect(),
                next,
            })
            .into_response()
        }
        Err(err) => {
            tracing::error!(error = %err, "listing parked items failed");
            reject(Problem::unavailable())
        }
    }
}

/// `POST /v1/parking/{id}/replay`: queues the parked receipt again (after its mapping was
/// fixed); parked again, with a new reason, if it still cannot be applied.
#[utoipa::path(
    post,
    path = "/v1/parking/{id}/replay",
    tag = "operators",
    params(("id" = i64, Path, description = "The parked item's id")),
    responses(
        (status = 202, description = "Queued again (parked again, with a new reason, if it still cannot be applied)", body = crate::wire::ParkedReplayed),
        (status = 400, description = "The id is not a number", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such parked item", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 409, description = "Already replayed", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 422, description = "Not a replayable item: it holds no receipt", body = crate::problem::Problem, content_type = "application/problem+json"),
        crate::openapi::OperatorProblems,
    ),
    security(("bearer" = []))
)]
pub(crate) async fn replay_parked(
    State(state): State<ApiState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Response {
    let Ok(id) = id.parse::<i64>() else {
        return reject(invalid_id(&id));
    };
    let partitions = state.partitions;
    let replay = herald_store::receipts::replay_parked(&state.pool, id, |gateway, raw| {
        receipt_partition(gateway, raw, partitions)
    })
    .await;
    match replay {
        Ok(Replay::Queued { outbox_id }) => {
            tracing::warn!(
                parking_id = id,
                outbox_id,
                operator = caller.label(),
                "operator replayed a parked item"
            );
            (
                StatusCode::ACCEPTED,
                Json(wire::ParkedReplayed { id, outbox_id }),
            )
                .into_response()
        }
        Ok(Replay::NotFound) => reject(Problem::new(
            StatusCode::NOT_FOUND,
            "not-found",
            "No such parked item",
            format!("nothing is parked with id {id}"),
        )),
        Ok(Replay::AlreadyReplayed) => reject(Problem::new(
            StatusCode::CONFLICT,
            "already-replayed",
            "The item was replayed already",
            format!("parked item {id} was replayed; a new parking entry exists if it failed again"),
        )),
        Ok(Replay::NotReplayable) => reject(Problem::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "not-replayable",
            "The item cannot be replayed",
            format!("parked item {id} holds no receipt to replay"),
        )),
        Err(err) => {
            tracing::error!(error = %err, "replaying a parked item failed");
            reject(Problem::unavailable())
        }
    }
}

fn invalid_id(id: &str) -> Problem {
    Problem::new(
        StatusCode::BAD_REQUEST,
        "invalid-id",
        "The id is not valid",
        format!("{id:?} is not a number"),
    )
    .with_field("id")
}

fn reject(problem: Problem) -> Response {
    metrics::counter!(REJECTED, "reason" => problem.reason().to_owned()).increment(1);
    problem.into_response()
}
