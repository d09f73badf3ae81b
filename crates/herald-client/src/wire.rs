//! The API's wire types. Every request and answer body of `/v1` is one of these: the API
//! parses requests into them (`herald-api/src/validate.rs`), generates its OpenAPI document
//! from them (`herald-api/src/openapi.rs`) and maps store rows into them
//! (`herald-api/src/views.rs`), so a change of a table is not a change of the API by
//! accident; every client reads and writes them through [`crate::Client`].

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

/// `POST /v1/messages` body. `partition_key` defaults to the recipient.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SendRequest {
    /// Whom the provider delivers to (a phone number, an address).
    #[schema(min_length = 1, max_length = 320)]
    pub recipient: String,
    /// The message for the provider: any JSON value but null.
    pub body: serde_json::Value,
    /// Routes the message (default: the recipient): one partition key's messages keep their
    /// order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(min_length = 1, max_length = 255)]
    pub partition_key: Option<String>,
}

/// One item of `POST /v1/messages/batch`; the key replaces the header of the single form.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchItem {
    #[schema(min_length = 1, max_length = 320)]
    pub recipient: String,
    /// Any JSON value but null.
    pub body: serde_json::Value,
    /// Routes the message (default: the recipient): one partition key's messages keep their
    /// order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(min_length = 1, max_length = 255)]
    pub partition_key: Option<String>,
    /// As the Idempotency-Key header of a single message: 1 to 255 visible ASCII characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(min_length = 1, max_length = 255, pattern = "^[!-~]+$")]
    pub idempotency_key: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchRequest {
    /// 1 to `--max-batch` (1,000) messages, committed all or nothing.
    #[schema(min_items = 1)]
    #[serde(deserialize_with = "objects_only")]
    pub messages: Vec<BatchItem>,
}

/// `T` parsed from a JSON object only. serde's derived structs also take an array of their
/// fields in declaration order (`["+15550100", "hi"]`), a form this API never documented and
/// a client would only send by mistake.
#[derive(Debug)]
pub struct ObjectOnly<T>(pub T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for ObjectOnly<T> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Object<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>> serde::de::Visitor<'de> for Object<T> {
            type Value = T;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
                T::deserialize(serde::de::value::MapAccessDeserializer::new(map))
            }
        }
        deserializer
            .deserialize_map(Object(std::marker::PhantomData))
            .map(ObjectOnly)
    }
}

fn objects_only<'de, D, T>(deserializer: D) -> Result<Vec<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    let items: Vec<ObjectOnly<T>> = Deserialize::deserialize(deserializer)?;
    Ok(items.into_iter().map(|ObjectOnly(item)| item).collect())
}

/// The answer for one accepted message.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct AcceptedMessage {
    pub id: Uuid,
    pub state: String,
    /// False when an earlier request with the same Idempotency-Key created it.
    pub created: bool,
}

/// The answer to a batch: one entry per message, in request order.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct BatchResponse {
    pub messages: Vec<AcceptedMessage>,
}

/// `GET /v1/messages/{id}`: a message, its derived current state and its whole history.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct MessageHistory {
    pub id: Uuid,
    pub partition: u32,
    pub recipient: String,
    #[schema(value_type = Object)]
    pub body: serde_json::Value,
    pub idempotency_key: Option<String>,
    /// The name of the API key that accepted it (null: an API without keys).
    pub created_by: Option<String>,
    pub created_at: DateTime<Utc>,
    /// QUEUED, CLAIMED, ACCEPTED, ENROUTE, DELIVERED, UNDELIVERED, EXPIRED, FAILED, DEAD or
    /// UNKNOWN: the latest event's state.
    pub state: String,
    pub events: Vec<HistoryEvent>,
}

/// One entry of a message's append-only history, oldest first.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct HistoryEvent {
    pub seq: i64,
    pub state: String,
    pub at: DateTime<Utc>,
    /// What came with the transition (provider id, gateway, error, receipt fields).
    #[schema(value_type = Object)]
    pub detail: serde_json::Value,
}

/// `GET /v1/partitions`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct PartitionList {
    pub partitions: Vec<PartitionInfo>,
}

/// One outbox partition: its recorded owner and fencing epoch, and its backlog.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct PartitionInfo {
    pub partition: u32,
    /// The poller that recorded the latest epoch (etcd is the source of truth for liveness).
    pub owner: Option<String>,
    pub epoch: Option<i64>,
    pub acquired_at: Option<DateTime<Utc>>,
    /// Rows waiting to be published.
    pub pending: i64,
    pub oldest_pending_age_seconds: f64,
}

/// `POST /v1/providers/{gateway}/receipts`: the stored receipt's id.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct ReceiptStored {
    pub receipt_id: i64,
}

/// `POST /v1/providers/{gateway}/receipts/batch`: the stored receipts' ids, in request order.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct ReceiptsStored {
    pub receipt_ids: Vec<i64>,
}

/// `GET /v1/dead`: a page of DEAD outbox rows, oldest first.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct DeadList {
    /// How many rows are DEAD in all.
    pub count: i64,
    pub dead: Vec<DeadOutboxRow>,
    /// The next page (`/v1/dead?after=…&limit=…`), null on the last.
    pub next: Option<String>,
}

/// An outbox row that used every attempt.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct DeadOutboxRow {
    pub id: i64,
    pub partition: i32,
    /// send or status.
    pub job_type: String,
    pub message_id: Option<Uuid>,
    pub attempts: i32,
    pub last_error: Option<String>,
    pub created_at: DateTime<Utc>,
}

/// `POST /v1/dead/{id}/redrive`: the row is PENDING again with a fresh attempt budget.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct Redriven {
    pub id: i64,
    pub partition: u32,
    /// Always PENDING.
    pub status: String,
}

/// `GET /v1/parking`: a page of parked input, oldest first.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct ParkedList {
    pub parked: Vec<ParkedItem>,
    /// The next page (`/v1/parking?after=…&limit=…`), null on the last.
    pub next: Option<String>,
}

/// Input Herald could not apply, kept with its raw body and the reason.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct ParkedItem {
    pub id: i64,
    pub job_type: String,
    pub receipt_id: Option<i64>,
    pub gateway: Option<String>,
    /// The raw body as text (lossy for non-UTF-8 bytes; the bytes are kept as they came).
    pub raw: String,
    pub reason: String,
    pub parked_at: DateTime<Utc>,
}

/// `POST /v1/parking/{id}/replay`: the parked item is queued again as this outbox row.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct ParkedReplayed {
    pub id: i64,
    pub outbox_id: i64,
}
