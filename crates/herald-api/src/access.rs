//! Request ids and the access log.
//!
//! Every request gets an id: the client's `X-Request-Id` when it sent a usable one (1 to 128
//! visible ASCII characters), else a new UUID v7. The id is answered in `X-Request-Id` (on
//! problems too), carried by the request's tracing span, so every line a handler logs names it,
//! and written in the request's access-log line. A client that quotes it finds the request in
//! the logs.
//!
//! The access log is one line per request with the id, method, route, status, duration and
//! caller: at WARN for a 5xx, INFO for a 4xx, DEBUG for the rest (a busy API answers thousands
//! of 202s a second; `RUST_LOG=herald_api::access=debug` shows them).

use std::time::Instant;

use axum::extract::{MatchedPath, Request};
use axum::http::{HeaderName, HeaderValue};
use axum::middleware::Next;
use axum::response::Response;
use tracing::Instrument;

use crate::auth::Caller;
use crate::metrics::REQUESTS;

/// The request id's header, asked and answered.
pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// The request's id, for handlers that want it (also in the span).
#[derive(Debug, Clone)]
pub struct RequestId(pub String);

/// The client's id when it is usable, else a new one.
fn request_id(request: &Request) -> String {
    request
        .headers()
        .get(&REQUEST_ID)
        .and_then(|value| value.to_str().ok())
        .filter(|id| (1..=128).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_graphic()))
        .map(str::to_owned)
        .unwrap_or_else(|| uuid::Uuid::now_v7().to_string())
}

/// The middleware: names the request, runs it in a span with that name, answers the name and
/// writes the access-log line.
pub async fn request_id_and_access_log(mut request: Request, next: Next) -> Response {
    let started = Instant::now();
    let id = request_id(&request);
    let method = request.method().clone();
    let matched = request
        .extensions()
        .get::<MatchedPath>()
        .map(|path| path.as_str().to_owned());
    // The metric takes the route's pattern, never a raw path (one series per unknown URL).
    let route_label = matched.clone().unwrap_or_else(|| "unmatched".to_owned());
    let route = matched.unwrap_or_else(|| request.uri().path().to_owned());
    request.extensions_mut().insert(RequestId(id.clone()));
    let span = tracing::info_span!("request", request_id = %id, %method, %route);
    let mut response = next.run(request).instrument(span).await;
    if let Ok(value) = HeaderValue::from_str(&id) {
        response.headers_mut().insert(REQUEST_ID, value);
    }
    let status = response.status().as_u16();
    let class = match status {
        500.. => "5xx",
        400..=499 => "4xx",
        300..=399 => "3xx",
        _ => "2xx",
    };
    metrics::counter!(REQUESTS, "route" => route_label, "class" => class).increment(1);
    let duration_ms = started.elapsed().as_secs_f64() * 1000.0;
    let caller = response
        .extensions()
        .get::<Caller>()
        .and_then(|caller| caller.name.as_deref().map(str::to_owned))
        .unwrap_or_default();
    macro_rules! access {
        ($level:expr) => {
            tracing::event!(target: "herald_api::access", $level, request_id = %id, %method,
                            %route, status, duration_ms, caller, "request")
        };
    }
    match status {
        500.. => access!(tracing::Level::WARN),
        400..=499 => access!(tracing::Level::INFO),
        _ => access!(tracing::Level::DEBUG),
    }
    response
}
