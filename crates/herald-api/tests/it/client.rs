//! `herald-client` against the real API: what it sends is what the API takes, what it reads
//! is what the API answers, and an error arrives as its status with the problem body.

use herald_client::wire::{BatchItem, SendRequest};
use herald_client::{Client, ClientError};
use serde_json::json;

use crate::TestApi;

fn item(recipient: &str, key: Option<&str>) -> BatchItem {
    BatchItem {
        recipient: recipient.to_owned(),
        body: json!({"text": format!("to {recipient}")}),
        partition_key: None,
        idempotency_key: key.map(str::to_owned),
    }
}

#[tokio::test]
async fn the_client_sends_reads_back_and_replays_through_the_api() {
    let api = TestApi::default().await;
    let client = Client::new(&api.base, None).unwrap();

    let message = SendRequest {
        recipient: "+15550100".to_owned(),
        body: json!({"text": "hi"}),
        partition_key: Some("orders-7".to_owned()),
    };
    let first = client.send(&message, Some("client-1")).await.unwrap();
    assert!(first.created);
    assert_eq!(first.state, "QUEUED");
    let replay = client.send(&message, Some("client-1")).await.unwrap();
    assert_eq!((replay.id, replay.created), (first.id, false));

    let history = client.message(first.id).await.unwrap().expect("known");
    assert_eq!(history.recipient, "+15550100");
    assert_eq!(history.body, json!({"text": "hi"}));
    assert_eq!(history.idempotency_key.as_deref(), Some("client-1"));
    assert_eq!(history.state, "QUEUED");
    assert_eq!(history.events.len(), 1);
    assert_eq!(client.message(uuid::Uuid::now_v7()).await.unwrap(), None);

    let batch = client
        .send_batch(vec![
            item("a", Some("b-1")),
            item("b", None),
            item("c", None),
        ])
        .await
        .unwrap();
    assert_eq!(batch.messages.len(), 3);
    for accepted in &batch.messages {
        let read = client.message(accepted.id).await.unwrap().expect("known");
        assert_eq!(read.id, accepted.id);
    }
    assert_eq!(api.rows().await.0, 4, "the replay stored nothing");
}

#[tokio::test]
async fn a_refused_request_is_its_status_and_problem_and_only_some_are_worth_a_retry() {
    let api = TestApi::default().await;
    let client = Client::new(&api.base, None).unwrap();
    let empty = SendRequest {
        recipient: String::new(),
        body: json!("x"),
        partition_key: None,
    };
    let err = client.send(&empty, None).await.unwrap_err();
    let ClientError::Status {
        status, problem, ..
    } = &err
    else {
        panic!("a status, got {err:?}");
    };
    assert_eq!(*status, 422);
    let problem = problem.as_ref().expect("a problem body");
    assert_eq!(problem.status, 422);
    assert_eq!(problem.field.as_deref(), Some("recipient"));
    assert!(
        problem.kind.starts_with("urn:herald:problem:"),
        "{problem:?}"
    );
    assert!(!err.is_transient(), "a 422 is the request's fault");
    assert_eq!(err.reason(), "HTTP 422");

    // Reusing a key for other content is a conflict, not a retry.
    let one = SendRequest {
        recipient: "r".to_owned(),
        body: json!(1),
        partition_key: None,
    };
    client.send(&one, Some("k")).await.unwrap();
    let other = SendRequest {
        body: json!(2),
        ..one.clone()
    };
    let err = client.send(&other, Some("k")).await.unwrap_err();
    assert_eq!(err.status(), Some(409));
    assert!(!err.is_transient());

    // Nothing listens here: no answer at all, worth another try.
    let nowhere = Client::new("http://127.0.0.1:9", None).unwrap();
    let err = nowhere.send(&one, Some("k")).await.unwrap_err();
    assert!(matches!(err, ClientError::Transport(_)), "{err:?}");
    assert!(err.is_transient());
    assert!(!nowhere.ready().await);
}

#[tokio::test]
async fn the_client_pages_through_dead_rows_and_redrives_one() {
    let api = TestApi::default().await;
    let client = Client::new(&api.base, None).unwrap();
    let dead = api.dead_rows(3).await;
    let first = client.dead(None, 2).await.unwrap();
    assert_eq!(first.count, 3);
    let ids: Vec<i64> = first.dead.iter().map(|row| row.id).collect();
    assert_eq!(ids, dead[..2]);
    assert!(first.next.is_some());
    let rest = client.dead(Some(ids[1]), 2).await.unwrap();
    assert_eq!(
        rest.dead.iter().map(|row| row.id).collect::<Vec<_>>(),
        dead[2..]
    );
    assert!(rest.next.is_none());

    let redriven = client.redrive(dead[0]).await.unwrap();
    assert_eq!(
        (redriven.id, redriven.status.as_str()),
        (dead[0], "PENDING")
    );
    assert_eq!(client.dead(None, 10).await.unwrap().count, 2);
    assert_eq!(client.partitions().await.unwrap().partitions.len(), 8);
    assert!(client.parking(None, 10).await.unwrap().parked.is_empty());
}
