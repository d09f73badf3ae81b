//! Who may call what. Bearer keys carry a scope: a *client* key accepts messages and reads the
//! messages it accepted; an *operator* key does what a client key does for every message, and
//! runs the operator routes (DEAD rows, parking, partitions). Providers hold no bearer key:
//! each receipt post is signed with its gateway's secret (`herald_core::signature`), checked
//! over the raw body before anything is stored. Keys are compared in constant time, against
//! every configured key, without stopping at the first match.

mod credentials;

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use herald_core::signature;

pub use credentials::{parse_pairs, ApiKey, CredentialError, Credentials, Scope, MIN_SECRET_CHARS};

use crate::metrics::{REJECTED, SIGNATURE_REJECTIONS};
use crate::problem::Problem;
use crate::ApiState;

/// Who made a request, as the bearer middleware found it; handlers take it as an extension.
#[derive(Debug, Clone)]
pub struct Caller {
    /// The key's name; None when the API runs open (a development run without keys).
    pub name: Option<Arc<str>>,
    pub scope: Scope,
}

impl Caller {
    /// Whether this caller may read a message that `created_by` accepted: an operator reads
    /// every message, a client only its own.
    pub fn may_read(&self, created_by: Option<&str>) -> bool {
        match self.scope {
            Scope::Operator => true,
            Scope::Client => self.name.is_some() && self.name.as_deref() == created_by,
        }
    }

    /// The name for logs.
    pub fn label(&self) -> &str {
        self.name.as_deref().unwrap_or("anonymous")
    }
}

/// Routes for client keys (and operators).
pub(crate) async fn require_client(
    State(state): State<ApiState>,
    request: Request,
    next: Next,
) -> Response {
    authorize(&state, Scope::Client, request, next).await
}

/// Routes for operator keys only.
pub(crate) async fn require_operator(
    State(state): State<ApiState>,
    request: Request,
    next: Next,
) -> Response {
    authorize(&state, Scope::Operator, request, next).await
}

async fn authorize(state: &ApiState, needed: Scope, mut request: Request, next: Next) -> Response {
    let credentials = &state.credentials;
    if credentials.bearer_open() {
        request.extensions_mut().insert(Caller {
            name: None,
            scope: Scope::Operator,
        });
        return next.run(request).await;
    }
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        .map(str::trim);
    let Some(presented) = presented else {
        return unauthorized("send `Authorization: Bearer <api key>`");
    };
    let Some(key) = credentials.find(presented) else {
        return unauthorized("the API key is not valid");
    };
    if !key.scope.allows(needed) {
        tracing::warn!(key = %key.name, scope = key.scope.as_str(), path = %request.uri().path(),
            "a key called a route outside its scope");
        return forbidden(key, needed);
    }
    let caller = Caller {
        name: Some(Arc::from(key.name.as_str())),
        scope: key.scope,
    };
    request.extensions_mut().insert(caller.clone());
    let mut response = next.run(request).await;
    // For the access log, which wraps this and sees only the response.
    response.extensions_mut().insert(caller);
    response
}

fn unauthorized(detail: &str) -> Response {
    metrics::counter!(REJECTED, "reason" => "unauthorized").increment(1);
    Problem::new(
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        "Authentication required",
        detail,
    )
    .into_response()
}

fn forbidden(key: &ApiKey, needed: Scope) -> Response {
    metrics::counter!(REJECTED, "reason" => "forbidden").increment(1);
    Problem::new(
        StatusCode::FORBIDDEN,
        "forbidden",
        "The key may not call this route",
        format!(
            "key {:?} is a {} key; this route needs an {} key",
            key.name,
            key.scope.as_str(),
            needed.as_str()
        ),
    )
    .into_response()
}

/// The secrets a receipt post to `gateway` must be signed with, or None when receipts need no
/// signature (a development run without receipt secrets). A gateway without a secret is
/// refused here, before its body is read.
pub(crate) fn receipt_secrets<'a>(
    state: &'a ApiState,
    gateway: &str,
) -> Result<Option<&'a [Vec<u8>]>, Problem> {
    if state.credentials.receipts_open() {
        return Ok(None);
    }
    match state.credentials.receipt_secrets(gateway) {
        Some(secrets) => Ok(Some(secrets)),
        None => Err(signature_refused(gateway, "unknown_gateway")),
    }
}

/// Checks a receipt post's `Herald-Signature` over its raw body against `secrets` and the
/// window around this API's clock.
pub(crate) fn verify_receipt(
    state: &ApiState,
    gateway: &str,
    secrets: &[Vec<u8>],
    headers: &HeaderMap,
    raw: &[u8],
) -> Result<(), Problem> {
    let presented = headers
        .get(signature::HEADER)
        .map(|value| value.to_str().unwrap_or_default());
    let window = state.credentials.signature_window.as_secs();
    signature::verify(secrets, presented, raw, unix_now(), window)
        .map_err(|err| signature_refused(gateway, err.reason()))
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or_default()
}

/// A receipt post whose signature is refused: counted by reason, logged, answered 401.
fn signature_refused(gateway: &str, reason: &'static str) -> Problem {
    metrics::counter!(SIGNATURE_REJECTIONS, "reason" => reason).increment(1);
    // A name that is not a gateway's is not repeated into the log.
    let shown = if crate::operations::check_gateway(gateway).is_ok() {
        gateway
    } else {
        "(invalid name)"
    };
    tracing::warn!(
        gateway = shown,
        reason,
        "refused a receipt post: its signature does not hold"
    );
    let detail = match reason {
        "unknown_gateway" => format!("no receipt secret is configured for gateway {shown:?}"),
        "missing" => "sign the post: `Herald-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of \"<t>.<body>\" with the gateway's secret>`".to_owned(),
        "malformed" => "the Herald-Signature header is not `t=<unix seconds>,v1=<64 hex digits>`".to_owned(),
        "stale" => "the signature's timestamp is outside the accepted window; sign each post (and each retry) when it is sent".to_owned(),
        _ => "the signature does not match the body with any secret of this gateway".to_owned(),
    };
    let mut problem = Problem::new(
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        "The receipt's signature is not valid",
        detail,
    );
    problem.challenge = Some("Herald-Signature");
    problem
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operators_may_do_what_clients_may_and_not_the_reverse() {
        assert!(Scope::Operator.allows(Scope::Client));
        assert!(Scope::Operator.allows(Scope::Operator));
        assert!(Scope::Client.allows(Scope::Client));
        assert!(!Scope::Client.allows(Scope::Operator));
        let client = Caller {
            name: Some(Arc::from("shop")),
            scope: Scope::Client,
        };
        assert!(client.may_read(Some("shop")));
        assert!(!client.may_read(Some("billing")));
        assert!(!client.may_read(None));
        let operator = Caller {
            name: Some(Arc::from("ops")),
            scope: Scope::Operator,
        };
        assert!(operator.may_read(Some("shop")) && operator.may_read(None));
    }
}
