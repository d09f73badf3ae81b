//! The API's metrics, declared in one place.

/// Messages committed (new ones, not idempotent replays).
pub const ACCEPTED: &str = "herald_messages_accepted_total";
/// Idempotent replays answered with the existing id.
pub const REPLAYED: &str = "herald_messages_replayed_total";
/// Requests refused, by reason (the problem type).
pub const REJECTED: &str = "herald_api_rejected_total";
/// Provider receipts stored.
pub const RECEIPTS: &str = "herald_receipts_received_total";
/// Accept requests (single and batch), end to end inside the handler.
pub const REQUEST_DURATION: &str = "herald_api_request_duration_seconds";

pub fn describe() {
    metrics::describe_counter!(ACCEPTED, "Messages committed with their outbox row.");
    metrics::describe_counter!(
        REPLAYED,
        "Requests answered from an existing Idempotency-Key."
    );
    metrics::describe_counter!(REJECTED, "API requests refused, by reason.");
    metrics::describe_counter!(RECEIPTS, "Provider receipts stored with their status job.");
    metrics::describe_histogram!(
        REQUEST_DURATION,
        metrics::Unit::Seconds,
        "API request handling, by route."
    );
}
