//! Every answer names its request: the client's `X-Request-Id` or a new one.

use serde_json::json;

use crate::TestApi;

fn request_id(response: &reqwest::Response) -> String {
    response.headers()["x-request-id"]
        .to_str()
        .unwrap()
        .to_owned()
}

#[tokio::test]
async fn every_answer_carries_the_clients_request_id_or_a_new_one() {
    let api = TestApi::default().await;
    let message = json!({"recipient": "a@example.com", "body": {"n": 1}});

    let named = api
        .post("/v1/messages")
        .header("X-Request-Id", "checkout-42/try-1")
        .json(&message)
        .send()
        .await
        .unwrap();
    assert_eq!(named.status(), 202);
    assert_eq!(request_id(&named), "checkout-42/try-1");

    let mut fresh = Vec::new();
    for header in [None, Some("two words"), Some(&*"x".repeat(129))] {
        let mut request = api.post("/v1/messages").json(&message);
        if let Some(value) = header {
            request = request.header("X-Request-Id", value);
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), 202);
        let id = request_id(&response);
        assert!(
            uuid::Uuid::parse_str(&id).is_ok(),
            "{header:?} is not usable, so the API names the request itself: {id}"
        );
        fresh.push(id);
    }
    fresh.sort();
    fresh.dedup();
    assert_eq!(fresh.len(), 3, "each request its own id");

    // Problems name their request too, and so do operator routes.
    let refused = api
        .post("/v1/messages")
        .header("X-Request-Id", "bad-body")
        .header("content-type", "application/json")
        .body("{")
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 400);
    assert_eq!(request_id(&refused), "bad-body");
    let listed = api.get("/v1/dead").send().await.unwrap();
    assert_eq!(listed.status(), 200);
    assert!(uuid::Uuid::parse_str(&request_id(&listed)).is_ok());
}
