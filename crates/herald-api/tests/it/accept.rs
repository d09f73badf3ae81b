use serde_json::{json, Value};

use crate::TestApi;

#[tokio::test]
async fn accepted_message_is_queued_with_its_history() {
    let api = TestApi::default().await;
    let response = api
        .post("/v1/messages")
        .json(&json!({"recipient": "+15550100", "body": {"text": "hi"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 202);
    let location = response.headers()["location"].to_str().unwrap().to_owned();
    let answer: Value = response.json().await.unwrap();
    assert_eq!(answer["state"], "QUEUED");
    let id = answer["id"].as_str().unwrap();
    assert_eq!(location, format!("/v1/messages/{id}"));
    assert_eq!(api.rows().await, (1, 1, 0));

    let view: Value = api
        .get(&location)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(view["id"], id);
    assert_eq!(view["state"], "QUEUED");
    assert_eq!(view["recipient"], "+15550100");
    assert_eq!(view["body"], json!({"text": "hi"}));
    assert_eq!(view["events"].as_array().unwrap().len(), 1);
    assert_eq!(view["events"][0]["state"], "QUEUED");

    // The partition follows the partition key (default: the recipient).
    let partition: i32 = sqlx::query_scalar("SELECT partition FROM outbox")
        .fetch_one(&api.pool)
        .await
        .unwrap();
    let expected =
        herald_core::partition_of("+15550100", herald_core::PartitionCount::new(8).unwrap());
    assert_eq!(partition as u32, expected);
}

#[tokio::test]
async fn idempotency_key_replays_the_same_id_and_refuses_other_content() {
    let api = TestApi::default().await;
    let send = |body: Value| {
        api.post("/v1/messages")
            .header("Idempotency-Key", "order-42")
            .json(&json!({"recipient": "a@example.com", "body": body}))
            .send()
    };
    let first = send(json!({"n": 1})).await.unwrap();
    assert_eq!(first.status(), 202);
    assert!(first_replayed_header_absent(&first));
    let first: Value = first.json().await.unwrap();
    let again = send(json!({"n": 1})).await.unwrap();
    assert_eq!(
        again.status(),
        202,
        "a replay answers the first request's status"
    );
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    let again: Value = again.json().await.unwrap();
    assert_eq!(again["id"], first["id"]);
    assert_eq!(again["created"], false);

    let conflict = send(json!({"n": 2})).await.unwrap();
    let problem = crate::assert_problem(conflict, 409, Some("Idempotency-Key")).await;
    assert!(problem["detail"].as_str().unwrap().contains("order-42"));
    assert_eq!(api.rows().await, (1, 1, 0));
}

/// Concurrent single accepts share transactions (group commit), yet each request keeps its own
/// answer: a reused key is a 409 for that request alone, a retry a 202 marked as a replay with
/// the first id.
#[tokio::test]
async fn concurrent_single_accepts_share_commits_and_keep_their_own_answers() {
    let api = TestApi::default().await;
    let send = |key: String, n: u32| {
        api.post("/v1/messages")
            .header("Idempotency-Key", key)
            .json(&json!({"recipient": "a@example.com", "body": {"n": n}}))
            .send()
    };
    // 150 distinct keys; 25 of them sent twice with the same content, 25 with other content.
    let mut requests = Vec::new();
    for i in 0..150u32 {
        requests.push(send(format!("k-{i}"), i));
        if i < 25 {
            requests.push(send(format!("k-{i}"), i));
        } else if i < 50 {
            requests.push(send(format!("k-{i}"), i + 1000));
        }
    }
    let mut statuses = std::collections::BTreeMap::new();
    for response in futures::future::join_all(requests).await {
        let response = response.unwrap();
        let replayed = response.headers().contains_key("idempotent-replayed");
        *statuses
            .entry((response.status().as_u16(), replayed))
            .or_insert(0) += 1;
    }
    // Each twice-sent pair: one 202 and, whichever came second, a replayed 202 (same content)
    // or a 409.
    assert_eq!(
        statuses,
        [((202, true), 25), ((202, false), 150), ((409, false), 25)].into()
    );
    assert_eq!(api.rows().await, (150, 150, 0));
    let transactions: i64 = sqlx::query_scalar("SELECT count(DISTINCT xmin::text) FROM messages")
        .fetch_one(&api.pool)
        .await
        .unwrap();
    assert!(
        transactions < 150,
        "150 concurrent accepts were committed in {transactions} transactions: none shared one"
    );
}

#[tokio::test]
async fn batch_answers_ids_in_order_and_is_all_or_nothing() {
    let api = TestApi::default().await;
    let messages: Vec<Value> = (0..50)
        .map(|i| json!({"recipient": format!("r{i}"), "body": {"i": i}, "idempotency_key": format!("b-{i}")}))
        .collect();
    let response = api
        .post("/v1/messages/batch")
        .json(&json!({ "messages": messages }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 202);
    let answer: Value = response.json().await.unwrap();
    let ids: Vec<String> = answer["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids.len(), 50);
    for (i, id) in ids.iter().enumerate() {
        let recipient: String =
            sqlx::query_scalar("SELECT recipient FROM messages WHERE id = $1::uuid")
                .bind(id)
                .fetch_one(&api.pool)
                .await
                .unwrap();
        assert_eq!(recipient, format!("r{i}"));
    }
    assert_eq!(api.rows().await, (50, 50, 0));

    assert!(answer["messages"][0]["created"].as_bool().unwrap());

    // Replaying the batch answers the same ids with the first answer's 202, marked a replay.
    let replay = api
        .post("/v1/messages/batch")
        .json(&json!({ "messages": messages }))
        .send()
        .await
        .unwrap();
    assert_eq!(replay.status(), 202);
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    let replay: Value = replay.json().await.unwrap();
    assert_eq!(replay["messages"][49]["id"].as_str().unwrap(), ids[49]);
    assert_eq!(replay["messages"][49]["created"], false);

    // One bad item: 422 naming it, and nothing of the batch is written.
    let mut bad: Vec<Value> = (0..5)
        .map(|i| json!({"recipient": format!("x{i}"), "body": "b"}))
        .collect();
    bad[3] = json!({"recipient": "x3"});
    let response = api
        .post("/v1/messages/batch")
        .json(&json!({ "messages": bad }))
        .send()
        .await
        .unwrap();
    crate::assert_problem(response, 422, Some("messages[3].body")).await;

    // A key used twice in one batch, and a key reused with other content.
    let twice = json!({"messages": [
        {"recipient": "a", "body": 1, "idempotency_key": "dup"},
        {"recipient": "b", "body": 2, "idempotency_key": "dup"}
    ]});
    let response = api
        .post("/v1/messages/batch")
        .json(&twice)
        .send()
        .await
        .unwrap();
    crate::assert_problem(response, 422, Some("messages[1].idempotency_key")).await;
    let reused = json!({"messages": [
        {"recipient": "new", "body": 1},
        {"recipient": "r7", "body": {"i": 999}, "idempotency_key": "b-7"}
    ]});
    let response = api
        .post("/v1/messages/batch")
        .json(&reused)
        .send()
        .await
        .unwrap();
    crate::assert_problem(response, 409, Some("messages[1].idempotency_key")).await;
    assert_eq!(api.rows().await, (50, 50, 0));
}

#[tokio::test]
async fn partitions_list_owner_epoch_and_backlog() {
    let api = TestApi::default().await;
    api.post("/v1/messages")
        .json(&json!({"recipient": "+15550100", "body": 1}))
        .send()
        .await
        .unwrap();
    let taken = herald_store::leases::Acquisition {
        generation: "g",
        revision: 42,
        current_revision: 42,
    };
    herald_store::leases::record_epoch(&api.pool, 3, "poller-a", taken)
        .await
        .unwrap();
    let answer = api.get_json("/v1/partitions").await;
    let partitions = answer["partitions"].as_array().unwrap();
    assert_eq!(partitions.len(), 8);
    let busy = herald_core::partition_of("+15550100", herald_core::PartitionCount::new(8).unwrap());
    for entry in partitions {
        let p = entry["partition"].as_u64().unwrap() as u32;
        assert_eq!(entry["pending"], if p == busy { 1 } else { 0 });
        if p == 3 {
            assert_eq!(entry["owner"], "poller-a");
            assert_eq!(entry["epoch"], 1, "PostgreSQL's own counter");
        } else {
            assert!(entry["owner"].is_null());
        }
    }
}

/// With keys required, a message without one is refused (and nothing written); with one it is
/// accepted as always.
#[tokio::test]
async fn a_deployment_that_requires_keys_refuses_messages_without_one() {
    let api = TestApi::with_limits(herald_api::Limits {
        require_idempotency_key: true,
        ..herald_api::Limits::default()
    })
    .await;
    let message = json!({"recipient": "a@example.com", "body": {"n": 1}});
    let response = api
        .post("/v1/messages")
        .json(&message)
        .send()
        .await
        .unwrap();
    let problem = crate::assert_problem(response, 400, Some("Idempotency-Key")).await;
    assert_eq!(
        problem["type"],
        "urn:herald:problem:missing-idempotency-key"
    );
    let batch = json!({"messages": [
        {"recipient": "a", "body": 1, "idempotency_key": "k-1"},
        {"recipient": "b", "body": 2},
    ]});
    let response = api
        .post("/v1/messages/batch")
        .json(&batch)
        .send()
        .await
        .unwrap();
    crate::assert_problem(response, 422, Some("messages[1].idempotency_key")).await;
    assert_eq!(api.rows().await, (0, 0, 0));
    let response = api
        .post("/v1/messages")
        .header("Idempotency-Key", "k-2")
        .json(&message)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 202);
}

fn first_replayed_header_absent(response: &reqwest::Response) -> bool {
    !response.headers().contains_key("idempotent-replayed")
}
