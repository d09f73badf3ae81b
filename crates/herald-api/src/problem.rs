//! RFC 9457 problem details: every error the API answers.

use std::time::Duration;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

/// An error answered as `application/problem+json` (RFC 9457). `field` names the offending
/// input.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Problem {
    /// `urn:herald:problem:<slug>`, e.g. `urn:herald:problem:invalid-field`.
    #[serde(rename = "type")]
    pub kind: String,
    pub title: &'static str,
    pub status: u16,
    pub detail: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// The `WWW-Authenticate` challenge of a 401 (default `Bearer`).
    #[serde(skip)]
    pub challenge: Option<&'static str>,
}

impl Problem {
    pub fn new(
        status: StatusCode,
        slug: &str,
        title: &'static str,
        detail: impl Into<String>,
    ) -> Self {
        Self {
            kind: format!("urn:herald:problem:{slug}"),
            title,
            status: status.as_u16(),
            detail: detail.into(),
            field: None,
            challenge: None,
        }
    }

    pub fn with_field(mut self, field: impl Into<String>) -> Self {
        self.field = Some(field.into());
        self
    }

    pub fn invalid_field(field: impl Into<String>, detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid-field",
            "A field is missing or invalid",
            detail,
        )
        .with_field(field)
    }

    pub fn malformed_json(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "malformed-json",
            "The body is not valid JSON",
            detail,
        )
    }

    pub fn too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body-too-large",
            "The request body is too large",
            format!("the body exceeds the limit of {limit} bytes"),
        )
    }

    pub fn unavailable() -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "Herald cannot commit the request right now",
            "the database did not answer; nothing was written, retry with the same Idempotency-Key",
        )
    }

    /// A failed write, told apart by whether anything may have been written.
    pub fn write_failed(err: &herald_store::StoreError) -> Self {
        match err {
            herald_store::StoreError::OutcomeUnknown(_) => Self::outcome_unknown(),
            _ => Self::unavailable(),
        }
    }

    /// The connection broke after the write was sent: the request may be stored.
    pub fn outcome_unknown() -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "outcome-unknown",
            "Herald cannot tell whether the request was committed",
            "the connection to the database broke after the write was sent, so the request may \
             be stored; retry with the same Idempotency-Key (the answer names the stored message, \
             or stores it now); a retry without a key may store it twice",
        )
    }

    /// A write that had no answer within the request timeout: it may still commit (a message
    /// waiting in a group commit is written with its group), so its outcome is unknown.
    pub fn timed_out_write(limit: Duration) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "outcome-unknown",
            "Herald cannot tell whether the request was committed",
            format!(
                "the request had no answer within {}, and it may still be committed; retry with \
                 the same Idempotency-Key (the answer names the stored message, or stores it \
                 now); a retry without a key may store it twice",
                humantime::format_duration(limit)
            ),
        )
    }

    /// A receipt post that had no answer within the request timeout: it may still be stored
    /// with its group.
    pub fn timed_out_receipt(limit: Duration) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "outcome-unknown",
            "Herald cannot tell whether the receipt was stored",
            format!(
                "the receipt had no answer within {}, and it may still be stored; post it again",
                humantime::format_duration(limit)
            ),
        )
    }

    /// A read that had no answer within the request timeout (nothing was changed).
    pub fn timed_out_read(limit: Duration) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "timeout",
            "Herald did not answer in time",
            format!(
                "the request had no answer within {}; nothing was changed, retry it",
                humantime::format_duration(limit)
            ),
        )
    }

    /// The caller's key is past its rate limit; nothing was written.
    pub fn rate_limited(wait: Duration) -> Self {
        Self::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate-limited",
            "Too many requests for this API key",
            format!(
                "this key is past its rate limit; nothing was written, retry after {} (see \
                 Retry-After)",
                humantime::format_duration(Duration::from_millis(wait.as_millis().max(1) as u64))
            ),
        )
    }

    /// A short label for the rejection counter.
    pub fn reason(&self) -> &str {
        self.kind.rsplit(':').next().unwrap_or("unknown")
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut response = (status, axum::Json(&self)).into_response();
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        // Every 503 says when to come back (a guard may set a longer wait).
        if status == StatusCode::SERVICE_UNAVAILABLE {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        if status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static(self.challenge.unwrap_or("Bearer")),
            );
        }
        response
    }
}
