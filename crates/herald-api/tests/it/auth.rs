//! API keys guard every route of the router: without a key or with a wrong one the answer is
//! 401 problem+json and nothing is written; with a right key the route does its work.

use herald_api::Limits;
use reqwest::Method;
use serde_json::{json, Value};

use crate::{assert_problem, TestApi};

const KEYS: [&str; 2] = ["key-one", "key-two"];

/// One request to one route.
struct Call {
    method: Method,
    path: String,
    body: Option<Value>,
    /// What the route answers with a right key.
    authorized_status: u16,
}

impl Call {
    fn new(method: Method, path: impl Into<String>, authorized_status: u16) -> Self {
        Self {
            method,
            path: path.into(),
            body: None,
            authorized_status,
        }
    }

    fn with_body(mut self, body: Value) -> Self {
        self.body = Some(body);
        self
    }

    async fn send(&self, api: &TestApi, authorization: Option<&str>) -> reqwest::Response {
        let mut request = api
            .client
            .request(self.method.clone(), format!("{}{}", api.base, self.path));
        if let Some(value) = authorization {
            request = request.header("authorization", value);
        }
        if let Some(body) = &self.body {
            request = request.json(body);
        }
        request.send().await.unwrap()
    }
}

/// Everything the routes can write, in one comparable text: rows of every table, and the
/// columns the operator routes change (outbox status and attempts, parking replays).
async fn written(api: &TestApi) -> String {
    sqlx::query_scalar(
        "SELECT json_build_object(
             'messages', (SELECT count(*) FROM messages),
             'events', (SELECT count(*) FROM message_events),
             'receipts', (SELECT count(*) FROM receipts),
             'ledger', (SELECT count(*) FROM ledger),
             'outbox', (SELECT coalesce(json_agg(json_build_array(id, status, attempts,
                                                                 available_at, last_error)
                                                 ORDER BY id), '[]')
                        FROM outbox),
             'parking', (SELECT coalesce(json_agg(json_build_array(id, replayed_at) ORDER BY id),
                                         '[]')
                         FROM parking)
         )::text",
    )
    .fetch_one(&api.pool)
    .await
    .unwrap()
}

/// A message whose outbox row is DEAD, and a parked receipt: something for the operator
/// routes to change. Returns (message id, DEAD outbox id, parking id).
async fn seed(api: &TestApi) -> (String, i64, i64) {
    let response = api
        .post("/v1/messages")
        .bearer_auth(KEYS[0])
        .json(&json!({"recipient": "seed", "body": {"n": 0}}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 202);
    let answer: Value = response.json().await.unwrap();
    let message_id = answer["id"].as_str().unwrap().to_owned();
    let dead_id: i64 = sqlx::query_scalar(
        "UPDATE outbox SET status = 'DEAD', attempts = 10, last_error = 'seeded'
         WHERE message_id = $1::uuid RETURNING id",
    )
    .bind(&message_id)
    .fetch_one(&api.pool)
    .await
    .unwrap();

    let response = api
        .post("/v1/providers/gw-a/receipts")
        .bearer_auth(KEYS[1])
        .json(&json!({"provider_id": "7", "status": "ACKD", "timestamp": 1_700_000_000}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 202);
    let answer: Value = response.json().await.unwrap();
    let receipt_id = answer["receipt_id"].as_i64().unwrap();
    let parking_id: i64 = sqlx::query_scalar(
        "INSERT INTO parking (job_type, receipt_id, raw, reason)
         SELECT 'status', id, raw, 'unknown status ACKD' FROM receipts WHERE id = $1
         RETURNING id",
    )
    .bind(receipt_id)
    .fetch_one(&api.pool)
    .await
    .unwrap();
    (message_id, dead_id, parking_id)
}

/// Every route of `herald_api::router`, with a request it would accept.
fn every_route(message_id: &str, dead_id: i64, parking_id: i64) -> Vec<Call> {
    let message = json!({"recipient": "guarded", "body": {"n": 1}});
    vec![
        Call::new(Method::POST, "/v1/messages", 202).with_body(message.clone()),
        Call::new(Method::POST, "/v1/messages/batch", 202)
            .with_body(json!({ "messages": [message.clone(), message] })),
        Call::new(Method::GET, format!("/v1/messages/{message_id}"), 200),
        Call::new(Method::GET, "/v1/partitions", 200),
        Call::new(Method::POST, "/v1/providers/gw-b/receipts", 202).with_body(
            json!({"provider_id": "8", "status": "DELIVRD", "timestamp": 1_700_000_000}),
        ),
        Call::new(Method::POST, "/v1/providers/gw-b/receipts/batch", 202).with_body(json!([
            {"provider_id": "9", "status": "DELIVRD", "timestamp": 1_700_000_000}
        ])),
        Call::new(Method::GET, "/v1/dead", 200),
        Call::new(Method::POST, format!("/v1/dead/{dead_id}/redrive"), 202),
        Call::new(Method::GET, "/v1/parking", 200),
        Call::new(
            Method::POST,
            format!("/v1/parking/{parking_id}/replay"),
            202,
        ),
    ]
}

#[tokio::test]
async fn api_keys_guard_every_route_and_a_refused_request_writes_nothing() {
    let api = TestApi::start(&KEYS, Limits::default()).await;
    let (message_id, dead_id, parking_id) = seed(&api).await;
    let calls = every_route(&message_id, dead_id, parking_id);
    let before = written(&api).await;

    let refused = [
        None,
        Some("Bearer key-three".to_owned()),
        // A prefix of a right key.
        Some(format!("Bearer {}", &KEYS[0][..KEYS[0].len() - 1])),
        // A right key without the scheme.
        Some(KEYS[0].to_owned()),
    ];
    for call in &calls {
        for authorization in &refused {
            let response = call.send(&api, authorization.as_deref()).await;
            let what = format!("{} {} with {authorization:?}", call.method, call.path);
            assert_eq!(response.status(), 401, "{what}");
            assert_eq!(response.headers()["www-authenticate"], "Bearer", "{what}");
            assert_problem(response, 401, None).await;
        }
    }
    assert_eq!(
        written(&api).await,
        before,
        "a refused request wrote nothing"
    );

    // The same requests with a right key (either one) are served, and the writing ones write.
    for (i, call) in calls.iter().enumerate() {
        let key = format!("Bearer {}", KEYS[i % KEYS.len()]);
        let response = call.send(&api, Some(&key)).await;
        let status = response.status().as_u16();
        let body = response.text().await.unwrap();
        assert_eq!(
            status, call.authorized_status,
            "{} {}: {body}",
            call.method, call.path
        );
    }
    let (messages, outbox_rows, events) = api.rows().await;
    assert_eq!(messages, 1 + 3, "the seed, one message and a batch of two");
    assert_eq!(
        events,
        1 + 3 + 1,
        "their QUEUED events and the re-drive's RETRYING"
    );
    // Seed: message and receipt; then three messages, a receipt, a batch of one receipt, and
    // the replay's job.
    assert_eq!(outbox_rows, 2 + 3 + 1 + 1 + 1);
    let states: (String, Option<String>) = sqlx::query_as(
        "SELECT (SELECT status FROM outbox WHERE id = $1),
                (SELECT replayed_at::text FROM parking WHERE id = $2)",
    )
    .bind(dead_id)
    .bind(parking_id)
    .fetch_one(&api.pool)
    .await
    .unwrap();
    assert_eq!(states.0, "PENDING", "the DEAD row was re-driven");
    assert!(states.1.is_some(), "the parked receipt was replayed");
}

#[tokio::test]
async fn without_configured_keys_no_route_asks_for_one() {
    let api = TestApi::default().await;
    let (message_id, dead_id, parking_id) = seed(&api).await;
    for call in every_route(&message_id, dead_id, parking_id) {
        let response = call.send(&api, None).await;
        assert_eq!(
            response.status().as_u16(),
            call.authorized_status,
            "{} {}",
            call.method,
            call.path
        );
    }
}
