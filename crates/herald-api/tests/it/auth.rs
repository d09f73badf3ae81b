//! Who may call what. Client keys accept messages and read their own; operator keys also run
//! the operator routes; receipts are taken only when signed with their gateway's secret. A
//! refused request is answered 401 (no or unknown credential) or 403 (a key outside its scope)
//! as problem+json, and writes nothing.
//!
//! Longer than 400 lines: one test per caller kind and route family, sharing the keys and the
//! signing helpers at the top; splitting it would only move those helpers into a module.

use std::time::Duration;

use futures::StreamExt;
use herald_api::auth::Credentials;
use herald_api::Limits;
use herald_core::signature;
use reqwest::Method;
use serde_json::{json, Value};

use crate::{assert_problem, TestApi};

pub(crate) const SHOP: &str = "client-key-shop-0123456789";
pub(crate) const BILLING: &str = "client-key-billing-012345";
const OPS: &str = "operator-key-ops-01234567";
const GW_A: &str = "receipt-secret-gw-a-012345";
const GW_B: &str = "receipt-secret-gw-b-012345";

fn pairs(items: &[(&str, &str)]) -> Vec<(String, String)> {
    items
        .iter()
        .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
        .collect()
}

pub(crate) fn credentials() -> Credentials {
    Credentials::new(
        pairs(&[("shop", SHOP), ("billing", BILLING)]),
        pairs(&[("ops", OPS)]),
        pairs(&[("gw-a", GW_A), ("gw-b", GW_B)]),
        Duration::from_secs(300),
        false,
    )
    .unwrap()
}

async fn api() -> TestApi {
    TestApi::start(credentials(), Limits::default()).await
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// What a route needs.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Needs {
    Client,
    Operator,
    /// A signature by this secret.
    Signature(&'static str),
}

/// One request to one route.
struct Call {
    method: Method,
    path: String,
    body: Option<String>,
    needs: Needs,
    /// What the route answers with the right credential.
    authorized_status: u16,
}

impl Call {
    fn new(method: Method, path: impl Into<String>, needs: Needs, authorized_status: u16) -> Self {
        Self {
            method,
            path: path.into(),
            body: None,
            needs,
            authorized_status,
        }
    }

    fn with_body(mut self, body: Value) -> Self {
        self.body = Some(body.to_string());
        self
    }

    /// The request with `authorization` and `signature` headers as given.
    async fn send(
        &self,
        api: &TestApi,
        authorization: Option<&str>,
        signature: Option<&str>,
    ) -> reqwest::Response {
        let mut request = api
            .client
            .request(self.method.clone(), format!("{}{}", api.base, self.path));
        if let Some(value) = authorization {
            request = request.header("authorization", value);
        }
        if let Some(value) = signature {
            request = request.header(signature::HEADER, value);
        }
        if let Some(body) = &self.body {
            request = request
                .header("content-type", "application/json")
                .body(body.clone());
        }
        request.send().await.unwrap()
    }

    /// The request with the credential the route needs.
    async fn send_authorized(&self, api: &TestApi) -> reqwest::Response {
        match self.needs {
            Needs::Client => self.send(api, Some(&format!("Bearer {SHOP}")), None).await,
            Needs::Operator => self.send(api, Some(&format!("Bearer {OPS}")), None).await,
            Needs::Signature(secret) => {
                let body = self.body.as_deref().unwrap_or_default().as_bytes();
                let header = signature::sign(secret.as_bytes(), now(), body);
                self.send(api, None, Some(&header)).await
            }
        }
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

/// A message of the client `shop` whose outbox row is DEAD, and a parked receipt: something
/// for the operator routes to change. Returns (message id, DEAD outbox id, parking id).
async fn seed(api: &TestApi) -> (String, i64, i64) {
    let response = api
        .post("/v1/messages")
        .bearer_auth(SHOP)
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

    let receipt = Call::new(
        Method::POST,
        "/v1/providers/gw-a/receipts",
        Needs::Signature(GW_A),
        202,
    )
    .with_body(json!({"provider_id": "7", "status": "ACKD", "timestamp": 1_700_000_000}));
    let response = receipt.send_authorized(api).await;
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

/// Every route of `herald_api::router`, with a request it would accept and what it needs.
fn every_route(message_id: &str, dead_id: i64, parking_id: i64) -> Vec<Call> {
    let message = json!({"recipient": "guarded", "body": {"n": 1}});
    vec![
        Call::new(Method::POST, "/v1/messages", Needs::Client, 202).with_body(message.clone()),
        Call::new(Method::POST, "/v1/messages/batch", Needs::Client, 202)
            .with_body(json!({ "messages": [message.clone(), message] })),
        Call::new(
            Method::GET,
            format!("/v1/messages/{message_id}"),
            Needs::Client,
            200,
        ),
        Call::new(Method::GET, "/v1/partitions", Needs::Operator, 200),
        Call::new(
            Method::POST,
            "/v1/providers/gw-b/receipts",
            Needs::Signature(GW_B),
            202,
        )
        .with_body(json!({"provider_id": "8", "status": "DELIVRD", "timestamp": 1_700_000_000})),
        Call::new(
            Method::POST,
            "/v1/providers/gw-b/receipts/batch",
            Needs::Signature(GW_B),
            202,
        )
        .with_body(json!([
            {"provider_id": "9", "status": "DELIVRD", "timestamp": 1_700_000_000}
        ])),
        Call::new(Method::GET, "/v1/dead", Needs::Operator, 200),
        Call::new(
            Method::POST,
            format!("/v1/dead/{dead_id}/redrive"),
            Needs::Operator,
            202,
        ),
        Call::new(Method::GET, "/v1/parking", Needs::Operator, 200),
        Call::new(
            Method::POST,
            format!("/v1/parking/{parking_id}/replay"),
            Needs::Operator,
            202,
        ),
    ]
}

#[tokio::test]
async fn every_route_needs_its_credential_and_a_refused_request_writes_nothing() {
    let api = api().await;
    let (message_id, dead_id, parking_id) = seed(&api).await;
    let calls = every_route(&message_id, dead_id, parking_id);
    let before = written(&api).await;

    // No credential, an unknown key, a prefix of a right key, a right key without its
    // scheme: 401 everywhere, receipts included (a bearer key is no receipt credential).
    let refused = [
        None,
        Some("Bearer key-three-0123456789".to_owned()),
        Some(format!("Bearer {}", &OPS[..OPS.len() - 1])),
        Some(OPS.to_owned()),
    ];
    for call in &calls {
        for authorization in &refused {
            let response = call.send(&api, authorization.as_deref(), None).await;
            let what = format!("{} {} with {authorization:?}", call.method, call.path);
            if matches!(call.needs, Needs::Signature(_)) {
                assert_eq!(
                    response.headers()["www-authenticate"],
                    "Herald-Signature",
                    "{what}"
                );
            } else {
                assert_eq!(response.headers()["www-authenticate"], "Bearer", "{what}");
            }
            assert_problem(response, 401, None).await;
        }
        if let Needs::Signature(_) = call.needs {
            // An operator key does not sign receipts.
            let response = call.send(&api, Some(&format!("Bearer {OPS}")), None).await;
            assert_problem(response, 401, None).await;
        }
    }
    // A client key on an operator route: 403, naming the scope it lacks.
    for call in calls.iter().filter(|c| c.needs == Needs::Operator) {
        let response = call
            .send(&api, Some(&format!("Bearer {BILLING}")), None)
            .await;
        let problem = assert_problem(response, 403, None).await;
        assert_eq!(problem["type"], "urn:herald:problem:forbidden");
        assert!(
            problem["detail"].as_str().unwrap().contains("operator"),
            "{problem}"
        );
    }
    assert_eq!(
        written(&api).await,
        before,
        "a refused request wrote nothing"
    );

    // The same requests with the credential they need are served, and the writing ones write.
    for call in &calls {
        let response = call.send_authorized(&api).await;
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
        events, 1,
        "the re-drive's RETRYING (an accept writes no event: QUEUED is derived)"
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
async fn a_client_key_cannot_redrive_dead_or_read_parking_and_an_operator_key_can() {
    let api = api().await;
    let (_, dead_id, parking_id) = seed(&api).await;
    let operator_routes = [
        (Method::GET, "/v1/dead".to_owned(), 200),
        (Method::POST, format!("/v1/dead/{dead_id}/redrive"), 202),
        (Method::GET, "/v1/parking".to_owned(), 200),
        (
            Method::POST,
            format!("/v1/parking/{parking_id}/replay"),
            202,
        ),
        (Method::GET, "/v1/partitions".to_owned(), 200),
    ];
    let before = written(&api).await;
    for (method, path, _) in &operator_routes {
        let response = api
            .client
            .request(method.clone(), format!("{}{path}", api.base))
            .bearer_auth(SHOP)
            .send()
            .await
            .unwrap();
        assert_problem(response, 403, None).await;
    }
    assert_eq!(written(&api).await, before, "the client changed nothing");
    for (method, path, status) in &operator_routes {
        let response = api
            .client
            .request(method.clone(), format!("{}{path}", api.base))
            .bearer_auth(OPS)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), *status, "{method} {path}");
    }
    let status: String = sqlx::query_scalar("SELECT status FROM outbox WHERE id = $1")
        .bind(dead_id)
        .fetch_one(&api.pool)
        .await
        .unwrap();
    assert_eq!(status, "PENDING", "the operator re-drove the DEAD row");
}

#[tokio::test]
async fn a_client_key_reads_and_retries_only_its_own_messages() {
    let api = api().await;
    let message = json!({"recipient": "+15550100", "body": {"text": "mine"}});
    let post = |key: &'static str| {
        api.post("/v1/messages")
            .bearer_auth(key)
            .header("Idempotency-Key", "order-1")
            .json(&message)
    };
    let response = post(SHOP).send().await.unwrap();
    assert_eq!(response.status(), 202);
    let id = response.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let get = |key: &'static str| api.get(&format!("/v1/messages/{id}")).bearer_auth(key);

    let own: Value = get(SHOP).send().await.unwrap().json().await.unwrap();
    assert_eq!(own["id"], id.as_str());
    assert_eq!(own["created_by"], "shop");
    // Another client's message is answered like one that does not exist.
    let response = get(BILLING).send().await.unwrap();
    assert_problem(response, 404, None).await;
    let response = get(OPS).send().await.unwrap();
    assert_eq!(response.status(), 200, "an operator reads every message");

    // The same key and content from another client is not a retry: 409, nothing written.
    let before = api.rows().await;
    let response = post(BILLING).send().await.unwrap();
    let problem = assert_problem(response, 409, Some("Idempotency-Key")).await;
    assert!(!problem.to_string().contains(&id), "{problem}");
    let batch = json!({"messages": [{"recipient": "+15550100", "body": {"text": "mine"},
                                     "idempotency_key": "order-1"}]});
    let response = api
        .post("/v1/messages/batch")
        .bearer_auth(BILLING)
        .json(&batch)
        .send()
        .await
        .unwrap();
    assert_problem(response, 409, Some("messages[0].idempotency_key")).await;
    assert_eq!(api.rows().await, before);
    // The owner's retry is answered with the stored message.
    let response = post(SHOP).send().await.unwrap();
    assert_eq!(response.status(), 202);
    assert_eq!(response.headers()["idempotent-replayed"], "true");
    assert_eq!(response.json::<Value>().await.unwrap()["id"], id.as_str());
}

/// Receipt rows and status jobs.
async fn receipt_rows(api: &TestApi) -> (i64, i64) {
    sqlx::query_as(
        "SELECT (SELECT count(*) FROM receipts),
                (SELECT count(*) FROM outbox WHERE job_type = 'status')",
    )
    .fetch_one(&api.pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn a_receipt_is_stored_only_when_its_gateways_secret_signed_it_just_now() {
    let api = api().await;
    let body = r#"{"provider_id":"41","status":"DELIVRD","timestamp":1700000000}"#;
    let post = |gateway: &str, signature: Option<String>, body: &'static str| {
        let mut request = api
            .post(&format!("/v1/providers/{gateway}/receipts"))
            .header("content-type", "application/json")
            .body(body);
        if let Some(signature) = signature {
            request = request.header(signature::HEADER, signature);
        }
        request.send()
    };
    let sign =
        |secret: &str, t: i64, body: &str| signature::sign(secret.as_bytes(), t, body.as_bytes());
    let refused = [
        ("unsigned", "gw-a", None, body),
        (
            "another gateway's secret",
            "gw-a",
            Some(sign(GW_B, now(), body)),
            body,
        ),
        ("stale", "gw-a", Some(sign(GW_A, now() - 3600, body)), body),
        (
            "from the future",
            "gw-a",
            Some(sign(GW_A, now() + 3600, body)),
            body,
        ),
        (
            "malformed",
            "gw-a",
            Some(format!("t={},v1=zz", now())),
            body,
        ),
        (
            "a gateway without a secret",
            "gw-c",
            Some(sign(GW_A, now(), body)),
            body,
        ),
        (
            "another body",
            "gw-a",
            Some(sign(GW_A, now(), body)),
            r#"{"provider_id":"41","status":"UNDELIV","timestamp":1700000000}"#,
        ),
    ];
    for (what, gateway, signature, body) in refused {
        let response = post(gateway, signature, body).await.unwrap();
        assert_eq!(
            response.headers()["www-authenticate"],
            "Herald-Signature",
            "{what}"
        );
        let problem = assert_problem(response, 401, None).await;
        assert_eq!(problem["type"], "urn:herald:problem:unauthorized", "{what}");
        assert_eq!(receipt_rows(&api).await, (0, 0), "{what}: nothing stored");
    }

    // Signed with the gateway's secret, within the window: stored byte for byte.
    let response = post("gw-a", Some(sign(GW_A, now() - 60, body)), body)
        .await
        .unwrap();
    assert_eq!(response.status(), 202);
    let raw: Vec<u8> = sqlx::query_scalar("SELECT raw FROM receipts WHERE gateway = 'gw-a'")
        .fetch_one(&api.pool)
        .await
        .unwrap();
    assert_eq!(raw, body.as_bytes());
    // A batch is signed as a whole, over its exact bytes.
    let batch = r#"[{"provider_id":"42","status":"ENROUTE","timestamp":1700000000},
                    {"provider_id":"42","status":"DELIVRD","timestamp":1700000001}]"#;
    let response = api
        .post("/v1/providers/gw-b/receipts/batch")
        .header(signature::HEADER, sign(GW_B, now(), batch))
        .body(batch)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 202);
    // Three receipts; the batch's two share one status job.
    assert_eq!(receipt_rows(&api).await, (3, 2));
    let unsigned = api
        .post("/v1/providers/gw-b/receipts/batch")
        .body(batch)
        .send()
        .await
        .unwrap();
    assert_problem(unsigned, 401, None).await;
    assert_eq!(receipt_rows(&api).await, (3, 2));
}

#[tokio::test]
async fn a_flood_of_receipts_signed_with_a_wrong_key_changes_nothing() {
    let api = api().await;
    let before = written(&api).await;
    let forger = "receipt-secret-guessed-0123";
    let answers: Vec<u16> = futures::stream::iter(0..500)
        .map(|i| {
            let body =
                format!(r#"{{"provider_id":"{i}","status":"DELIVRD","timestamp":1700000000}}"#);
            let header = signature::sign(forger.as_bytes(), now(), body.as_bytes());
            let request = api
                .post(&format!("/v1/providers/gw-{}/receipts", ["a", "b"][i % 2]))
                .header(signature::HEADER, header)
                .body(body);
            async move { request.send().await.unwrap().status().as_u16() }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    assert!(answers.iter().all(|status| *status == 401), "{answers:?}");
    assert_eq!(written(&api).await, before, "no receipt, no status job");
}

#[tokio::test]
async fn a_development_run_without_credentials_opens_every_route() {
    let api = TestApi::default().await;
    let response = api
        .post("/v1/messages")
        .json(&json!({"recipient": "seed", "body": {"n": 0}}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 202);
    let message_id = response.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let dead_id: i64 = sqlx::query_scalar(
        "UPDATE outbox SET status = 'DEAD' WHERE message_id = $1::uuid RETURNING id",
    )
    .bind(&message_id)
    .fetch_one(&api.pool)
    .await
    .unwrap();
    let receipt = api
        .post("/v1/providers/gw-a/receipts")
        .json(&json!({"provider_id": "7", "status": "ACKD", "timestamp": 1_700_000_000}))
        .send()
        .await
        .unwrap();
    assert_eq!(receipt.status(), 202, "receipts need no signature");
    let receipt_id = receipt.json::<Value>().await.unwrap()["receipt_id"]
        .as_i64()
        .unwrap();
    let parking_id: i64 = sqlx::query_scalar(
        "INSERT INTO parking (job_type, receipt_id, raw, reason)
         SELECT 'status', id, raw, 'seeded' FROM receipts WHERE id = $1 RETURNING id",
    )
    .bind(receipt_id)
    .fetch_one(&api.pool)
    .await
    .unwrap();
    for call in every_route(&message_id, dead_id, parking_id) {
        let response = call.send(&api, None, None).await;
        assert_eq!(
            response.status().as_u16(),
            call.authorized_status,
            "{} {}",
            call.method,
            call.path
        );
    }
}

#[tokio::test]
async fn a_development_run_still_enforces_the_credentials_it_was_given() {
    let credentials = Credentials::new(
        pairs(&[("shop", SHOP)]),
        Vec::new(),
        Vec::new(),
        Duration::from_secs(300),
        true,
    )
    .unwrap();
    let api = TestApi::start(credentials, Limits::default()).await;
    let message = json!({"recipient": "+15550100", "body": {"n": 1}});
    let response = api
        .post("/v1/messages")
        .json(&message)
        .send()
        .await
        .unwrap();
    assert_problem(response, 401, None).await;
    let response = api
        .post("/v1/messages")
        .bearer_auth(SHOP)
        .json(&message)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 202);
    // No receipt secret in a development run: receipts are taken unsigned.
    let response = api
        .post("/v1/providers/gw-a/receipts")
        .json(&json!({"provider_id": "1", "status": "DELIVRD", "timestamp": 1_700_000_000}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 202);
}
