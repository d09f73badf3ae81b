//! The API's wire types, shared with clients (the load tester, the demo).

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// `POST /v1/messages` body. `partition_key` defaults to the recipient.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SendRequest {
    pub recipient: String,
    pub body: serde_json::Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition_key: Option<String>,
}

/// One item of `POST /v1/messages/batch`; the key replaces the header of the single form.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct BatchItem {
    pub recipient: String,
    pub body: serde_json::Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition_key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct BatchRequest {
    pub messages: Vec<BatchItem>,
}

/// The answer for one accepted message.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct AcceptedMessage {
    pub id: Uuid,
    pub state: String,
    /// False when an earlier request with the same Idempotency-Key created it.
    pub created: bool,
}

/// The answer to a batch: one entry per message, in request order.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct BatchResponse {
    pub messages: Vec<AcceptedMessage>,
}
