//! Limits on how long a request may take and how often a caller may ask.
//!
//! - **Request timeout** (`--request-timeout`): a request that has no answer in time is
//!   answered 503 with `Retry-After`. A write (any POST) may still commit after that answer —
//!   a message waiting in a group commit is written with its group — so it is answered
//!   `outcome-unknown`, and the client retries with the same Idempotency-Key; a read changed
//!   nothing and is answered `timeout`.
//! - **Rate limit** (`--rate-limit`, `--rate-limit-burst`): a token bucket per API key (one
//!   bucket for an open API), checked after the key is known; past it the request is answered
//!   429 `rate-limited` with `Retry-After` and writes nothing. Receipt routes are not limited:
//!   refusing a provider's receipt only makes it post again.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};

use crate::auth::Caller;
use crate::metrics::{RATE_LIMITED, REJECTED, REQUEST_DURATION, TIMEOUTS};
use crate::problem::Problem;
use crate::ApiState;

/// Requests per second each API key may make, and how many it may make at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimit {
    pub per_second: NonZeroU32,
    pub burst: NonZeroU32,
}

/// One token bucket per key name.
pub struct CallerLimiter {
    limiter: DefaultKeyedRateLimiter<Arc<str>>,
    clock: DefaultClock,
}

impl CallerLimiter {
    pub fn new(limit: RateLimit) -> Self {
        Self {
            limiter: RateLimiter::keyed(
                Quota::per_second(limit.per_second).allow_burst(limit.burst),
            ),
            clock: DefaultClock::default(),
        }
    }

    /// None when `key` may go on, else how long until it may.
    pub fn check(&self, key: &Arc<str>) -> Option<Duration> {
        self.limiter
            .check_key(key)
            .err()
            .map(|not_until| not_until.wait_time_from(self.clock.now()))
    }
}

impl std::fmt::Debug for CallerLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallerLimiter").finish_non_exhaustive()
    }
}

/// Answers 503 when the request has no answer within the API's request timeout.
pub(crate) async fn request_timeout(
    State(state): State<ApiState>,
    request: Request,
    next: Next,
) -> Response {
    let limit = state.limits.request_timeout;
    let write = request.method() == Method::POST;
    // A Uri clone shares its bytes: no copy of the path on every request.
    let uri = request.uri().clone();
    match tokio::time::timeout(limit, next.run(request)).await {
        Ok(response) => response,
        Err(_) => {
            let route = uri.path();
            let problem = if route.starts_with("/v1/providers/") {
                Problem::timed_out_receipt(limit)
            } else if write {
                Problem::timed_out_write(limit)
            } else {
                Problem::timed_out_read(limit)
            };
            // The accept latency histogram is recorded by the handler, which was dropped: the
            // slowest accepts must still count (at the timeout, a lower bound).
            let accept_route = match route {
                "/v1/messages" => Some("accept"),
                "/v1/messages/batch" => Some("accept_batch"),
                _ => None,
            };
            if let Some(accept_route) = accept_route {
                metrics::histogram!(REQUEST_DURATION, "route" => accept_route)
                    .record(limit.as_secs_f64());
            }
            tracing::warn!(route, timeout = ?limit, write, "a request had no answer in time");
            metrics::counter!(TIMEOUTS, "kind" => if write { "write" } else { "read" })
                .increment(1);
            metrics::counter!(REJECTED, "reason" => problem.reason().to_owned()).increment(1);
            with_retry_after(problem.into_response(), Duration::from_secs(1))
        }
    }
}

/// Answers 429 when the caller's key has used its rate (after authentication, which puts the
/// caller in the request).
pub(crate) async fn rate_limit(
    State(state): State<ApiState>,
    request: Request,
    next: Next,
) -> Response {
    let Some(limiter) = state.rate_limiter.as_deref() else {
        return next.run(request).await;
    };
    let key: Arc<str> = request
        .extensions()
        .get::<Caller>()
        .and_then(|caller| caller.name.clone())
        .unwrap_or_else(|| Arc::from("anonymous"));
    let Some(wait) = limiter.check(&key) else {
        return next.run(request).await;
    };
    metrics::counter!(RATE_LIMITED).increment(1);
    metrics::counter!(REJECTED, "reason" => "rate-limited").increment(1);
    tracing::info!(key = %key, wait = ?wait, "a key is past its rate limit");
    with_retry_after(Problem::rate_limited(wait).into_response(), wait)
}

/// `Retry-After` in whole seconds, at least 1.
fn with_retry_after(mut response: Response, wait: Duration) -> Response {
    let seconds = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(seconds.max(1)));
    response
}
