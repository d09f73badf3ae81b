//! API keys: `Authorization: Bearer <key>`, compared in constant time.

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

use crate::problem::Problem;
use crate::ApiState;

pub(crate) async fn require_api_key(
    State(state): State<ApiState>,
    request: Request,
    next: Next,
) -> Response {
    if state.api_keys.is_empty() {
        return next.run(request).await;
    }
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        .map(str::trim);
    match presented {
        Some(key) if key_matches(&state.api_keys, key) => next.run(request).await,
        Some(_) => unauthorized("the API key is not valid"),
        None => unauthorized("send `Authorization: Bearer <api key>`"),
    }
}

/// Compares against every configured key without stopping early, so timing does not tell
/// which key (or how much of one) matched.
fn key_matches(keys: &[String], presented: &str) -> bool {
    let mut matched = subtle::Choice::from(0u8);
    for key in keys {
        matched |= key.as_bytes().ct_eq(presented.as_bytes());
    }
    bool::from(matched)
}

fn unauthorized(detail: &str) -> Response {
    metrics::counter!(crate::metrics::REJECTED, "reason" => "unauthorized").increment(1);
    Problem::new(
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        "Authentication required",
        detail,
    )
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_only_a_configured_key() {
        let keys = vec!["alpha-key".to_owned(), "beta-key".to_owned()];
        assert!(key_matches(&keys, "beta-key"));
        assert!(!key_matches(&keys, "beta-ke"));
        assert!(!key_matches(&keys, ""));
        assert!(!key_matches(&[], "anything"));
    }
}
