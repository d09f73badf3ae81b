//! The `/v1` handlers.
//!
//! Longer than 400 lines: the single and the batch accept share their idempotency, commit and
//! answer helpers, which are kept beside both.

use std::collections::HashSet;
use std::time::Instant;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use herald_store::accept::{accept_messages, AcceptError, Accepted, KeyReused, NewMessage};
use herald_store::messages::message_with_history;
use uuid::Uuid;

use crate::auth::Caller;
use crate::metrics::{ACCEPTED, REJECTED, REPLAYED, REQUEST_DURATION};
use crate::problem::Problem;
use crate::validate;
use crate::wire::{AcceptedMessage, BatchRequest, BatchResponse, SendRequest};
use crate::ApiState;

#[utoipa::path(
    post,
    path = "/v1/messages",
    tag = "messages",
    request_body = crate::wire::SendRequest,
    params(
        ("Idempotency-Key" = Option<String>, Header, description = "Makes a retry answer the stored message instead of storing a second one (1 to 255 visible characters)"),
    ),
    responses(
        (status = 202, description = "Committed with its outbox row; a replay of the same key and request answers the first message, with `Idempotent-Replayed: true` and `created: false`", body = crate::wire::AcceptedMessage),
        (status = 400, description = "Malformed JSON, or a bad Idempotency-Key header", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 409, description = "The Idempotency-Key was used for another request", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 413, description = "The body is over the limit", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 415, description = "Not application/json", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 422, description = "A field is missing or invalid (the problem names it)", body = crate::problem::Problem, content_type = "application/problem+json"),
        crate::openapi::ClientProblems,
    ),
    security(("bearer" = []))
)]
pub(crate) async fn accept_one(
    State(state): State<ApiState>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let started = Instant::now();
    let response = match accept_one_inner(&state, &caller, &headers, body).await {
        Ok(response) => response,
        Err(problem) => reject(problem),
    };
    metrics::histogram!(REQUEST_DURATION, "route" => "accept")
        .record(started.elapsed().as_secs_f64());
    response
}

async fn accept_one_inner(
    state: &ApiState,
    caller: &Caller,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, Problem> {
    let key = idempotency_header(headers)?;
    if key.is_none() && state.limits.require_idempotency_key {
        return Err(Problem::new(
            StatusCode::BAD_REQUEST,
            "missing-idempotency-key",
            "An Idempotency-Key header is required",
            "this API requires an Idempotency-Key on every message, so a retry can never store it twice",
        )
        .with_field("Idempotency-Key"));
    }
    let request: SendRequest = validate::parse(&read_json(state, headers, body).await?)?;
    let mut message = validate::send_request(request, key, state.partitions)?;
    message.created_by = caller.name.as_deref().map(str::to_owned);
    let first = commit_one(state, message).await?;
    let location = format!("/v1/messages/{}", first.id);
    // A replay answers what the first request was answered (202, the same id), and says it is
    // a replay in a header and in `created`.
    let mut response = (
        StatusCode::ACCEPTED,
        [(header::LOCATION, location)],
        Json(wire_message(&first)),
    )
        .into_response();
    if !first.created {
        mark_replayed(&mut response);
    }
    Ok(response)
}

/// The header that tells a client its request was a replay of one already accepted.
pub const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";

fn mark_replayed(response: &mut Response) {
    response.headers_mut().insert(
        header::HeaderName::from_static(IDEMPOTENT_REPLAYED),
        header::HeaderValue::from_static("true"),
    );
}

#[utoipa::path(
    post,
    path = "/v1/messages/batch",
    tag = "messages",
    request_body = crate::wire::BatchRequest,
    responses(
        (status = 202, description = "Every message committed in one transaction (all or nothing), answered in request order", body = crate::wire::BatchResponse),
        (status = 400, description = "Malformed JSON", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 409, description = "An idempotency_key was used for another request", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 413, description = "The body is over the limit", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 415, description = "Not application/json", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 422, description = "An item's field is missing or invalid (the problem names it, e.g. messages[3].recipient)", body = crate::problem::Problem, content_type = "application/problem+json"),
        crate::openapi::ClientProblems,
    ),
    security(("bearer" = []))
)]
pub(crate) async fn accept_batch(
    State(state): State<ApiState>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let started = Instant::now();
    let response = match accept_batch_inner(&state, &caller, &headers, body).await {
        Ok(response) => response,
        Err(problem) => reject(problem),
    };
    metrics::histogram!(REQUEST_DURATION, "route" => "accept_batch")
        .record(started.elapsed().as_secs_f64());
    response
}

async fn accept_batch_inner(
    state: &ApiState,
    caller: &Caller,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, Problem> {
    if headers.contains_key("idempotency-key") {
        return Err(Problem::new(
            StatusCode::BAD_REQUEST,
            "invalid-header",
            "A header is not allowed here",
            "a batch carries one `idempotency_key` per message, not an Idempotency-Key header",
        )
        .with_field("Idempotency-Key"));
    }
    let request: BatchRequest = validate::parse(&read_json(state, headers, body).await?)?;
    let items = request.messages;
    if items.is_empty() || items.len() > state.limits.max_batch {
        return Err(Problem::invalid_field(
            "messages",
            format!(
                "a batch has 1 to {} messages, got {}",
                state.limits.max_batch,
                items.len()
            ),
        ));
    }
    let mut messages = Vec::with_capacity(items.len());
    let mut keys = HashSet::new();
    for (index, item) in items.into_iter().enumerate() {
        let mut message = validate::batch_item(item, index, state.partitions)?;
        message.created_by = caller.name.as_deref().map(str::to_owned);
        let key_field = || validate::At::Item(index).field("idempotency_key");
        if message.idempotency_key.is_none() && state.limits.require_idempotency_key {
            let field = key_field();
            return Err(Problem::invalid_field(
                &field,
                format!("`{field}` is required: this API requires a key on every message, so a retry can never store it twice"),
            ));
        }
        if let Some(key) = &message.idempotency_key {
            if !keys.insert(key.clone()) {
                return Err(Problem::invalid_field(
                    key_field(),
                    format!("idempotency key {key:?} appears twice in the batch"),
                ));
            }
        }
        messages.push(message);
    }
    let accepted = commit_batch(state, &messages).await?;
    let replayed = !accepted.is_empty() && accepted.iter().all(|a| !a.created);
    let answer = BatchResponse {
        messages: accepted.iter().map(wire_message).collect(),
    };
    // Always the first answer's status; a batch whose every message was a replay says so in the
    // header, and each message in `created`.
    let mut response = (StatusCode::ACCEPTED, Json(answer)).into_response();
    if replayed {
        mark_replayed(&mut response);
    }
    Ok(response)
}

/// A message and its history. A client key reads only the messages it accepted; another's
/// message is answered like one that does not exist.
#[utoipa::path(
    get,
    path = "/v1/messages/{id}",
    tag = "messages",
    params(("id" = String, Path, description = "The message's id (a UUID)")),
    responses(
        (status = 200, description = "The message, its current state and its whole history", body = crate::wire::MessageHistory),
        (status = 400, description = "The id is not a UUID", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such message (or one another client key accepted)", body = crate::problem::Problem, content_type = "application/problem+json"),
        crate::openapi::ClientProblems,
    ),
    security(("bearer" = []))
)]
pub(crate) async fn get_message(
    State(state): State<ApiState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Response {
    let Ok(id) = Uuid::parse_str(&id) else {
        return reject(
            Problem::new(
                StatusCode::BAD_REQUEST,
                "invalid-id",
                "The message id is not valid",
                format!("{id:?} is not a UUID"),
            )
            .with_field("id"),
        );
    };
    match message_with_history(&state.pool, id).await {
        Ok(Some(view)) if caller.may_read(view.created_by.as_deref()) => {
            Json(crate::views::message_history(view)).into_response()
        }
        Ok(_) => reject(Problem::new(
            StatusCode::NOT_FOUND,
            "not-found",
            "No such message",
            format!("no message has id {id}"),
        )),
        Err(err) => {
            tracing::error!(error = %err, %id, "reading a message failed");
            reject(Problem::unavailable())
        }
    }
}

/// Every partition's recorded owner, epoch, backlog and oldest pending age.
#[utoipa::path(
    get,
    path = "/v1/partitions",
    tag = "operators",
    responses(
        (status = 200, description = "Every partition's recorded owner, fencing epoch and backlog", body = crate::wire::PartitionList),
        crate::openapi::OperatorProblems,
    ),
    security(("bearer" = []))
)]
pub(crate) async fn list_partitions(State(state): State<ApiState>) -> Response {
    match herald_store::outbox::partitions_overview(&state.pool, state.partitions.get()).await {
        Ok(partitions) => Json(crate::wire::PartitionList {
            partitions: partitions
                .into_iter()
                .map(crate::views::partition_info)
                .collect(),
        })
        .into_response(),
        Err(err) => {
            tracing::error!(error = %err, "reading partitions failed");
            reject(Problem::unavailable())
        }
    }
}

/// Commits one message, sharing the transaction with concurrent single accepts (group
/// commit); answers after the commit that holds it. A reused key fails this request alone.
async fn commit_one(state: &ApiState, message: NewMessage) -> Result<Accepted, Problem> {
    let partition = message.partition;
    match state.messages.write(message).await {
        Ok(Ok(accepted)) => {
            committed(
                state,
                std::iter::once(partition),
                std::slice::from_ref(&accepted),
            );
            Ok(accepted)
        }
        Ok(Err(KeyReused { key })) => Err(key_conflict(&key, "Idempotency-Key".to_owned())),
        Err(err) => {
            tracing::error!(error = %err, "accept transaction failed");
            Err(Problem::write_failed(&err))
        }
    }
}

/// Commits a batch request's `messages` in one transaction of their own: all or nothing.
#[tracing::instrument(skip_all, fields(messages = messages.len()))]
async fn commit_batch(state: &ApiState, messages: &[NewMessage]) -> Result<Vec<Accepted>, Problem> {
    match accept_messages(&state.pool, messages).await {
        Ok(accepted) => {
            committed(state, messages.iter().map(|m| m.partition), &accepted);
            Ok(accepted)
        }
        Err(AcceptError::KeyConflict { index, key }) => Err(key_conflict(
            &key,
            format!("messages[{index}].idempotency_key"),
        )),
        Err(AcceptError::Store(err)) => {
            tracing::error!(error = %err, count = messages.len(), "accept transaction failed");
            Err(Problem::write_failed(&err))
        }
    }
}

/// After a commit: wakes the partitions of new messages and counts. Each accepted message gets
/// a debug event carrying its id, the same `message_id` field the worker's span for its send
/// carries.
fn committed(state: &ApiState, partitions: impl Iterator<Item = u32>, accepted: &[Accepted]) {
    state.wakeups.wake(
        partitions
            .zip(accepted)
            .filter(|(_, a)| a.created)
            .map(|(p, _)| p),
    );
    let created = accepted.iter().filter(|a| a.created).count() as u64;
    metrics::counter!(ACCEPTED).increment(created);
    metrics::counter!(REPLAYED).increment(accepted.len() as u64 - created);
    for message in accepted {
        tracing::debug!(message_id = %message.id, created = message.created, "accepted");
    }
}

fn key_conflict(key: &str, field: String) -> Problem {
    Problem::new(
        StatusCode::CONFLICT,
        "idempotency-key-conflict",
        "The Idempotency-Key was used for a different request",
        format!("key {key:?} was already used with a different recipient, body or partition key, or by another API key; nothing was written"),
    )
    .with_field(field)
}

fn idempotency_header(headers: &HeaderMap) -> Result<Option<String>, Problem> {
    let Some(value) = headers.get("idempotency-key") else {
        return Ok(None);
    };
    let invalid = |detail: String| {
        Problem::new(
            StatusCode::BAD_REQUEST,
            "invalid-header",
            "A header is invalid",
            detail,
        )
        .with_field("Idempotency-Key")
    };
    let key = value
        .to_str()
        .map_err(|_| invalid("Idempotency-Key must be visible ASCII".to_owned()))?;
    validate::check_key(key).map_err(invalid)?;
    Ok(Some(key.to_owned()))
}

/// The body's bytes, once its Content-Type says JSON and it fits `--max-body-bytes`.
async fn read_json(
    state: &ApiState,
    headers: &HeaderMap,
    body: Body,
) -> Result<axum::body::Bytes, Problem> {
    if let Some(content_type) = headers.get(header::CONTENT_TYPE) {
        let content_type = content_type
            .to_str()
            .unwrap_or_default()
            .to_ascii_lowercase();
        let essence = content_type.split(';').next().unwrap_or_default().trim();
        if essence != "application/json" && !essence.ends_with("+json") {
            return Err(Problem::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported-media-type",
                "The body must be JSON",
                format!("Content-Type is {essence:?}; send application/json"),
            )
            .with_field("Content-Type"));
        }
    }
    let limit = state.limits.max_body_bytes;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|length| length > limit) {
        return Err(Problem::too_large(limit));
    }
    axum::body::to_bytes(body, limit)
        .await
        .map_err(|_| Problem::too_large(limit))
}

fn wire_message(accepted: &Accepted) -> AcceptedMessage {
    AcceptedMessage {
        id: accepted.id,
        state: accepted.state.as_str().to_owned(),
        created: accepted.created,
    }
}

fn reject(problem: Problem) -> Response {
    metrics::counter!(REJECTED, "reason" => problem.reason().to_owned()).increment(1);
    problem.into_response()
}
