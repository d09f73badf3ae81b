//! Turning request bytes into validated messages, naming the field of every problem.

use herald_core::{partition_of, PartitionCount};
use herald_store::accept::{fingerprint, NewMessage};
use serde_json::{Map, Value};
use uuid::Uuid;

use crate::problem::Problem;

pub const MAX_RECIPIENT_CHARS: usize = 320;
pub const MAX_KEY_CHARS: usize = 255;

/// Parses the body as JSON; a syntax error is a 400 with the position.
pub fn parse_json(bytes: &[u8]) -> Result<Value, Problem> {
    serde_json::from_slice(bytes).map_err(|err| Problem::malformed_json(err.to_string()))
}

/// Validates one message object; `path` prefixes field names (`messages[3].`).
pub fn message(
    value: &Value,
    path: &str,
    idempotency_key: Option<String>,
    allow_key_field: bool,
    partitions: PartitionCount,
) -> Result<NewMessage, Problem> {
    let object = value.as_object().ok_or_else(|| {
        Problem::invalid_field(
            trim_dot(path),
            format!("{} must be a JSON object", display(path)),
        )
    })?;
    let mut known = vec!["recipient", "body", "partition_key"];
    if allow_key_field {
        known.push("idempotency_key");
    }
    if let Some(unknown) = object.keys().find(|k| !known.contains(&k.as_str())) {
        return Err(Problem::invalid_field(
            format!("{path}{unknown}"),
            format!(
                "unknown field `{path}{unknown}` (known: {})",
                known.join(", ")
            ),
        ));
    }
    let recipient = required_string(object, path, "recipient", MAX_RECIPIENT_CHARS)?;
    let body = match object.get("body") {
        None => return Err(missing(path, "body")),
        Some(Value::Null) => {
            return Err(Problem::invalid_field(
                format!("{path}body"),
                format!("`{path}body` must not be null"),
            ))
        }
        Some(body) => body.clone(),
    };
    if let Some(field) = nul_in(&body, &format!("{path}body")) {
        return Err(Problem::invalid_field(
            &field,
            format!("`{field}` contains a NUL character (\\u0000), which cannot be stored"),
        ));
    }
    let partition_key = optional_string(object, path, "partition_key", MAX_KEY_CHARS)?;
    let idempotency_key = match idempotency_key {
        Some(key) => Some(key),
        None if allow_key_field => optional_string(object, path, "idempotency_key", MAX_KEY_CHARS)?,
        None => None,
    };
    if let Some(key) = &idempotency_key {
        check_key(key)
            .map_err(|detail| Problem::invalid_field(format!("{path}idempotency_key"), detail))?;
    }
    let routing = partition_key.as_deref().unwrap_or(&recipient);
    Ok(NewMessage {
        id: Uuid::now_v7(),
        partition: partition_of(routing, partitions),
        fingerprint: fingerprint(&recipient, partition_key.as_deref(), &body),
        recipient,
        body,
        idempotency_key,
        created_by: None,
    })
}

/// An idempotency key: 1 to 255 visible ASCII characters.
pub fn check_key(key: &str) -> Result<(), String> {
    if key.is_empty() || key.len() > MAX_KEY_CHARS {
        return Err(format!(
            "an idempotency key has 1 to {MAX_KEY_CHARS} characters"
        ));
    }
    if !key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err("an idempotency key has only visible ASCII characters".to_owned());
    }
    Ok(())
}

fn required_string(
    object: &Map<String, Value>,
    path: &str,
    name: &str,
    max_chars: usize,
) -> Result<String, Problem> {
    optional_string(object, path, name, max_chars)?.ok_or_else(|| missing(path, name))
}

fn optional_string(
    object: &Map<String, Value>,
    path: &str,
    name: &str,
    max_chars: usize,
) -> Result<Option<String>, Problem> {
    let field = format!("{path}{name}");
    match object.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => {
            if text.trim().is_empty() {
                Err(Problem::invalid_field(
                    &field,
                    format!("`{field}` must not be empty"),
                ))
            } else if text.contains('\0') {
                Err(Problem::invalid_field(
                    &field,
                    format!("`{field}` contains a NUL character (\\u0000), which cannot be stored"),
                ))
            } else if text.chars().count() > max_chars {
                Err(Problem::invalid_field(
                    &field,
                    format!("`{field}` is longer than {max_chars} characters"),
                ))
            } else {
                Ok(Some(text.clone()))
            }
        }
        Some(other) => Err(Problem::invalid_field(
            &field,
            format!("`{field}` must be a string, got {}", kind(other)),
        )),
    }
}

/// The path of the first string or object key under `value` that holds a NUL character:
/// PostgreSQL's text and jsonb cannot store one, so such a request can never succeed.
fn nul_in(value: &Value, path: &str) -> Option<String> {
    match value {
        Value::String(text) if text.contains('\0') => Some(path.to_owned()),
        Value::Array(items) => items
            .iter()
            .enumerate()
            .find_map(|(i, item)| nul_in(item, &format!("{path}[{i}]"))),
        Value::Object(fields) => fields.iter().find_map(|(key, item)| {
            let inner = format!("{path}.{key}");
            if key.contains('\0') {
                Some(inner)
            } else {
                nul_in(item, &inner)
            }
        }),
        _ => None,
    }
}

fn missing(path: &str, name: &str) -> Problem {
    Problem::invalid_field(
        format!("{path}{name}"),
        format!("`{path}{name}` is required"),
    )
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn trim_dot(path: &str) -> String {
    let trimmed = path.trim_end_matches('.');
    if trimmed.is_empty() {
        "$".to_owned()
    } else {
        trimmed.to_owned()
    }
}

fn display(path: &str) -> String {
    let trimmed = trim_dot(path);
    if trimmed == "$" {
        "the request body".to_owned()
    } else {
        format!("`{trimmed}`")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn p() -> PartitionCount {
        PartitionCount::new(8).unwrap()
    }

    #[test]
    fn names_the_missing_field() {
        let err = message(&json!({"body": {}}), "", None, false, p()).unwrap_err();
        assert_eq!(err.field.as_deref(), Some("recipient"));
        let err = message(&json!({"recipient": "a"}), "messages[2].", None, true, p()).unwrap_err();
        assert_eq!(err.field.as_deref(), Some("messages[2].body"));
    }

    #[test]
    fn rejects_wrong_types_unknown_fields_and_bad_keys() {
        let err = message(&json!({"recipient": 5, "body": 1}), "", None, false, p()).unwrap_err();
        assert_eq!(err.field.as_deref(), Some("recipient"));
        let err = message(
            &json!({"recipient": "a", "body": 1, "recipent": 1}),
            "",
            None,
            false,
            p(),
        )
        .unwrap_err();
        assert_eq!(err.field.as_deref(), Some("recipent"));
        let err = message(&json!([1]), "", None, false, p()).unwrap_err();
        assert_eq!(err.field.as_deref(), Some("$"));
        assert!(check_key("ok-key_1").is_ok());
        assert!(check_key("has space").is_err());
        assert!(check_key("").is_err());
    }

    #[test]
    fn refuses_text_postgres_cannot_store_naming_the_field() {
        let err = message(
            &json!({"recipient": "a\u{0}b", "body": 1}),
            "",
            None,
            false,
            p(),
        )
        .unwrap_err();
        assert_eq!(err.field.as_deref(), Some("recipient"));
        let body = json!({"recipient": "a", "body": {"text": "ok", "parts": ["x", "y\u{0}"]}});
        let err = message(&body, "messages[1].", None, true, p()).unwrap_err();
        assert_eq!(err.field.as_deref(), Some("messages[1].body.parts[1]"));
        let err = message(
            &json!({"recipient": "a", "body": {"k\u{0}": 1}}),
            "",
            None,
            false,
            p(),
        )
        .unwrap_err();
        assert_eq!(err.field.as_deref(), Some("body.k\u{0}"));
        let err = message(
            &json!({"recipient": "a", "body": "\u{0}"}),
            "",
            None,
            false,
            p(),
        )
        .unwrap_err();
        assert_eq!(err.field.as_deref(), Some("body"));
        assert_eq!(err.status, 422);
        // Other control characters are stored as they came.
        assert!(message(
            &json!({"recipient": "a", "body": "\u{1}"}),
            "",
            None,
            false,
            p()
        )
        .is_ok());
    }

    #[test]
    fn partition_key_defaults_to_recipient() {
        let a = message(
            &json!({"recipient": "r1", "body": "x"}),
            "",
            None,
            false,
            p(),
        )
        .unwrap();
        let b = message(
            &json!({"recipient": "r2", "body": "x", "partition_key": "r1"}),
            "",
            None,
            false,
            p(),
        )
        .unwrap();
        assert_eq!(a.partition, b.partition);
        assert_ne!(a.fingerprint, b.fingerprint);
    }
}
