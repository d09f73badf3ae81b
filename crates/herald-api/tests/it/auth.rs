use herald_api::Limits;
use serde_json::json;

use crate::{assert_problem, TestApi};

#[tokio::test]
async fn api_keys_guard_every_v1_route() {
    let api = TestApi::start(&["key-one", "key-two"], Limits::default()).await;
    let body = json!({"recipient": "a", "body": 1});

    let response = api.post("/v1/messages").json(&body).send().await.unwrap();
    assert_eq!(response.headers()["www-authenticate"], "Bearer");
    assert_problem(response, 401, None).await;
    let response = api
        .post("/v1/messages")
        .bearer_auth("key-three")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_problem(response, 401, None).await;
    let response = api
        .get(&format!("/v1/messages/{}", uuid::Uuid::now_v7()))
        .send()
        .await
        .unwrap();
    assert_problem(response, 401, None).await;
    assert_eq!(api.rows().await, (0, 0, 0));

    let response = api
        .post("/v1/messages")
        .bearer_auth("key-two")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 202);
}
