//! Herald's API wire types ([`wire`]) and a small client over them ([`Client`]): what the
//! load tester, the demo (`herald dev`) and the tests call the API with. The client does one
//! request per call and no retries; [`ClientError::is_transient`] tells a caller's retry loop
//! which failures are worth another try with the same idempotency key.

pub mod wire;

use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderValue, AUTHORIZATION, CONTENT_TYPE, RETRY_AFTER};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::wire::{
    AcceptedMessage, BatchItem, BatchRequest, BatchResponse, DeadList, MessageHistory, ParkedList,
    ParkedReplayed, PartitionList, ReceiptStored, ReceiptsStored, Redriven, SendRequest,
};

/// An RFC 9457 problem, as the API answers every error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Problem {
    /// `urn:herald:problem:<slug>`.
    #[serde(rename = "type")]
    pub kind: String,
    pub title: String,
    pub status: u16,
    pub detail: String,
    /// The offending input, when one field is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
}

/// Why a call did not answer what it asked for.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// No answer: the connection failed or the request timed out.
    #[error("{}", if .0.is_timeout() { "timeout" } else { "connection error" })]
    Transport(#[source] reqwest::Error),
    /// The API answered an error status, with its problem body when it sent one.
    #[error("HTTP {status}{}", .problem.as_ref().map(|p| format!(": {}", p.detail)).unwrap_or_default())]
    Status {
        status: u16,
        problem: Option<Problem>,
        /// `Retry-After` of a 429 or 503, when given in seconds.
        retry_after: Option<Duration>,
    },
    /// A success status with a body that is not the expected answer.
    #[error("unreadable answer: {0}")]
    Unreadable(String),
    /// The API key cannot be a header value (it must be visible ASCII); nothing was sent.
    #[error("an API key must be visible ASCII")]
    InvalidKey,
}

impl ClientError {
    /// Worth another try with the same idempotency key: no answer, a 5xx or a 429.
    pub fn is_transient(&self) -> bool {
        match self {
            ClientError::Transport(_) | ClientError::Unreadable(_) => true,
            ClientError::Status { status, .. } => *status >= 500 || *status == 429,
            ClientError::InvalidKey => false,
        }
    }

    /// The answered status, if there was one.
    pub fn status(&self) -> Option<u16> {
        match self {
            ClientError::Status { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// A short reason for counting failures by kind: `timeout`, `connection error`,
    /// `HTTP 503`, `unreadable answer`.
    pub fn reason(&self) -> String {
        match self {
            ClientError::Transport(_) => self.to_string(),
            ClientError::Status { status, .. } => format!("HTTP {status}"),
            ClientError::Unreadable(_) => "unreadable answer".to_owned(),
            ClientError::InvalidKey => self.to_string(),
        }
    }
}

/// A client of one Herald API (`base_url`, e.g. `http://127.0.0.1:8080`), with an API key
/// as its bearer token or none. Cloning shares the connection pool.
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    base_url: String,
}

/// How a [`Client`] is built: the reqwest builder with the key's `Authorization` header set,
/// for a caller that tunes timeouts and pools before [`Client::from_http`].
pub fn http_builder(api_key: Option<&str>) -> Result<reqwest::ClientBuilder, ClientError> {
    let builder = reqwest::Client::builder();
    let Some(key) = api_key else {
        return Ok(builder);
    };
    let mut value =
        HeaderValue::from_str(&format!("Bearer {key}")).map_err(|_| ClientError::InvalidKey)?;
    value.set_sensitive(true);
    Ok(builder.default_headers(HeaderMap::from_iter([(AUTHORIZATION, value)])))
}

impl Client {
    /// A client with reqwest's defaults and `api_key` as its bearer token, if any.
    pub fn new(base_url: &str, api_key: Option<&str>) -> Result<Self, ClientError> {
        let http = http_builder(api_key)?
            .build()
            .map_err(ClientError::Transport)?;
        Ok(Self::from_http(base_url, http))
    }

    /// A client over an HTTP client the caller built (its headers, timeouts, pool).
    pub fn from_http(base_url: &str, http: reqwest::Client) -> Self {
        Self {
            http,
            base_url: base_url.trim_end_matches('/').to_owned(),
        }
    }

    /// `POST /v1/messages`, with an `Idempotency-Key` if given.
    pub async fn send(
        &self,
        message: &SendRequest,
        idempotency_key: Option<&str>,
    ) -> Result<AcceptedMessage, ClientError> {
        let mut request = self.http.post(self.url("/v1/messages")).json(message);
        if let Some(key) = idempotency_key {
            request = request.header("Idempotency-Key", key);
        }
        answer(request).await
    }

    /// `POST /v1/messages/batch`: every message committed, or none. The answer has one entry
    /// per message, in request order (checked).
    pub async fn send_batch(&self, messages: Vec<BatchItem>) -> Result<BatchResponse, ClientError> {
        let count = messages.len();
        let request = self
            .http
            .post(self.url("/v1/messages/batch"))
            .json(&BatchRequest { messages });
        let response: BatchResponse = answer(request).await?;
        if response.messages.len() != count {
            return Err(ClientError::Unreadable(format!(
                "{} ids for {count} messages",
                response.messages.len()
            )));
        }
        Ok(response)
    }

    /// `GET /v1/messages/{id}`: the message and its whole history, `None` if the API does
    /// not know it.
    pub async fn message(&self, id: Uuid) -> Result<Option<MessageHistory>, ClientError> {
        let request = self.http.get(self.url(&format!("/v1/messages/{id}")));
        match answer(request).await {
            Ok(history) => Ok(Some(history)),
            Err(ClientError::Status { status: 404, .. }) => Ok(None),
            Err(err) => Err(err),
        }
    }

    /// `GET /v1/partitions`.
    pub async fn partitions(&self) -> Result<PartitionList, ClientError> {
        answer(self.http.get(self.url("/v1/partitions"))).await
    }

    /// `GET /v1/dead`: a page of DEAD outbox rows after outbox id `after`, oldest first.
    pub async fn dead(&self, after: Option<i64>, limit: u32) -> Result<DeadList, ClientError> {
        self.page("/v1/dead", after, limit).await
    }

    /// `POST /v1/dead/{id}/redrive`.
    pub async fn redrive(&self, outbox_id: i64) -> Result<Redriven, ClientError> {
        answer(
            self.http
                .post(self.url(&format!("/v1/dead/{outbox_id}/redrive"))),
        )
        .await
    }

    /// `GET /v1/parking`: a page of parked input after parking id `after`, oldest first.
    pub async fn parking(&self, after: Option<i64>, limit: u32) -> Result<ParkedList, ClientError> {
        self.page("/v1/parking", after, limit).await
    }

    /// `POST /v1/parking/{id}/replay`.
    pub async fn replay(&self, parking_id: i64) -> Result<ParkedReplayed, ClientError> {
        answer(
            self.http
                .post(self.url(&format!("/v1/parking/{parking_id}/replay"))),
        )
        .await
    }

    /// `POST /v1/providers/{gateway}/receipts`: one receipt as the gateway sends it, these
    /// exact bytes, with its `Herald-Signature` if the gateway signs.
    pub async fn receipt(
        &self,
        gateway: &str,
        body: Vec<u8>,
        signature: Option<&str>,
    ) -> Result<ReceiptStored, ClientError> {
        let url = self.url(&format!("/v1/providers/{gateway}/receipts"));
        answer(self.signed(url, body, signature)).await
    }

    /// `POST /v1/providers/{gateway}/receipts/batch`: a JSON array of receipts, stored in one
    /// transaction.
    pub async fn receipts(
        &self,
        gateway: &str,
        body: Vec<u8>,
        signature: Option<&str>,
    ) -> Result<ReceiptsStored, ClientError> {
        let url = self.url(&format!("/v1/providers/{gateway}/receipts/batch"));
        answer(self.signed(url, body, signature)).await
    }

    fn signed(
        &self,
        url: String,
        body: Vec<u8>,
        signature: Option<&str>,
    ) -> reqwest::RequestBuilder {
        let request = self
            .http
            .post(url)
            .header(CONTENT_TYPE, "application/json")
            .body(body);
        match signature {
            Some(signature) => request.header(herald_core::signature::HEADER, signature),
            None => request,
        }
    }

    /// `GET /readyz`: true when the API answers 200 (its database and queues reachable).
    pub async fn ready(&self) -> bool {
        match self.http.get(self.url("/readyz")).send().await {
            Ok(response) => response.status().is_success(),
            Err(_) => false,
        }
    }

    /// A page of an operator list: `?limit=…` and `&after=…` when given.
    async fn page<T: DeserializeOwned>(
        &self,
        path: &str,
        after: Option<i64>,
        limit: u32,
    ) -> Result<T, ClientError> {
        let mut query = vec![("limit", limit.to_string())];
        query.extend(after.map(|after| ("after", after.to_string())));
        answer(self.http.get(self.url(path)).query(&query)).await
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base_url)
    }
}

/// Sends `request` and reads a success answer as `T`, or the error with its problem body.
async fn answer<T: DeserializeOwned>(request: reqwest::RequestBuilder) -> Result<T, ClientError> {
    let response = request.send().await.map_err(ClientError::Transport)?;
    let status = response.status();
    if !status.is_success() {
        let retry_after = response
            .headers()
            .get(RETRY_AFTER)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.trim().parse().ok())
            .map(Duration::from_secs);
        let problem = response.json::<Problem>().await.ok();
        return Err(ClientError::Status {
            status: status.as_u16(),
            problem,
            retry_after,
        });
    }
    let bytes = response.bytes().await.map_err(ClientError::Transport)?;
    serde_json::from_slice(&bytes).map_err(|err| ClientError::Unreadable(err.to_string()))
}
