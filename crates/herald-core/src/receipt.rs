//! Provider delivery receipts: their wire form, the status vocabulary and the timestamp formats
//! (rules R6, R7). Nothing here guesses: an unknown status or an unreadable timestamp is an
//! error for the caller to park, never a default.

use std::collections::HashMap;

use chrono::{DateTime, NaiveDateTime, TimeZone, Utc};
use serde_json::Value;

use crate::MessageState;

/// A receipt as the provider sent it, decoded but not yet interpreted.
#[derive(Debug, Clone, PartialEq)]
pub struct RawReceipt {
    pub provider_id: String,
    pub status: String,
    /// The provider's timestamp exactly as sent (a JSON string or number).
    pub timestamp: Value,
}

/// Why a receipt cannot be applied. Each is parked with the raw body.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReceiptError {
    #[error("receipt is not a JSON object with provider_id, status and timestamp: {0}")]
    Malformed(String),
    #[error("unknown provider status {0:?}")]
    UnknownStatus(String),
    #[error("unparseable timestamp {0}")]
    BadTimestamp(String),
}

/// Decodes `{"provider_id": "…", "status": "…", "timestamp": "…" | 123}`.
pub fn decode(raw: &[u8]) -> Result<RawReceipt, ReceiptError> {
    let value: Value =
        serde_json::from_slice(raw).map_err(|err| ReceiptError::Malformed(err.to_string()))?;
    let object = value
        .as_object()
        .ok_or_else(|| ReceiptError::Malformed("not an object".to_owned()))?;
    let text = |name: &str| match object.get(name) {
        Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
        Some(Value::Number(n)) if name == "provider_id" => Ok(n.to_string()),
        _ => Err(ReceiptError::Malformed(format!(
            "missing or empty `{name}`"
        ))),
    };
    Ok(RawReceipt {
        provider_id: text("provider_id")?,
        status: text("status")?,
        timestamp: object
            .get("timestamp")
            .cloned()
            .ok_or_else(|| ReceiptError::Malformed("missing `timestamp`".to_owned()))?,
    })
}

/// The provider id of a receipt body, if it can be read: used only to route the receipt to a
/// partition (receipts of one message stay in order); the body itself is kept untouched.
pub fn routing_id(raw: &[u8]) -> Option<String> {
    decode(raw).ok().map(|r| r.provider_id)
}

/// The provider statuses Herald knows (SMPP delivery-receipt vocabulary), and what they mean.
pub fn known_status(status: &str) -> Option<MessageState> {
    match status.to_ascii_uppercase().as_str() {
        "ENROUTE" | "ACCEPTD" => Some(MessageState::Enroute),
        "DELIVRD" => Some(MessageState::Delivered),
        "UNDELIV" | "REJECTD" | "DELETED" => Some(MessageState::Undelivered),
        "EXPIRED" => Some(MessageState::Expired),
        _ => None,
    }
}

/// Maps a provider status, first through operator-configured aliases (`ACKD` → `DELIVRD`),
/// then through [`known_status`].
pub fn map_status(
    status: &str,
    aliases: &HashMap<String, String>,
) -> Result<MessageState, ReceiptError> {
    let status_upper = status.to_ascii_uppercase();
    let resolved = aliases
        .get(&status_upper)
        .map(String::as_str)
        .unwrap_or(&status_upper);
    known_status(resolved).ok_or_else(|| ReceiptError::UnknownStatus(status.to_owned()))
}

/// Parses a receipt timestamp, in UTC:
/// - a JSON number: Unix seconds;
/// - a string of exactly 10 digits: `yyMMddHHmm` (the SMPP receipt form, years 2000–2099);
/// - any other string: RFC 3339.
///
/// Anything else is an error. There is no fallback to the current time.
pub fn parse_timestamp(value: &Value) -> Result<DateTime<Utc>, ReceiptError> {
    let bad = || ReceiptError::BadTimestamp(value.to_string());
    match value {
        Value::Number(n) => {
            let seconds = n.as_i64().ok_or_else(bad)?;
            // 2000-01-01 to 2100-01-01: a receipt outside is a unit mix-up, not a date.
            if !(946_684_800..4_102_444_800).contains(&seconds) {
                return Err(bad());
            }
            Utc.timestamp_opt(seconds, 0).single().ok_or_else(bad)
        }
        Value::String(s) if s.len() == 10 && s.bytes().all(|b| b.is_ascii_digit()) => {
            let naive = NaiveDateTime::parse_from_str(&format!("20{s}"), "%Y%m%d%H%M")
                .map_err(|_| bad())?;
            Ok(Utc.from_utc_datetime(&naive))
        }
        Value::String(s) => DateTime::parse_from_rfc3339(s)
            .map(|t| t.with_timezone(&Utc))
            .map_err(|_| bad()),
        _ => Err(bad()),
    }
}

/// How coarse a timestamp [`parse_timestamp`] read is: the provider wrote the receipt up to
/// this long after the time it states (`YYMMDDhhmm` names a minute, Unix seconds and RFC 3339
/// without a fraction a second).
pub fn timestamp_resolution(value: &Value) -> std::time::Duration {
    match value {
        Value::String(s) if s.len() == 10 && s.bytes().all(|b| b.is_ascii_digit()) => {
            std::time::Duration::from_secs(60)
        }
        Value::String(s) if s.contains('.') => std::time::Duration::ZERO,
        _ => std::time::Duration::from_secs(1),
    }
}

/// Whether a state ends the delivery story (no later receipt is expected).
pub fn is_final(state: MessageState) -> bool {
    matches!(
        state,
        MessageState::Delivered | MessageState::Undelivered | MessageState::Expired
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_timestamp_form_parses_to_the_same_instant() {
        let expected = Utc.with_ymd_and_hms(2026, 12, 2, 15, 4, 0).unwrap();
        assert_eq!(
            parse_timestamp(&json!("2026-12-02T15:04:00Z")),
            Ok(expected)
        );
        assert_eq!(
            parse_timestamp(&json!("2026-12-02T16:04:00+01:00")),
            Ok(expected)
        );
        assert_eq!(parse_timestamp(&json!(expected.timestamp())), Ok(expected));
        assert_eq!(parse_timestamp(&json!("2612021504")), Ok(expected));
    }

    #[test]
    fn malformed_timestamps_are_errors_never_now() {
        for bad in [
            json!("yesterday"),
            json!("2613021504"), // month 13
            json!("2612321504"), // day 32
            json!("261202150"),  // 9 digits
            json!(""),
            json!(null),
            json!(1.5),
            json!(17),               // 1970: a unit mix-up
            json!(1764687845000i64), // milliseconds
            json!({"t": 1}),
        ] {
            assert!(parse_timestamp(&bad).is_err(), "{bad} parsed");
        }
    }

    /// Seeded random strings never parse into a time near now (no hidden `now()` fallback).
    #[test]
    fn random_garbage_never_becomes_the_current_time() {
        let seed = 0x5eed_u64;
        let mut state = seed;
        let now = Utc::now();
        for _ in 0..5000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let len = (state % 14) as usize;
            let text: String = (0..len)
                .map(|i| (b'0' + ((state >> (i * 4)) % 43) as u8) as char)
                .collect();
            if let Ok(t) = parse_timestamp(&json!(text)) {
                assert!(
                    (t - now).num_seconds().abs() > 60,
                    "seed {seed}: {text:?} parsed as now"
                );
            }
        }
    }

    #[test]
    fn statuses_map_or_are_refused() {
        let none = HashMap::new();
        assert_eq!(map_status("DELIVRD", &none), Ok(MessageState::Delivered));
        assert_eq!(map_status("enroute", &none), Ok(MessageState::Enroute));
        assert_eq!(map_status("UNDELIV", &none), Ok(MessageState::Undelivered));
        assert_eq!(map_status("EXPIRED", &none), Ok(MessageState::Expired));
        assert!(matches!(
            map_status("ACKD", &none),
            Err(ReceiptError::UnknownStatus(_))
        ));
        let aliases = HashMap::from([("ACKD".to_owned(), "DELIVRD".to_owned())]);
        assert_eq!(map_status("ackd", &aliases), Ok(MessageState::Delivered));
    }

    #[test]
    fn decode_requires_every_field() {
        let ok =
            decode(br#"{"provider_id":"17","status":"DELIVRD","timestamp":"2612021504"}"#).unwrap();
        assert_eq!(ok.provider_id, "17");
        assert!(decode(b"not json").is_err());
        assert!(decode(br#"{"status":"DELIVRD","timestamp":1}"#).is_err());
        assert!(decode(br#"{"provider_id":"1","timestamp":1}"#).is_err());
        assert!(decode(br#"{"provider_id":"1","status":"DELIVRD"}"#).is_err());
        assert_eq!(
            routing_id(br#"{"provider_id":5,"status":"x","timestamp":1}"#),
            Some("5".to_owned())
        );
    }

    #[test]
    fn a_timestamp_names_a_moment_no_finer_than_its_format() {
        use std::time::Duration;
        let resolution = |v: Value| timestamp_resolution(&v);
        assert_eq!(resolution(json!("2612021504")), Duration::from_secs(60));
        assert_eq!(resolution(json!(1_796_000_000)), Duration::from_secs(1));
        assert_eq!(
            resolution(json!("2026-12-02T15:04:05Z")),
            Duration::from_secs(1)
        );
        assert_eq!(
            resolution(json!("2026-12-02T15:04:05.123Z")),
            Duration::ZERO
        );
    }
}
