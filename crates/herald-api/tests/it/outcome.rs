//! A write whose outcome the API cannot know: the connection to PostgreSQL breaks after the
//! statement was sent. The client must not be told "nothing was written".

use std::time::Duration;

use herald_api::{ApiState, Limits};
use herald_core::PartitionCount;
use herald_testkit::TestDatabase;
use serde_json::json;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::broadcast;

/// A TCP proxy in front of PostgreSQL that can cut every connection through it at once.
struct Proxy {
    port: u16,
    cut: broadcast::Sender<()>,
}

impl Proxy {
    async fn start(target_port: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (cut, _) = broadcast::channel(1);
        let cuts = cut.clone();
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let mut outbound = TcpStream::connect(("127.0.0.1", target_port))
                    .await
                    .unwrap();
                let mut cut = cuts.subscribe();
                tokio::spawn(async move {
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = cut.recv() => {}
                    }
                    // Dropping both ends closes them without a word to either side.
                });
            }
        });
        Self { port, cut }
    }
}

#[tokio::test]
async fn a_connection_lost_after_the_insert_was_sent_is_answered_as_unknown_not_as_nothing_written()
{
    let db = TestDatabase::migrated(8).await.expect("database");
    let url = db.url();
    let direct = db.pool(4).await.unwrap();
    let proxy = Proxy::start(db.port()).await;
    let through_proxy = url.replace(&format!(":{}/", db.port()), &format!(":{}/", proxy.port));
    assert_ne!(through_proxy, url, "the proxy URL must differ: {url}");
    let api_pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect(&through_proxy)
        .await
        .unwrap();
    let state = ApiState::new(
        api_pool,
        PartitionCount::new(8).unwrap(),
        Limits::default(),
        herald_api::auth::Credentials::open_for_development(),
        herald_api::Groups::default(),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        axum::serve(listener, herald_api::router(state))
            .await
            .unwrap();
    });

    // Another transaction holds the key: the accept's insert is sent and waits on it.
    let mut holder = direct.begin().await.unwrap();
    sqlx::query(
        "INSERT INTO messages (id, partition, recipient, body, idempotency_key, request_fingerprint)
         VALUES (gen_random_uuid(), 0, 'someone', '{}', 'held-key', '\\x00')",
    )
    .execute(&mut *holder)
    .await
    .unwrap();
    let request = reqwest::Client::new()
        .post(format!("{base}/v1/messages"))
        .header("Idempotency-Key", "held-key")
        .json(&json!({"recipient": "+15550100", "body": {"text": "hi"}}))
        .send();
    let request = tokio::spawn(request);
    let waiting = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM pg_stat_activity
             WHERE wait_event_type = 'Lock' AND query LIKE '%INSERT INTO messages%'",
        )
        .fetch_one(&direct)
        .await
        .unwrap()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while waiting().await == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the accept never reached the database"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The statement is in the server's hands; the connection breaks before any answer.
    proxy.cut.send(()).unwrap();
    let response = request.await.unwrap().unwrap();
    let problem = crate::assert_problem(response, 503, None).await;
    assert_eq!(
        problem["type"], "urn:herald:problem:outcome-unknown",
        "{problem}"
    );
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("Idempotency-Key"),
        "{problem}"
    );
    holder.rollback().await.unwrap();
}
