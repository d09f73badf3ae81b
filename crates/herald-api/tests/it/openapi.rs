//! The OpenAPI document: the committed file is the generated one, the API serves it, every
//! route is in it, and real answers — successes and problems — validate against the schema it
//! documents for their path, method and status.

use serde_json::{json, Value};

use crate::TestApi;

const COMMITTED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/openapi.json");

#[test]
fn the_committed_document_is_the_generated_one() {
    let generated = herald_api::openapi::pretty_json();
    if std::env::var_os("HERALD_WRITE_OPENAPI").is_some() {
        std::fs::write(COMMITTED, &generated).unwrap();
    }
    let committed = std::fs::read_to_string(COMMITTED).unwrap_or_default();
    assert!(
        committed == generated,
        "docs/openapi.json is not the generated document: regenerate it with \
         HERALD_WRITE_OPENAPI=1 cargo test -p herald-api openapi"
    );
}

/// Validates `body` against the schema `document` gives for `path`, `method` and `status`.
fn assert_documented(document: &Value, path: &str, method: &str, status: u16, body: &Value) {
    let errors = schema_errors(document, path, method, status, body);
    assert!(
        errors.is_empty(),
        "{method} {path} {status}: {errors:?}\n{body}"
    );
}

fn schema_errors(
    document: &Value,
    path: &str,
    method: &str,
    status: u16,
    body: &Value,
) -> Vec<String> {
    let operation = &document["paths"][path][method];
    assert!(
        operation.is_object(),
        "{method} {path} is not in the document"
    );
    let response = &operation["responses"][status.to_string()];
    assert!(
        response.is_object(),
        "{method} {path} does not document {status}: {body}"
    );
    let content = response["content"].as_object().expect("a documented body");
    let schema = &content.values().next().unwrap()["schema"];
    // The response's schema, with the document's components for its $refs.
    let root = json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "components": document["components"],
        "allOf": [schema],
    });
    let validator = jsonschema::validator_for(&root).expect("a valid schema");
    validator.iter_errors(body).map(|e| e.to_string()).collect()
}

#[tokio::test]
async fn real_answers_validate_against_the_served_document() {
    let api = TestApi::default().await;
    let response = api.get("/v1/openapi.json").send().await.unwrap();
    assert_eq!(response.status(), 200);
    let document: Value = response.json().await.unwrap();
    assert_eq!(
        document,
        serde_json::from_str::<Value>(&herald_api::openapi::pretty_json()).unwrap()
    );
    assert!(
        document["openapi"].as_str().unwrap().starts_with("3.1"),
        "{}",
        document["openapi"]
    );
    for path in [
        "/v1/messages",
        "/v1/messages/batch",
        "/v1/messages/{id}",
        "/v1/partitions",
        "/v1/dead",
        "/v1/dead/{id}/redrive",
        "/v1/parking",
        "/v1/parking/{id}/replay",
        "/v1/providers/{gateway}/receipts",
        "/v1/providers/{gateway}/receipts/batch",
    ] {
        assert!(
            document["paths"][path].is_object(),
            "{path} is not documented"
        );
    }

    let mut seen = 0;
    let mut check = |path: &str, method: &str, status: u16, body: &Value| {
        assert_documented(&document, path, method, status, body);
        seen += 1;
    };
    let message = json!({"recipient": "+15550100", "body": {"text": "hi"}});
    let send = |key: &'static str| {
        api.post("/v1/messages")
            .header("Idempotency-Key", key)
            .json(&message)
            .send()
    };
    let first = send("k-1").await.unwrap();
    assert_eq!(first.status(), 202);
    let first: Value = first.json().await.unwrap();
    check("/v1/messages", "post", 202, &first);
    let replay = send("k-1").await.unwrap();
    assert_eq!(replay.status(), 202);
    check("/v1/messages", "post", 202, &replay.json().await.unwrap());
    let conflict = api
        .post("/v1/messages")
        .header("Idempotency-Key", "k-1")
        .json(&json!({"recipient": "+15550199", "body": {}}))
        .send()
        .await
        .unwrap();
    assert_eq!(conflict.status(), 409);
    check("/v1/messages", "post", 409, &conflict.json().await.unwrap());
    let invalid = api
        .post("/v1/messages")
        .json(&json!({"body": {}}))
        .send()
        .await
        .unwrap();
    assert_eq!(invalid.status(), 422);
    check("/v1/messages", "post", 422, &invalid.json().await.unwrap());

    let batch = api
        .post("/v1/messages/batch")
        .json(&json!({"messages": [message, {"recipient": "b", "body": {"n": 2}, "idempotency_key": "b-1"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(batch.status(), 202);
    check(
        "/v1/messages/batch",
        "post",
        202,
        &batch.json().await.unwrap(),
    );

    let id = first["id"].as_str().unwrap();
    let history = api.get(&format!("/v1/messages/{id}")).send().await.unwrap();
    assert_eq!(history.status(), 200);
    check(
        "/v1/messages/{id}",
        "get",
        200,
        &history.json().await.unwrap(),
    );
    let missing = api
        .get("/v1/messages/00000000-0000-7000-8000-000000000000")
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);
    check(
        "/v1/messages/{id}",
        "get",
        404,
        &missing.json().await.unwrap(),
    );
    let bad_id = api.get("/v1/messages/nope").send().await.unwrap();
    assert_eq!(bad_id.status(), 400);
    check(
        "/v1/messages/{id}",
        "get",
        400,
        &bad_id.json().await.unwrap(),
    );

    for path in ["/v1/partitions", "/v1/dead", "/v1/parking"] {
        let answer = api.get(&format!("{path}?limit=1")).send().await.unwrap();
        assert_eq!(answer.status(), 200, "{path}");
        check(path, "get", 200, &answer.json().await.unwrap());
    }
    let bad_page = api.get("/v1/dead?after=x").send().await.unwrap();
    assert_eq!(bad_page.status(), 400);
    check("/v1/dead", "get", 400, &bad_page.json().await.unwrap());
    let no_row = api.post("/v1/dead/42/redrive").send().await.unwrap();
    assert_eq!(no_row.status(), 404);
    check(
        "/v1/dead/{id}/redrive",
        "post",
        404,
        &no_row.json().await.unwrap(),
    );
    let no_item = api.post("/v1/parking/42/replay").send().await.unwrap();
    assert_eq!(no_item.status(), 404);
    check(
        "/v1/parking/{id}/replay",
        "post",
        404,
        &no_item.json().await.unwrap(),
    );

    // A development run takes receipts unsigned; an unknown status is parked, not refused.
    let receipt = api
        .post("/v1/providers/gw-a/receipts")
        .json(&json!({"message_id": "p-1", "status": "DELIVRD"}))
        .send()
        .await
        .unwrap();
    assert_eq!(receipt.status(), 202);
    check(
        "/v1/providers/{gateway}/receipts",
        "post",
        202,
        &receipt.json().await.unwrap(),
    );
    let receipts = api
        .post("/v1/providers/gw-a/receipts/batch")
        .json(&json!([{"message_id": "p-2", "status": "DELIVRD"}, {"message_id": "p-3"}]))
        .send()
        .await
        .unwrap();
    assert_eq!(receipts.status(), 202);
    check(
        "/v1/providers/{gateway}/receipts/batch",
        "post",
        202,
        &receipts.json().await.unwrap(),
    );
    let not_array = api
        .post("/v1/providers/gw-a/receipts/batch")
        .json(&json!({"not": "an array"}))
        .send()
        .await
        .unwrap();
    assert_eq!(not_array.status(), 400);
    check(
        "/v1/providers/{gateway}/receipts/batch",
        "post",
        400,
        &not_array.json().await.unwrap(),
    );
    assert_eq!(seen, 17);
    // The check can fail: an accept's answer is not a message's history, nor a problem.
    assert!(!schema_errors(&document, "/v1/messages/{id}", "get", 200, &first).is_empty());
    assert!(!schema_errors(&document, "/v1/messages/{id}", "get", 404, &first).is_empty());
}
