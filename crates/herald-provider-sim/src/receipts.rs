//! Delivery receipts the simulator posts back to Herald, like a real gateway: intermediate and
//! final ones, gateways that go silent after the intermediate one, statuses outside the known
//! vocabulary and timestamps in several formats, some malformed — each by a configurable rate.
//! Every post is signed with its gateway's secret (`Herald-Signature`, see
//! `herald_core::signature`) when it was given one, freshly for every retry.
//!
//! Longer than 400 lines with its unit tests (the code is about 360).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};
use tokio_util::task::TaskTracker;

use crate::record::{Record, SubmitAnswer};

/// The injected submit faults, changeable at run time through `PUT /v1/faults`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Faults {
    pub error_rate: f64,
    pub timeout_rate: f64,
    /// Share of submits refused for their content (422), with no effect: a permanent
    /// rejection the caller caused.
    #[serde(default)]
    pub reject_rate: f64,
}

/// Each gateway's receipt signing secret. Its `Debug` names the gateways, never a secret.
#[derive(Clone, Default)]
pub struct ReceiptSecrets(pub HashMap<String, Vec<u8>>);

impl std::fmt::Debug for ReceiptSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut gateways: Vec<&String> = self.0.keys().collect();
        gateways.sort();
        f.debug_tuple("ReceiptSecrets").field(&gateways).finish()
    }
}

/// What receipts a submit gets.
#[derive(Debug, Clone, PartialEq)]
pub struct ReceiptRates {
    /// Wait between a submit and its first receipt (and between intermediate and final).
    pub delay: Duration,
    /// Share of submits that get an intermediate ENROUTE before the final receipt.
    pub enroute_rate: f64,
    /// Share of submits that get only the intermediate receipt, never a final one.
    pub silent_rate: f64,
    /// Share of final receipts with a status outside the known vocabulary.
    pub unknown_status_rate: f64,
    /// Share of receipts with a malformed timestamp.
    pub bad_timestamp_rate: f64,
    /// Share of final receipts that say UNDELIV, and EXPIRED; the rest say DELIVRD.
    pub undelivered_rate: f64,
    pub expired_rate: f64,
    /// Most receipts in one post to Herald's batch endpoint; 1 posts each receipt on its own
    /// to the single endpoint, like a gateway that cannot batch.
    pub post_batch: usize,
}

impl Default for ReceiptRates {
    fn default() -> Self {
        Self {
            delay: Duration::from_millis(50),
            enroute_rate: 0.5,
            silent_rate: 0.0,
            unknown_status_rate: 0.0,
            bad_timestamp_rate: 0.0,
            undelivered_rate: 0.0,
            expired_rate: 0.0,
            post_batch: 100,
        }
    }
}

impl ReceiptRates {
    pub fn validate(&self) -> Result<(), crate::SimError> {
        for (name, rate) in [
            ("enroute", self.enroute_rate),
            ("silent", self.silent_rate),
            ("unknown status", self.unknown_status_rate),
            ("bad timestamp", self.bad_timestamp_rate),
            ("undelivered", self.undelivered_rate),
            ("expired", self.expired_rate),
        ] {
            crate::require((0.0..=1.0).contains(&rate), || {
                format!("{name} rate must be within 0..=1, got {rate}")
            })?;
        }
        crate::require(self.post_batch >= 1, || {
            "the receipt batch must be at least 1".to_owned()
        })?;
        crate::require(self.undelivered_rate + self.expired_rate <= 1.0, || {
            "undelivered and expired rates add up to more than 1".to_owned()
        })?;
        Ok(())
    }
}

/// Posts receipts in the background, retrying while Herald is unreachable or busy, like a
/// gateway's callback workers: a bounded number of posts at once, each retried for up to
/// [`GIVE_UP_AFTER`]. With `post_batch` above 1, receipts that are due while earlier posts
/// are in flight go together in one post to the batch endpoint (no timer: a lone receipt is
/// posted at once).
#[derive(Clone)]
pub struct Sender {
    client: herald_client::Client,
    /// Each gateway's signing secret; a gateway without one posts unsigned.
    secrets: Arc<ReceiptSecrets>,
    rates: Arc<ReceiptRates>,
    record: Arc<tokio::sync::Mutex<Record>>,
    posts: Arc<tokio::sync::Semaphore>,
    /// Receipts waiting for a batch post, and the batcher's end of the queue until it starts.
    queue: mpsc::UnboundedSender<Queued>,
    batcher: Arc<std::sync::Mutex<Option<mpsc::UnboundedReceiver<Queued>>>>,
    /// Every receipt's delivery (its delays, posts and retries) and every batch post: what a
    /// shutdown waits for ([`crate::Background`]). The batcher's loop is not in it: it lives
    /// as long as the simulator and holds no receipt of its own.
    tasks: TaskTracker,
}

/// A receipt waiting for a batch post: its gateway, body, and who to tell whether it landed.
type Queued = (String, Value, oneshot::Sender<bool>);

/// Receipt posts in flight at once, one receipt each.
const CONCURRENT_POSTS: usize = 64;
/// Batch posts in flight at once: fewer than single posts, so receipts gather into batches
/// while they run.
const CONCURRENT_BATCH_POSTS: usize = 8;
/// How long a receipt is retried before the simulator gives up on it (and counts it).
const GIVE_UP_AFTER: Duration = Duration::from_secs(600);

impl Sender {
    pub fn new(
        base: &str,
        secrets: ReceiptSecrets,
        rates: ReceiptRates,
        record: Arc<tokio::sync::Mutex<Record>>,
        tasks: TaskTracker,
    ) -> Result<Self, crate::SimError> {
        let (queue, batcher) = mpsc::unbounded_channel();
        let slots = if rates.post_batch > 1 {
            CONCURRENT_BATCH_POSTS
        } else {
            CONCURRENT_POSTS
        };
        Ok(Self {
            client: herald_client::Client::from_http(
                base,
                reqwest::Client::builder()
                    .timeout(Duration::from_secs(5))
                    .build()?,
            ),
            secrets: Arc::new(secrets),
            rates: Arc::new(rates),
            record,
            posts: Arc::new(tokio::sync::Semaphore::new(slots)),
            queue,
            batcher: Arc::new(std::sync::Mutex::new(Some(batcher))),
            tasks,
        })
    }

    /// Schedules the receipts of one first submit of `key`. What will be sent is recorded
    /// first, so a proof can compare the state Herald ends in with the receipts it got.
    pub fn schedule(&self, key: &str, answer: &SubmitAnswer) {
        let (bodies, plan) = self.compose(answer);
        let sender = self.clone();
        let gateway = answer.gateway.clone();
        let key = key.to_owned();
        self.tasks.spawn(async move {
            if let Err(err) = sender.record.lock().await.plan_receipts(&key, plan) {
                tracing::error!(error = %err, "cannot append the receipt plan to the submit log");
            }
            for body in bodies {
                tokio::time::sleep(sender.rates.delay).await;
                sender.post(&gateway, body).await;
            }
        });
    }

    fn compose(&self, answer: &SubmitAnswer) -> (Vec<Value>, Vec<PlannedReceipt>) {
        let rates = &self.rates;
        let mut rng = rand::rng();
        let mut statuses = Vec::with_capacity(2);
        let silent = rng.random_bool(rates.silent_rate);
        if silent || rng.random_bool(rates.enroute_rate) {
            statuses.push("ENROUTE");
        }
        if !silent {
            let roll: f64 = rng.random();
            statuses.push(if rng.random_bool(rates.unknown_status_rate) {
                "ACKD"
            } else if roll < rates.undelivered_rate {
                "UNDELIV"
            } else if roll < rates.undelivered_rate + rates.expired_rate {
                "EXPIRED"
            } else {
                "DELIVRD"
            });
        }
        statuses
            .into_iter()
            .map(|status| {
                let (timestamp, malformed) = timestamp(&mut rng, rates.bad_timestamp_rate);
                let body = json!({
                    "provider_id": answer.provider_id,
                    "status": status,
                    "timestamp": timestamp,
                });
                let plan = PlannedReceipt {
                    status: status.to_owned(),
                    malformed_timestamp: malformed,
                };
                (body, plan)
            })
            .unzip()
    }

    async fn post(&self, gateway: &str, body: Value) {
        let landed = if self.rates.post_batch > 1 {
            self.post_batched(gateway, body).await
        } else {
            self.post_with_retries(gateway, &body, 1, false).await
        };
        self.record.lock().await.count_receipt(landed);
    }

    /// Queues the receipt for the next batch post and waits for its answer.
    async fn post_batched(&self, gateway: &str, body: Value) -> bool {
        let waiting = self.batcher.lock().expect("batcher lock").take();
        if let Some(waiting) = waiting {
            tokio::spawn(self.clone().run_batches(waiting));
        }
        let (landed, answer) = oneshot::channel();
        if self.queue.send((gateway.to_owned(), body, landed)).is_err() {
            return false;
        }
        answer.await.unwrap_or(false)
    }

    /// Takes every receipt that is waiting when a post slot is free (at most `post_batch`),
    /// and posts each gateway's share as one batch.
    async fn run_batches(self, mut waiting: mpsc::UnboundedReceiver<Queued>) {
        loop {
            let Ok(slot) = self.posts.clone().acquire_owned().await else {
                return;
            };
            let Some(first) = waiting.recv().await else {
                return;
            };
            let mut taken = vec![first];
            while taken.len() < self.rates.post_batch {
                match waiting.try_recv() {
                    Ok(next) => taken.push(next),
                    Err(_) => break,
                }
            }
            let mut by_gateway: std::collections::BTreeMap<
                String,
                Vec<(Value, oneshot::Sender<bool>)>,
            > = Default::default();
            for (gateway, body, landed) in taken {
                by_gateway.entry(gateway).or_default().push((body, landed));
            }
            let sender = self.clone();
            self.tasks.spawn(async move {
                for (gateway, receipts) in by_gateway {
                    let (bodies, answers): (Vec<Value>, Vec<_>) = receipts.into_iter().unzip();
                    let landed = sender
                        .post_with_retries(&gateway, &Value::Array(bodies), 0, true)
                        .await;
                    for answer in answers {
                        let _ = answer.send(landed);
                    }
                }
                drop(slot);
            });
        }
    }

    /// Posts `body` (an array of receipts to the batch endpoint when `batch`) until Herald
    /// takes it (true), refuses it (4xx, false) or [`GIVE_UP_AFTER`] passed (false), signed
    /// with `gateway`'s secret at each try. `slots` post slots are taken per try (0: the
    /// caller holds one).
    async fn post_with_retries(
        &self,
        gateway: &str,
        body: &Value,
        slots: u32,
        batch: bool,
    ) -> bool {
        // The signature covers these exact bytes: serialised once, sent as they are.
        let bytes = match serde_json::to_vec(body) {
            Ok(bytes) => bytes,
            Err(err) => {
                tracing::error!(error = %err, "cannot serialise a receipt");
                return false;
            }
        };
        let secret = self.secrets.0.get(gateway);
        let mut delay = Duration::from_millis(100);
        let give_up = tokio::time::Instant::now() + GIVE_UP_AFTER;
        while tokio::time::Instant::now() < give_up {
            let answer = {
                let _slot = if slots > 0 {
                    match self.posts.acquire_many(slots).await {
                        Ok(slot) => Some(slot),
                        Err(_) => break,
                    }
                } else {
                    None
                };
                let signature = secret.map(|secret| {
                    let now = chrono::Utc::now().timestamp();
                    herald_core::signature::sign(secret, now, &bytes)
                });
                let (body, signature) = (bytes.clone(), signature.as_deref());
                if batch {
                    self.client
                        .receipts(gateway, body, signature)
                        .await
                        .map(drop)
                } else {
                    self.client
                        .receipt(gateway, body, signature)
                        .await
                        .map(drop)
                }
            };
            match answer {
                Ok(()) => return true,
                Err(err) if !err.is_transient() => {
                    tracing::error!(error = %err, gateway, batch, "Herald refused a receipt");
                    return false;
                }
                Err(_) => {
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(5));
                }
            }
        }
        tracing::error!(gateway, batch, "gave up posting a receipt");
        false
    }
}

/// One receipt the simulator sends for a submit, as recorded for the proof.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedReceipt {
    pub status: String,
    pub malformed_timestamp: bool,
}

/// A receipt timestamp in one of the three formats gateways use, or a malformed one (true).
fn timestamp(rng: &mut impl Rng, bad_rate: f64) -> (Value, bool) {
    if rng.random_bool(bad_rate) {
        let bad = match rng.random_range(0..3) {
            0 => json!("not-a-time"),
            1 => json!("2613451299"), // month 13, day 45
            _ => json!("12/02/2026 15:04"),
        };
        return (bad, true);
    }
    let now = chrono::Utc::now();
    let good = match rng.random_range(0..3) {
        0 => json!(now.to_rfc3339()),
        1 => json!(now.timestamp()),
        _ => json!(now.format("%y%m%d%H%M").to_string()),
    };
    (good, false)
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use axum::body::Bytes;
    use axum::http::{HeaderMap, StatusCode};
    use axum::response::IntoResponse;
    use axum::routing::post;
    use herald_core::signature;

    use super::*;

    /// What the fake API saw: each post's signature header and body.
    type Seen = Arc<Mutex<Vec<(Option<String>, Vec<u8>)>>>;

    /// An API that answers 503 to the first post and 202 to the rest.
    async fn fake_api(seen: Seen) -> String {
        let app = axum::Router::new().route(
            "/v1/providers/{gateway}/receipts",
            post(move |headers: HeaderMap, body: Bytes| {
                let seen = seen.clone();
                async move {
                    let mut seen = seen.lock().unwrap();
                    let header = headers
                        .get(signature::HEADER)
                        .map(|v| v.to_str().unwrap().to_owned());
                    seen.push((header, body.to_vec()));
                    if seen.len() == 1 {
                        StatusCode::SERVICE_UNAVAILABLE.into_response()
                    } else {
                        (
                            StatusCode::ACCEPTED,
                            axum::Json(json!({"receipt_id": seen.len()})),
                        )
                            .into_response()
                    }
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        base
    }

    #[tokio::test]
    async fn every_post_and_every_retry_is_signed_over_the_bytes_it_sends() {
        let seen = Seen::default();
        let base = fake_api(seen.clone()).await;
        let dir = tempfile::tempdir().unwrap();
        let gateways = ["gw-a".to_owned(), "gw-b".to_owned()];
        let record = Arc::new(tokio::sync::Mutex::new(
            Record::open(&dir.path().join("log.jsonl"), &gateways, 100).unwrap(),
        ));
        let secret = b"the-secret-of-gateway-a".to_vec();
        let secrets = ReceiptSecrets(HashMap::from([("gw-a".to_owned(), secret.clone())]));
        let rates = ReceiptRates {
            post_batch: 1,
            ..ReceiptRates::default()
        };
        let sender = Sender::new(&base, secrets, rates, record, TaskTracker::new()).unwrap();
        let body = json!({"provider_id": "1", "status": "DELIVRD", "timestamp": 1_760_000_000});
        assert!(sender.post_with_retries("gw-a", &body, 1, false).await);
        assert!(sender.post_with_retries("gw-b", &body, 1, false).await);

        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 3, "a refused post, its retry, and gw-b's post");
        let now = chrono::Utc::now().timestamp();
        for (header, bytes) in &seen[..2] {
            assert_eq!(bytes, &serde_json::to_vec(&body).unwrap());
            assert_eq!(
                signature::verify(&[&secret], header.as_deref(), bytes, now, 60),
                Ok(()),
                "{header:?}"
            );
        }
        assert_eq!(seen[2].0, None, "a gateway without a secret posts unsigned");
    }

    /// A stopping simulator knows what it still owes: a receipt waiting for an API that does
    /// not take it yet is still running after the grace, and counted; one the API took is
    /// not.
    #[tokio::test]
    async fn a_stopping_simulator_counts_the_receipts_it_still_owes() {
        let seen = Seen::default();
        let base = fake_api(seen.clone()).await;
        let dir = tempfile::tempdir().unwrap();
        let gateways = ["gw-a".to_owned()];
        let record = Arc::new(tokio::sync::Mutex::new(
            Record::open(&dir.path().join("log.jsonl"), &gateways, 100).unwrap(),
        ));
        let rates = ReceiptRates {
            enroute_rate: 0.0,
            post_batch: 1,
            ..ReceiptRates::default()
        };
        let tasks = TaskTracker::new();
        let sender = Sender::new(&base, Default::default(), rates, record, tasks.clone()).unwrap();
        let answer = SubmitAnswer {
            provider_id: "1".to_owned(),
            gateway: "gw-a".to_owned(),
            duplicate: false,
        };
        sender.schedule("key-1", &answer);
        let background = crate::Background { tasks };
        assert_eq!(background.running(), 1, "the receipt's delivery is tracked");
        // Not even its first post yet (the receipt waits 50 ms): still owed after 1 ms.
        assert_eq!(background.finish(Duration::from_millis(1)).await, 1);
        // The first post is refused (503) and retried; the retry lands.
        assert_eq!(background.finish(Duration::from_secs(10)).await, 0);
        assert_eq!(
            seen.lock().unwrap().len(),
            2,
            "a refused post and its retry"
        );
    }
}
