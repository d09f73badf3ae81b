//! The API's metrics, declared in one place.

/// Messages committed (new ones, not idempotent replays).
pub const ACCEPTED: &str = "herald_messages_accepted_total";
/// Idempotent replays answered with the existing id.
pub const REPLAYED: &str = "herald_messages_replayed_total";
/// Requests refused, by reason (the problem type).
pub const REJECTED: &str = "herald_api_rejected_total";
/// Provider receipts stored.
pub const RECEIPTS: &str = "herald_receipts_received_total";
/// Receipt posts refused for their signature, by reason; nothing of them was stored.
pub const SIGNATURE_REJECTIONS: &str = "herald_receipt_signature_rejections_total";
/// Every `/v1` request answered, by route (its pattern) and status class: the denominator and
/// numerator of the API's error-budget alerts.
pub const REQUESTS: &str = "herald_api_requests_total";
/// Requests of a key past `--rate-limit`, answered 429.
pub const RATE_LIMITED: &str = "herald_api_rate_limited_total";
/// Requests answered 503 because they had no answer within `--request-timeout`, by `kind`.
pub const TIMEOUTS: &str = "herald_api_request_timeouts_total";
/// Accept requests (single and batch), end to end inside the handler.
pub const REQUEST_DURATION: &str = "herald_api_request_duration_seconds";
/// Outbox rows still owed work (PENDING, PROCESSING, PUBLISHED), by partition.
pub const BACKLOG_ROWS: &str = "herald_outbox_backlog_rows";
/// Age of each partition's oldest PENDING row; 0 when it has none.
pub const OLDEST_PENDING_AGE: &str = "herald_outbox_oldest_pending_age_seconds";
/// Outbox rows in DEAD now.
pub const DEAD_ROWS: &str = "herald_outbox_dead_rows";
/// The partition count fixed at install.
pub const PARTITIONS: &str = "herald_outbox_partitions";

/// The `reason` values of [`REJECTED`] (problem type slugs) registered at zero on start, so
/// a rate of refusals reads 0 rather than nothing. Rarer slugs appear when first counted.
pub const REJECTED_REASONS: [&str; 9] = [
    "malformed-json",
    "invalid-field",
    "body-too-large",
    "unsupported-media-type",
    "idempotency-key-conflict",
    "not-found",
    "unavailable",
    "unauthorized",
    "forbidden",
];

/// The `reason` values of [`SIGNATURE_REJECTIONS`]: no secret for the gateway, no header, a
/// header not in the format, no signature matching a secret, a timestamp outside the window.
pub const SIGNATURE_REASONS: [&str; 5] = [
    "unknown_gateway",
    "missing",
    "malformed",
    "mismatch",
    "stale",
];

pub fn describe() {
    herald_store::group::register_metrics("accept");
    herald_store::group::register_metrics("receipts");
    metrics::describe_gauge!(
        BACKLOG_ROWS,
        "Outbox rows not yet DONE or DEAD (PENDING, PROCESSING, PUBLISHED), by partition."
    );
    metrics::describe_gauge!(
        OLDEST_PENDING_AGE,
        metrics::Unit::Seconds,
        "Age of the oldest PENDING outbox row, by partition; 0 when none."
    );
    metrics::describe_gauge!(DEAD_ROWS, "Outbox rows in DEAD, waiting for an operator.");
    metrics::describe_gauge!(
        PARTITIONS,
        "The outbox's partition count, fixed at install."
    );
    metrics::describe_counter!(ACCEPTED, "Messages committed with their outbox row.");
    metrics::describe_counter!(
        REPLAYED,
        "Requests answered from an existing Idempotency-Key."
    );
    metrics::describe_counter!(REJECTED, "API requests refused, by reason.");
    metrics::describe_counter!(RECEIPTS, "Provider receipts stored with their status job.");
    metrics::describe_counter!(
        SIGNATURE_REJECTIONS,
        "Receipt posts refused (401, nothing stored) because their signature does not hold, by reason."
    );
    metrics::describe_counter!(
        REQUESTS,
        "API requests answered, by route pattern and status class (2xx, 4xx, 5xx)."
    );
    for route in ["/v1/messages", "/v1/messages/batch"] {
        for class in ["2xx", "4xx", "5xx"] {
            metrics::counter!(REQUESTS, "route" => route, "class" => class).increment(0);
        }
    }
    metrics::describe_counter!(
        RATE_LIMITED,
        "Requests refused with 429 because their API key is past --rate-limit (nothing written)."
    );
    metrics::describe_counter!(
        TIMEOUTS,
        "Requests answered 503 because they had no answer within --request-timeout, by kind (write: outcome unknown; read)."
    );
    metrics::describe_histogram!(
        REQUEST_DURATION,
        metrics::Unit::Seconds,
        "API request handling, by route."
    );
    for route in ["accept", "accept_batch"] {
        let _ = metrics::histogram!(REQUEST_DURATION, "route" => route);
    }
    for kind in ["write", "read"] {
        metrics::counter!(TIMEOUTS, "kind" => kind).increment(0);
    }
    for counter in [ACCEPTED, REPLAYED, RECEIPTS, RATE_LIMITED] {
        metrics::counter!(counter).increment(0);
    }
    for reason in REJECTED_REASONS {
        metrics::counter!(REJECTED, "reason" => reason).increment(0);
    }
    for reason in SIGNATURE_REASONS {
        metrics::counter!(SIGNATURE_REJECTIONS, "reason" => reason).increment(0);
    }
}
