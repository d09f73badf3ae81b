//! Turning request bytes into validated messages, naming the field of every problem.
//!
//! A body is parsed straight into its wire type (`wire.rs`: the structs the OpenAPI
//! document is generated from), with the path of the value that did not fit
//! (`messages[3].recipient`) taken from the parser; what a type cannot say (lengths, empty
//! text, a null body, NUL characters PostgreSQL cannot store, key syntax) is checked on the
//! parsed struct, naming its field the same way.
//!
//! Longer than 400 lines with its unit tests (the code is about 235).

use herald_core::{partition_of, PartitionCount};
use herald_store::accept::{fingerprint, NewMessage};
use serde::de::DeserializeOwned;
use serde_json::error::Category;
use serde_json::Value;
use uuid::Uuid;

use crate::problem::Problem;
use crate::wire::{BatchItem, ObjectOnly, SendRequest};

pub const MAX_RECIPIENT_CHARS: usize = 320;
pub const MAX_KEY_CHARS: usize = 255;

/// Parses a body, a JSON object, into its wire type. Bytes that are not JSON are a 400 with
/// the position; JSON that does not fit the type is a 422 naming the field by its path.
pub fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, Problem> {
    let mut parser = serde_json::Deserializer::from_slice(bytes);
    let ObjectOnly(parsed) =
        serde_path_to_error::deserialize(&mut parser).map_err(|err| problem_of(&err))?;
    // Anything after the value (`{…} x`) is not JSON either.
    parser
        .end()
        .map_err(|err| Problem::malformed_json(err.to_string()))?;
    Ok(parsed)
}

/// The problem for a value that did not parse. The parser names a missing field only in its
/// message and reports it at the object that lacks it; the field's own path is that object's
/// path and the name.
fn problem_of(err: &serde_path_to_error::Error<serde_json::Error>) -> Problem {
    let inner = err.inner();
    if inner.classify() != Category::Data {
        return Problem::malformed_json(inner.to_string());
    }
    let message = inner.to_string();
    let at = path_of(err.path());
    if let Some(name) = message
        .strip_prefix("missing field `")
        .and_then(|rest| rest.split('`').next())
    {
        let field = join(&at, name);
        return Problem::invalid_field(&field, format!("`{field}` is required"));
    }
    if message.starts_with("unknown field `") {
        // The path already ends with the unknown key.
        return Problem::invalid_field(
            &at,
            message.replacen(
                &format!("`{}`", at.rsplit('.').next().unwrap_or(&at)),
                &format!("`{at}`"),
                1,
            ),
        );
    }
    Problem::invalid_field(&at, format!("{}: {message}", display(&at)))
}

/// A parser path as a field name: `messages[3].recipient`, `$` for the body itself.
fn path_of(path: &serde_path_to_error::Path) -> String {
    let text = path.to_string();
    if text == "." {
        "$".to_owned()
    } else {
        text
    }
}

fn join(parent: &str, name: &str) -> String {
    if parent == "$" {
        name.to_owned()
    } else {
        format!("{parent}.{name}")
    }
}

/// Where a message sits in its request: the body itself, or the batch item at an index. A
/// field's name is made from it only when there is a problem to name, not for every message.
#[derive(Debug, Clone, Copy)]
pub(crate) enum At {
    Body,
    Item(usize),
}

impl At {
    /// `recipient` for a single message, `messages[3].recipient` for a batch item.
    pub(crate) fn field(self, name: &str) -> String {
        match self {
            At::Body => name.to_owned(),
            At::Item(index) => format!("messages[{index}].{name}"),
        }
    }
}

/// Validates a single message (`POST /v1/messages`); its key comes from the header.
pub fn send_request(
    request: SendRequest,
    idempotency_key: Option<String>,
    partitions: PartitionCount,
) -> Result<NewMessage, Problem> {
    new_message(
        At::Body,
        request.recipient,
        request.body,
        request.partition_key,
        idempotency_key,
        partitions,
    )
}

/// Validates the batch item at `index`; its key is its own `idempotency_key` field.
pub fn batch_item(
    item: BatchItem,
    index: usize,
    partitions: PartitionCount,
) -> Result<NewMessage, Problem> {
    new_message(
        At::Item(index),
        item.recipient,
        item.body,
        item.partition_key,
        item.idempotency_key,
        partitions,
    )
}

fn new_message(
    at: At,
    recipient: String,
    body: Value,
    partition_key: Option<String>,
    idempotency_key: Option<String>,
    partitions: PartitionCount,
) -> Result<NewMessage, Problem> {
    check_text(at, "recipient", &recipient, MAX_RECIPIENT_CHARS)?;
    if body.is_null() {
        let field = at.field("body");
        return Err(Problem::invalid_field(
            &field,
            format!("`{field}` must not be null"),
        ));
    }
    if let Some(inner) = nul_in(&body) {
        let field = format!("{}{inner}", at.field("body"));
        return Err(Problem::invalid_field(
            &field,
            format!("`{field}` contains a NUL character (\\u0000), which cannot be stored"),
        ));
    }
    if let Some(key) = &partition_key {
        check_text(at, "partition_key", key, MAX_KEY_CHARS)?;
    }
    if let Some(key) = &idempotency_key {
        check_key(key)
            .map_err(|detail| Problem::invalid_field(at.field("idempotency_key"), detail))?;
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

/// Text that must not be blank, must fit `max_chars`, and must not hold a NUL character.
fn check_text(at: At, name: &str, text: &str, max_chars: usize) -> Result<(), Problem> {
    let field = || at.field(name);
    let detail = if text.trim().is_empty() {
        format!("`{}` must not be empty", field())
    } else if text.contains('\0') {
        format!(
            "`{}` contains a NUL character (\\u0000), which cannot be stored",
            field()
        )
    } else if text.chars().count() > max_chars {
        format!("`{}` is longer than {max_chars} characters", field())
    } else {
        return Ok(());
    };
    Err(Problem::invalid_field(field(), detail))
}

/// The path below `value` (`.parts[1]`, `` for the value itself) of the first string or
/// object key that holds a NUL character: PostgreSQL's text and jsonb cannot store one, so
/// such a request can never succeed. The path is made only for a value that holds one.
fn nul_in(value: &Value) -> Option<String> {
    match value {
        Value::String(text) if text.contains('\0') => Some(String::new()),
        Value::Array(items) => items
            .iter()
            .enumerate()
            .find_map(|(i, item)| nul_in(item).map(|below| format!("[{i}]{below}"))),
        Value::Object(fields) => fields.iter().find_map(|(key, item)| {
            if key.contains('\0') {
                Some(format!(".{key}"))
            } else {
                nul_in(item).map(|below| format!(".{key}{below}"))
            }
        }),
        _ => None,
    }
}

fn display(field: &str) -> String {
    if field == "$" {
        "the request body".to_owned()
    } else {
        format!("`{field}`")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::BatchRequest;

    fn p() -> PartitionCount {
        PartitionCount::new(8).unwrap()
    }

    /// The field a single message's body is refused for (parse or check).
    fn single(body: &str) -> Problem {
        parse::<SendRequest>(body.as_bytes())
            .and_then(|request| send_request(request, None, p()))
            .unwrap_err()
    }

    fn batch(body: &str) -> Problem {
        parse::<BatchRequest>(body.as_bytes())
            .and_then(|request| {
                request
                    .messages
                    .into_iter()
                    .enumerate()
                    .map(|(i, item)| batch_item(item, i, p()))
                    .collect::<Result<Vec<_>, _>>()
            })
            .unwrap_err()
    }

    fn field(problem: &Problem) -> &str {
        problem.field.as_deref().unwrap_or_default()
    }

    #[test]
    fn names_the_missing_field_by_its_path() {
        let err = single(r#"{"body": {}}"#);
        assert_eq!((err.status, field(&err)), (422, "recipient"));
        assert_eq!(err.detail, "`recipient` is required");
        let err = batch(r#"{"messages": [{"recipient": "a", "body": 1}, {"recipient": "a"}]}"#);
        assert_eq!(field(&err), "messages[1].body");
        assert_eq!(err.detail, "`messages[1].body` is required");
        assert_eq!(field(&batch("{}")), "messages");
    }

    #[test]
    fn names_wrong_types_and_unknown_fields_by_their_path() {
        let err = single(r#"{"recipient": 5, "body": 1}"#);
        assert_eq!(field(&err), "recipient");
        assert!(
            err.detail
                .starts_with("`recipient`: invalid type: integer `5`, expected a string"),
            "{}",
            err.detail
        );
        let err = single(r#"{"recipient": "a", "body": 1, "recipent": 1}"#);
        assert_eq!(field(&err), "recipent");
        assert!(
            err.detail
                .starts_with("unknown field `recipent`, expected one of"),
            "{}",
            err.detail
        );
        let err = batch(r#"{"messages": [{"recipient": "a", "body": 1, "key": "k"}]}"#);
        assert_eq!(field(&err), "messages[0].key");
        assert!(
            err.detail
                .starts_with("unknown field `messages[0].key`, expected one of `recipient`"),
            "{}",
            err.detail
        );
        let err = batch(r#"{"messages": [{"recipient": "a", "body": 1}], "extra": 1}"#);
        assert_eq!(field(&err), "extra");
        let err = batch(r#"{"messages": {"recipient": "a"}}"#);
        assert_eq!(field(&err), "messages");
        let err = batch(r#"{"messages": [1]}"#);
        assert_eq!(field(&err), "messages[0]");
        assert!(
            err.detail.contains("expected a JSON object"),
            "{}",
            err.detail
        );
        let err = single("[1]");
        assert_eq!(field(&err), "$");
        assert!(
            err.detail
                .starts_with("the request body: invalid type: sequence, expected a JSON object"),
            "{}",
            err.detail
        );
        assert_eq!(field(&single(r#"["a", 1]"#)), "$");
        assert_eq!(field(&batch(r#"{"messages": [["a", 1]]}"#)), "messages[0]");
        let err = single(r#"{"recipient": "a", "body": 1, "partition_key": 5}"#);
        assert_eq!(field(&err), "partition_key");
    }

    #[test]
    fn text_that_is_not_json_is_a_400_with_the_position() {
        for body in [
            r#"{"recipient": "a", "#,
            "",
            r#"{"recipient": "a", "body": 1} x"#,
        ] {
            let err = single(body);
            assert_eq!(err.status, 400, "{body}");
            assert!(err.field.is_none());
            assert!(err.detail.contains("line 1 column"), "{}", err.detail);
        }
    }

    #[test]
    fn checks_what_the_types_cannot_say() {
        let err = single(r#"{"recipient": "  ", "body": 1}"#);
        assert_eq!(
            (field(&err), err.detail.as_str()),
            ("recipient", "`recipient` must not be empty")
        );
        let err = single(&format!(
            r#"{{"recipient": "{}", "body": 1}}"#,
            "r".repeat(321)
        ));
        assert_eq!(field(&err), "recipient");
        assert!(err.detail.contains("longer than 320"));
        let err = single(r#"{"recipient": "a", "body": null}"#);
        assert_eq!(
            (field(&err), err.detail.as_str()),
            ("body", "`body` must not be null")
        );
        let err = batch(
            r#"{"messages": [{"recipient": "a", "body": 1, "idempotency_key": "has space"}]}"#,
        );
        assert_eq!(field(&err), "messages[0].idempotency_key");
        let err = batch(r#"{"messages": [{"recipient": "a", "body": 1, "partition_key": ""}]}"#);
        assert_eq!(field(&err), "messages[0].partition_key");
        assert!(check_key("ok-key_1").is_ok());
        assert!(check_key("has space").is_err());
        assert!(check_key("").is_err());
    }

    #[test]
    fn refuses_text_postgres_cannot_store_naming_the_field() {
        let err = single(r#"{"recipient": "a\u0000b", "body": 1}"#);
        assert_eq!((err.status, field(&err)), (422, "recipient"));
        assert!(err.detail.contains("NUL"));
        let err = batch(
            r#"{"messages": [{"recipient": "a", "body": 1}, {"recipient": "a", "body": {"text": "ok", "parts": ["x", "y\u0000"]}}]}"#,
        );
        assert_eq!(field(&err), "messages[1].body.parts[1]");
        assert_eq!(
            field(&single(r#"{"recipient": "a", "body": {"k\u0000": 1}}"#)),
            "body.k\u{0}"
        );
        assert_eq!(
            field(&single(r#"{"recipient": "a", "body": "\u0000"}"#)),
            "body"
        );
        // Other control characters are stored as they came.
        let request = parse::<SendRequest>(br#"{"recipient": "a", "body": "\u0001"}"#).unwrap();
        assert!(send_request(request, None, p()).is_ok());
    }

    #[test]
    fn partition_key_defaults_to_recipient() {
        let message = |body: &str| {
            send_request(parse::<SendRequest>(body.as_bytes()).unwrap(), None, p()).unwrap()
        };
        let a = message(r#"{"recipient": "r1", "body": "x"}"#);
        let b = message(r#"{"recipient": "r2", "body": "x", "partition_key": "r1"}"#);
        assert_eq!(a.partition, b.partition);
        assert_ne!(a.fingerprint, b.fingerprint);
    }
}
