use herald_api::Limits;
use serde_json::json;

use crate::{assert_problem, TestApi};

#[tokio::test]
async fn every_bad_request_gets_a_problem_naming_the_field_and_writes_nothing() {
    let api = TestApi::with_limits(Limits {
        max_body_bytes: 4096,
        max_batch: 10,
        ..Limits::default()
    })
    .await;
    let raw = |body: &'static str| {
        api.post("/v1/messages")
            .header("content-type", "application/json")
            .body(body)
            .send()
    };

    let response = raw("{\"recipient\": \"a\", ").await.unwrap();
    let problem = assert_problem(response, 400, None).await;
    assert_eq!(problem["type"], "urn:herald:problem:malformed-json");

    assert_problem(raw("{\"body\": {}}").await.unwrap(), 422, Some("recipient")).await;
    assert_problem(
        raw("{\"recipient\": \"a\"}").await.unwrap(),
        422,
        Some("body"),
    )
    .await;
    assert_problem(
        raw("{\"recipient\": \"a\", \"body\": null}").await.unwrap(),
        422,
        Some("body"),
    )
    .await;
    assert_problem(
        raw("{\"recipient\": 7, \"body\": 1}").await.unwrap(),
        422,
        Some("recipient"),
    )
    .await;
    assert_problem(
        raw("{\"recipient\": \"  \", \"body\": 1}").await.unwrap(),
        422,
        Some("recipient"),
    )
    .await;
    assert_problem(
        raw("{\"recipient\": \"a\", \"body\": 1, \"partition_key\": 5}")
            .await
            .unwrap(),
        422,
        Some("partition_key"),
    )
    .await;
    assert_problem(
        raw("{\"recipient\": \"a\", \"body\": 1, \"recipent\": \"typo\"}")
            .await
            .unwrap(),
        422,
        Some("recipent"),
    )
    .await;
    assert_problem(raw("[1, 2]").await.unwrap(), 422, Some("$")).await;

    // Text PostgreSQL cannot hold is the client's problem, not an outage: a 422 naming it.
    let nul = raw("{\"recipient\": \"a\\u0000b\", \"body\": 1}")
        .await
        .unwrap();
    let problem = assert_problem(nul, 422, Some("recipient")).await;
    assert!(problem["detail"].as_str().unwrap().contains("NUL"));
    assert_problem(
        raw("{\"recipient\": \"a\", \"body\": {\"text\": \"x\\u0000\"}}")
            .await
            .unwrap(),
        422,
        Some("body.text"),
    )
    .await;
    let response = api
        .post("/v1/messages/batch")
        .header("content-type", "application/json")
        .body("{\"messages\": [{\"recipient\": \"a\", \"body\": 1}, {\"recipient\": \"b\", \"body\": [\"\\u0000\"]}]}")
        .send()
        .await
        .unwrap();
    assert_problem(response, 422, Some("messages[1].body[0]")).await;

    // Oversize: declared and streamed (no Content-Length).
    let big = json!({"recipient": "a", "body": "x".repeat(5000)});
    let response = api.post("/v1/messages").json(&big).send().await.unwrap();
    assert_problem(response, 413, None).await;
    let chunks = futures_stream(big.to_string());
    let response = api
        .post("/v1/messages")
        .header("content-type", "application/json")
        .body(reqwest::Body::wrap_stream(chunks))
        .send()
        .await
        .unwrap();
    assert_problem(response, 413, None).await;

    let response = api
        .post("/v1/messages")
        .header("content-type", "text/plain")
        .body("{\"recipient\": \"a\", \"body\": 1}")
        .send()
        .await
        .unwrap();
    assert_problem(response, 415, Some("Content-Type")).await;

    let response = api
        .post("/v1/messages")
        .header("Idempotency-Key", "has spaces in it")
        .json(&json!({"recipient": "a", "body": 1}))
        .send()
        .await
        .unwrap();
    assert_problem(response, 400, Some("Idempotency-Key")).await;

    let eleven: Vec<_> = (0..11)
        .map(|i| json!({"recipient": format!("r{i}"), "body": i}))
        .collect();
    let response = api
        .post("/v1/messages/batch")
        .json(&json!({ "messages": eleven }))
        .send()
        .await
        .unwrap();
    assert_problem(response, 422, Some("messages")).await;
    let response = api
        .post("/v1/messages/batch")
        .json(&json!({ "messages": [] }))
        .send()
        .await
        .unwrap();
    assert_problem(response, 422, Some("messages")).await;
    let response = api
        .post("/v1/messages/batch")
        .json(&json!({ "items": [] }))
        .send()
        .await
        .unwrap();
    // The field that is there and should not be, with the one that was meant.
    let problem = assert_problem(response, 422, Some("items")).await;
    assert!(problem["detail"]
        .as_str()
        .unwrap()
        .contains("unknown field `items`, expected `messages`"));
    let response = api
        .post("/v1/messages/batch")
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_problem(response, 422, Some("messages")).await;
    // A message is an object; serde's positional form of a struct is not taken.
    let response = api
        .post("/v1/messages/batch")
        .json(&json!({ "messages": [["+15550100", "hi"]] }))
        .send()
        .await
        .unwrap();
    assert_problem(response, 422, Some("messages[0]")).await;
    let response = api
        .post("/v1/messages/batch")
        .json(&json!({ "messages": [{"recipient": "a", "body": 1}, {"recipient": ["a"], "body": 1}] }))
        .send()
        .await
        .unwrap();
    assert_problem(response, 422, Some("messages[1].recipient")).await;

    let response = api.get("/v1/messages/not-a-uuid").send().await.unwrap();
    assert_problem(response, 400, Some("id")).await;
    let response = api
        .get(&format!("/v1/messages/{}", uuid::Uuid::now_v7()))
        .send()
        .await
        .unwrap();
    assert_problem(response, 404, None).await;

    assert_eq!(api.rows().await, (0, 0, 0));
}

/// The body in small chunks, so the server sees no Content-Length.
fn futures_stream(text: String) -> impl futures::Stream<Item = Result<Vec<u8>, std::io::Error>> {
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> = text
        .into_bytes()
        .chunks(512)
        .map(|c| Ok(c.to_vec()))
        .collect();
    futures::stream::iter(chunks)
}
