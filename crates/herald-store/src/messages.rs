//! Reading a message and its history.

use chrono::{DateTime, Utc};
use herald_core::MessageState;
use serde_json::Value;
use sqlx::types::Json;
use sqlx::PgPool;
use uuid::Uuid;

use crate::StoreError;

/// One entry of a message's append-only history.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub seq: i64,
    pub state: String,
    pub at: DateTime<Utc>,
    pub detail: Value,
}

/// A message, its derived current state and its full history, oldest event first.
#[derive(Debug, Clone, PartialEq)]
pub struct MessageView {
    pub id: Uuid,
    pub partition: u32,
    pub recipient: String,
    pub body: Value,
    pub idempotency_key: Option<String>,
    /// The name of the API key that accepted it (None: accepted by an API without keys).
    pub created_by: Option<String>,
    pub created_at: DateTime<Utc>,
    pub state: String,
    pub events: Vec<Event>,
}

#[derive(sqlx::FromRow)]
struct MessageRow {
    id: Uuid,
    partition: i32,
    recipient: String,
    body: Json<Value>,
    idempotency_key: Option<String>,
    created_by: Option<String>,
    created_at: DateTime<Utc>,
    state: String,
}

/// The message with `id`, or `None`.
pub async fn message_with_history(
    pool: &PgPool,
    id: Uuid,
) -> Result<Option<MessageView>, StoreError> {
    let message: Option<MessageRow> = sqlx::query_as(
        "SELECT m.id, m.partition, m.recipient, m.body, m.idempotency_key, m.created_by,
                    m.created_at, s.state
             FROM messages m JOIN message_current_state s ON s.message_id = m.id
             WHERE m.id = $1",
    )
    .bind(id)
    .fetch_optional(pool)
    .await?;
    let Some(MessageRow {
        id,
        partition,
        recipient,
        body: Json(body),
        idempotency_key,
        created_by,
        created_at,
        state,
    }) = message
    else {
        return Ok(None);
    };
    // A compacted history (crate::retention) is one event listing every transition: it is
    // read back as the events it replaced, so a compacted message answers the same states
    // and times as a fresh one.
    let events: Vec<(i64, String, DateTime<Utc>, Json<Value>)> = sqlx::query_as(
        "SELECT coalesce((t.entry->>'seq')::bigint, e.seq),
                coalesce(t.entry->>'state', e.state),
                coalesce((t.entry->>'at')::timestamptz, e.at),
                CASE WHEN t.entry IS NULL THEN e.detail
                     ELSE coalesce(t.entry->'detail', '{}'::jsonb) END
         FROM message_events e
         LEFT JOIN LATERAL jsonb_array_elements(
             CASE WHEN jsonb_typeof(e.detail->'compacted') = 'array'
                  THEN e.detail->'compacted' END) AS t(entry) ON true
         WHERE e.message_id = $1
         ORDER BY 1",
    )
    .bind(id)
    .fetch_all(pool)
    .await?;
    let mut events: Vec<Event> = events
        .into_iter()
        .map(|(seq, state, at, Json(detail))| Event {
            seq,
            state,
            at,
            detail,
        })
        .collect();
    // The accept writes no QUEUED event (migration 0019): the message row is that fact, and
    // its `created_at` (the accept transaction's start) is the event's time. A written QUEUED
    // event took the clock a moment later in the same statement; histories written before
    // 0019 carry theirs.
    if !events.iter().any(|e| e.state == QUEUED) {
        events.insert(0, queued_at(created_at));
    }
    Ok(Some(MessageView {
        id,
        partition: partition as u32,
        recipient,
        body,
        idempotency_key,
        created_by,
        created_at,
        state,
        events,
    }))
}

const QUEUED: &str = MessageState::Queued.as_str();

/// The derived first event of every history: seq 0 sorts before every written event.
fn queued_at(created_at: DateTime<Utc>) -> Event {
    Event {
        seq: 0,
        state: QUEUED.to_owned(),
        at: created_at,
        detail: Value::Object(Default::default()),
    }
}
