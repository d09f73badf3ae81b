//! The request timeout and the per-key rate limit. A write past the timeout is answered
//! `outcome-unknown` because it may still commit, and the retry with its key proves it did; a
//! read past it is answered `timeout`. A key past its rate gets 429 with Retry-After, writes
//! nothing, and leaves other keys alone.

use std::num::NonZeroU32;
use std::time::Duration;

use herald_api::guard::RateLimit;
use herald_api::Limits;
use serde_json::json;

use crate::auth::{credentials, BILLING, SHOP};
use crate::{assert_problem, TestApi};

fn retry_after(response: &reqwest::Response) -> u64 {
    response
        .headers()
        .get("retry-after")
        .expect("a Retry-After header")
        .to_str()
        .unwrap()
        .parse()
        .unwrap()
}

#[tokio::test]
async fn a_write_past_the_request_timeout_is_answered_unknown_and_its_retry_finds_it_stored() {
    let api = TestApi::with_limits(Limits {
        request_timeout: Duration::from_millis(500),
        ..Limits::default()
    })
    .await;
    let message = json!({"recipient": "+15550100", "body": {"text": "late"}});
    let id: String = {
        let response = api
            .post("/v1/messages")
            .json(&json!({"recipient": "+15550199", "body": {"text": "first"}}))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 202);
        response.json::<serde_json::Value>().await.unwrap()["id"]
            .as_str()
            .unwrap()
            .to_owned()
    };

    // Another transaction holds the messages table: the accept and the read both wait on it.
    let mut holder = api.pool.begin().await.unwrap();
    sqlx::query("LOCK TABLE messages IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *holder)
        .await
        .unwrap();
    let response = api
        .post("/v1/messages")
        .header("Idempotency-Key", "late-key")
        .json(&message)
        .send()
        .await
        .unwrap();
    assert_eq!(retry_after(&response), 1);
    let problem = assert_problem(response, 503, None).await;
    assert_eq!(problem["type"], "urn:herald:problem:outcome-unknown");
    let detail = problem["detail"].as_str().unwrap();
    assert!(
        detail.contains("500ms") && detail.contains("Idempotency-Key"),
        "{detail}"
    );

    let response = api.get(&format!("/v1/messages/{id}")).send().await.unwrap();
    assert_eq!(retry_after(&response), 1);
    let problem = assert_problem(response, 503, None).await;
    assert_eq!(problem["type"], "urn:herald:problem:timeout");
    assert!(problem["detail"]
        .as_str()
        .unwrap()
        .contains("nothing was changed"));

    // The lock goes; the timed-out accept was still in its group and commits now. Its retry
    // with the same key finds it: "unknown" was the honest answer, not "nothing written".
    holder.rollback().await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while api.rows().await.0 < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "the timed-out accept never committed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let retry = api
        .post("/v1/messages")
        .header("Idempotency-Key", "late-key")
        .json(&message)
        .send()
        .await
        .unwrap();
    assert_eq!(retry.status(), 202);
    assert_eq!(
        retry
            .headers()
            .get("idempotent-replayed")
            .map(|v| v.to_str().unwrap()),
        Some("true")
    );
    assert_eq!(api.rows().await.0, 2, "the retry stored nothing new");
}

#[tokio::test]
async fn a_key_past_its_rate_gets_429_writes_nothing_and_leaves_other_keys_alone() {
    let burst = 5;
    let api = TestApi::start(
        credentials(),
        Limits {
            rate_limit: Some(RateLimit {
                per_second: NonZeroU32::new(1).unwrap(),
                burst: NonZeroU32::new(burst).unwrap(),
            }),
            ..Limits::default()
        },
    )
    .await;
    let send = |key: &'static str, n: usize| {
        api.post("/v1/messages")
            .bearer_auth(key)
            .header("Idempotency-Key", format!("{key}-{n}"))
            .json(&json!({"recipient": "+15550100", "body": {"text": n.to_string()}}))
            .send()
    };
    let started = std::time::Instant::now();
    let answers = futures::future::join_all((0..20).map(|n| send(SHOP, n))).await;
    let elapsed = started.elapsed().as_secs();
    let mut accepted = 0;
    let mut limited = Vec::new();
    for response in answers {
        let response = response.unwrap();
        match response.status().as_u16() {
            202 => accepted += 1,
            429 => limited.push(response),
            other => panic!("unexpected {other}"),
        }
    }
    // The burst, plus at most one a second while the requests ran.
    assert!(
        accepted >= burst as u64 && accepted <= burst as u64 + elapsed + 1,
        "{accepted} accepted in {elapsed} s"
    );
    assert!(!limited.is_empty());
    let response = limited.pop().unwrap();
    let wait = retry_after(&response);
    assert!((1..=2).contains(&wait), "Retry-After {wait}");
    let problem = assert_problem(response, 429, None).await;
    assert_eq!(problem["type"], "urn:herald:problem:rate-limited");
    assert_eq!(
        api.rows().await.0,
        accepted as i64,
        "a refused request wrote nothing"
    );

    // Another key has its own bucket.
    let response = send(BILLING, 0).await.unwrap();
    assert_eq!(response.status(), 202);
    // And the limited key may go on once its bucket refills.
    tokio::time::sleep(Duration::from_secs(wait)).await;
    let response = send(SHOP, 100).await.unwrap();
    assert_eq!(response.status(), 202);
}
