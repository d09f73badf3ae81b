//! Receipts in batches: each element stored byte for byte as its own receipt with its own
//! status job, in order; a body that cannot be split is kept whole and refused.

use serde_json::Value;

use crate::{assert_problem, TestApi};

async fn stored(api: &TestApi) -> Vec<(i64, String, Vec<u8>)> {
    sqlx::query_as("SELECT id, gateway, raw FROM receipts ORDER BY id")
        .fetch_all(&api.pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_batch_stores_each_receipt_as_it_came_with_its_own_job_in_order() {
    let api = TestApi::default().await;
    // Odd spacing and key order inside each element: kept exactly.
    let body = r#"[ {"provider_id":"1","status":"ENROUTE", "timestamp":1700000000},
        {"timestamp": 1700000001 ,"provider_id":"1","status":"DELIVRD"},{"provider_id":"2","status":"ACKD","timestamp":"x"} ]"#;
    let response = api
        .post("/v1/providers/gw-1/receipts/batch")
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 202);
    let answer: Value = response.json().await.unwrap();
    let ids: Vec<i64> = answer["receipt_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_i64().unwrap())
        .collect();
    let rows = stored(&api).await;
    assert_eq!(rows.iter().map(|r| r.0).collect::<Vec<_>>(), ids);
    let raws: Vec<String> = rows
        .iter()
        .map(|r| String::from_utf8(r.2.clone()).unwrap())
        .collect();
    assert_eq!(
        raws,
        [
            r#"{"provider_id":"1","status":"ENROUTE", "timestamp":1700000000}"#,
            r#"{"timestamp": 1700000001 ,"provider_id":"1","status":"DELIVRD"}"#,
            r#"{"provider_id":"2","status":"ACKD","timestamp":"x"}"#,
        ]
    );
    assert!(rows.iter().all(|r| r.1 == "gw-1"));
    // One status job for the batch, naming its receipts in the batch's order (so the two
    // receipts of provider id 1 are applied in order), on the first receipt's partition, as
    // the single endpoint routes it.
    let jobs: Vec<(Value, i32)> = sqlx::query_as(
        "SELECT payload, partition FROM outbox WHERE job_type = 'status' ORDER BY id",
    )
    .fetch_all(&api.pool)
    .await
    .unwrap();
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].0, serde_json::json!({ "receipt_ids": ids }));
    let single_route = herald_api::operations::receipt_partition(
        "gw-1",
        raws[0].as_bytes(),
        herald_core::PartitionCount::new(8).unwrap(),
    );
    assert_eq!(jobs[0].1 as u32, single_route);
}

#[tokio::test]
async fn a_batch_that_is_not_an_array_is_refused_and_kept_whole_for_parking() {
    let api = TestApi::default().await;
    let body = r#"{"provider_id":"1","status":"DELIVRD"} trailing"#;
    let response = api
        .post("/v1/providers/gw-2/receipts/batch")
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    let problem = assert_problem(response, 400, Some("body")).await;
    assert_eq!(problem["type"], "urn:herald:problem:invalid-receipt-batch");
    let rows = stored(&api).await;
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].2, body.as_bytes(), "kept byte for byte");
    let jobs: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox WHERE job_type = 'status'")
        .fetch_one(&api.pool)
        .await
        .unwrap();
    assert_eq!(jobs, 1, "its status job parks it with the raw bytes");

    // An empty array holds nothing to keep: refused, nothing written.
    let response = api
        .post("/v1/providers/gw-2/receipts/batch")
        .body("[]")
        .send()
        .await
        .unwrap();
    assert_problem(response, 422, Some("body")).await;
    assert_eq!(stored(&api).await.len(), 1);
}
