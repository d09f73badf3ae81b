//! Open-loop load: requests leave on a fixed schedule (constant or stepped rate) whatever the
//! API's response times, and every latency is measured from the moment a request was *due*,
//! not from when it left. A slow API therefore shows up as latency instead of quietly
//! lowering the offered rate (coordinated omission).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use hdrhistogram::Histogram;
use herald_client::wire::{AcceptedMessage, BatchItem, SendRequest};
use herald_client::{Client, ClientError};
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::latency;

/// One phase of the schedule: `rate` messages per second for `duration`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Phase {
    pub rate: f64,
    #[serde(with = "crate::report::seconds")]
    pub duration: Duration,
}

/// What to send and how.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LoadSettings {
    pub phases: Vec<Phase>,
    /// Messages per request (1: `POST /v1/messages`, more: `POST /v1/messages/batch`).
    pub batch: usize,
    /// Bytes of text in each message body.
    pub payload_bytes: usize,
    /// Distinct recipients (chosen at random).
    pub recipients: u64,
    /// Distinct partition keys (0: none sent, so the recipient is the partition key).
    pub partition_keys: u64,
    /// Share of accepted requests sent once more with the same Idempotency-Key; the answer
    /// must name the same ids.
    pub replay_rate: f64,
    /// Retries of a request that failed in transport or with a 5xx, same key each time.
    pub retries: u32,
    /// Requests in flight at most; a due request beyond it is counted as not sent.
    pub max_in_flight: usize,
    #[serde(with = "crate::report::seconds")]
    pub request_timeout: Duration,
    pub seed: u64,
}

impl LoadSettings {
    /// One steady phase of `rate` for `duration`, as the benchmarks send it: 10,000
    /// recipients, no partition keys, no replays, 3 retries with the same key; a seed of
    /// its own unless given.
    pub fn steady(
        rate: f64,
        duration: Duration,
        batch: usize,
        payload_bytes: usize,
        seed: Option<u64>,
    ) -> Self {
        Self {
            phases: vec![Phase { rate, duration }],
            batch,
            payload_bytes,
            recipients: 10_000,
            partition_keys: 0,
            replay_rate: 0.0,
            retries: 3,
            max_in_flight: 512,
            request_timeout: Duration::from_secs(30),
            seed: seed.unwrap_or_else(rand::random),
        }
    }

    pub fn duration(&self) -> Duration {
        self.phases.iter().map(|p| p.duration).sum()
    }

    pub fn offered(&self) -> u64 {
        self.phases
            .iter()
            .map(|p| (p.rate * p.duration.as_secs_f64()).round() as u64)
            .sum()
    }
}

/// One second of the run, as the client saw it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Second {
    pub offered: u64,
    pub accepted: u64,
    pub errors: u64,
    pub accept_p99_ms: f64,
    pub accept_max_ms: f64,
}

/// What the load produced.
pub struct LoadOutcome {
    /// Every id the API answered 2xx for, with the second (since the start) it was due.
    pub accepted: Vec<(Uuid, f64)>,
    pub accept_latency: Histogram<u64>,
    pub requests: u64,
    pub messages_due: u64,
    /// Due messages never sent because `max_in_flight` requests were waiting.
    pub not_sent: u64,
    /// Messages whose request failed after every retry, by reason.
    pub errors: std::collections::BTreeMap<String, u64>,
    pub retries: u64,
    pub replays: u64,
    pub replay_mismatches: u64,
    pub timeline: Vec<Second>,
    pub elapsed: Duration,
}

#[derive(Default)]
struct Shared {
    accepted: Vec<(Uuid, f64)>,
    errors: std::collections::BTreeMap<String, u64>,
    retries: u64,
    replays: u64,
    replay_mismatches: u64,
    not_sent: u64,
    seconds: Vec<(Second, Option<Histogram<u64>>)>,
}

impl Shared {
    fn second(&mut self, at: f64) -> &mut (Second, Option<Histogram<u64>>) {
        let index = at.max(0.0) as usize;
        if self.seconds.len() <= index {
            self.seconds.resize_with(index + 1, Default::default);
        }
        &mut self.seconds[index]
    }
}

/// A live view for the progress bar.
#[derive(Clone, Default)]
pub struct Progress(Arc<Mutex<Shared>>);

impl Progress {
    /// Accepted messages, failed messages, requests not sent so far.
    pub fn counts(&self) -> (u64, u64, u64) {
        let shared = self.0.lock().expect("load lock");
        (
            shared.accepted.len() as u64,
            shared.errors.values().sum(),
            shared.not_sent,
        )
    }
}

/// Runs the schedule against `api_url` (with `api_key` as the bearer key, if any) until it ends
/// or `cancel`; waits for requests in flight (up to their timeout and retries) before
/// returning.
pub async fn run(
    api_url: &str,
    api_key: Option<&str>,
    settings: &LoadSettings,
    run_id: &str,
    progress: Progress,
    started: Instant,
    cancel: CancellationToken,
) -> anyhow::Result<LoadOutcome> {
    let http = herald_client::http_builder(api_key)?
        .timeout(settings.request_timeout)
        .pool_max_idle_per_host(settings.max_in_flight)
        .build()?;
    let client = Client::from_http(api_url, http);
    let batch = settings.batch.clamp(1, 1000);
    let in_flight = Arc::new(Semaphore::new(settings.max_in_flight.max(1)));
    let accept_latency = Arc::new(Mutex::new(latency::histogram()));
    let mut rng = rand::rngs::StdRng::seed_from_u64(settings.seed);
    let body_text = "x".repeat(settings.payload_bytes);
    let mut tasks = tokio::task::JoinSet::new();
    let (mut requests, mut messages_due, mut sequence) = (0u64, 0u64, 0u64);
    let mut phase_start = Duration::ZERO;
    'phases: for phase in &settings.phases {
        let per_request = Duration::from_secs_f64(batch as f64 / phase.rate.max(0.001));
        let count = ((phase.rate * phase.duration.as_secs_f64()) / batch as f64).round() as u64;
        for n in 0..count {
            let due_offset = phase_start + per_request.mul_f64(n as f64);
            let due = started + due_offset;
            tokio::select! {
                _ = cancel.cancelled() => break 'phases,
                _ = tokio::time::sleep_until(due) => {}
            }
            let due_s = due_offset.as_secs_f64();
            let messages: Vec<Item> = (0..batch)
                .map(|_| {
                    sequence += 1;
                    Item::random(&mut rng, settings, run_id, sequence, &body_text)
                })
                .collect();
            messages_due += messages.len() as u64;
            requests += 1;
            {
                let mut shared = progress.0.lock().expect("load lock");
                shared.second(due_s).0.offered += messages.len() as u64;
            }
            let Ok(permit) = in_flight.clone().try_acquire_owned() else {
                progress.0.lock().expect("load lock").not_sent += messages.len() as u64;
                continue;
            };
            let replay = rng.random_bool(settings.replay_rate.clamp(0.0, 1.0));
            let request = Request {
                client: client.clone(),
                messages,
                single: settings.batch == 1,
                retries: settings.retries,
                replay,
            };
            let (shared, histogram) = (progress.0.clone(), accept_latency.clone());
            tasks.spawn(async move {
                request.send(due, due_s, &shared, &histogram).await;
                drop(permit);
            });
        }
        phase_start += phase.duration;
    }
    while tasks.join_next().await.is_some() {}
    let elapsed = started.elapsed();
    let mut shared = std::mem::take(&mut *progress.0.lock().expect("load lock"));
    let timeline = shared
        .seconds
        .drain(..)
        .map(|(mut second, histogram)| {
            if let Some(h) = histogram {
                second.accept_p99_ms = h.value_at_quantile(0.99) as f64 / 1000.0;
                second.accept_max_ms = h.max() as f64 / 1000.0;
            }
            second
        })
        .collect();
    let accept_latency = accept_latency.lock().expect("latency lock").clone();
    Ok(LoadOutcome {
        accepted: shared.accepted,
        accept_latency,
        requests,
        messages_due,
        not_sent: shared.not_sent,
        errors: shared.errors,
        retries: shared.retries,
        replays: shared.replays,
        replay_mismatches: shared.replay_mismatches,
        timeline,
        elapsed,
    })
}

/// One message to send.
#[derive(Debug, Clone)]
struct Item {
    recipient: String,
    partition_key: Option<String>,
    key: String,
    body: serde_json::Value,
}

impl Item {
    fn random(
        rng: &mut impl Rng,
        settings: &LoadSettings,
        run_id: &str,
        sequence: u64,
        text: &str,
    ) -> Self {
        let recipient = format!(
            "+1555{:07}",
            rng.random_range(0..settings.recipients.max(1))
        );
        let partition_key = (settings.partition_keys > 0)
            .then(|| format!("pk-{}", rng.random_range(0..settings.partition_keys)));
        Self {
            recipient,
            partition_key,
            key: format!("{run_id}-{sequence}"),
            body: serde_json::json!({ "text": text, "n": sequence }),
        }
    }
}

struct Request {
    client: Client,
    messages: Vec<Item>,
    single: bool,
    retries: u32,
    replay: bool,
}

impl Request {
    async fn send(
        &self,
        due: Instant,
        due_s: f64,
        shared: &Mutex<Shared>,
        histogram: &Mutex<Histogram<u64>>,
    ) {
        let mut attempt = 0;
        let answer = loop {
            match self.post().await {
                Ok(answer) => break Ok(answer),
                Err(err) if err.is_transient() && attempt < self.retries => {
                    attempt += 1;
                    shared.lock().expect("load lock").retries += 1;
                    let backoff = Duration::from_millis(100 << attempt.min(5));
                    tracing::debug!(reason = %err, attempt, "retrying with the same Idempotency-Key");
                    tokio::time::sleep(backoff).await;
                }
                Err(err) => break Err(err.reason()),
            }
        };
        let latency = due.elapsed().as_secs_f64();
        let n = self.messages.len() as u64;
        let answer = match answer {
            Ok(answer) => answer,
            Err(reason) => {
                let mut shared = shared.lock().expect("load lock");
                *shared.errors.entry(reason).or_default() += n;
                shared.second(due_s).0.errors += n;
                return;
            }
        };
        latency::record(&mut histogram.lock().expect("latency lock"), latency);
        {
            let mut shared = shared.lock().expect("load lock");
            let second = shared.second(due_s);
            second.0.accepted += n;
            latency::record(second.1.get_or_insert_with(latency::histogram), latency);
            shared.accepted.extend(answer.iter().map(|m| (m.id, due_s)));
        }
        if self.replay {
            let again = self.post().await;
            let mut shared = shared.lock().expect("load lock");
            shared.replays += n;
            match again {
                Ok(replayed) => {
                    let mismatched = answer
                        .iter()
                        .zip(&replayed)
                        .filter(|(first, second)| first.id != second.id)
                        .count();
                    shared.replay_mismatches += mismatched as u64;
                }
                Err(err) => {
                    *shared
                        .errors
                        .entry(format!("replay: {}", err.reason()))
                        .or_default() += n;
                }
            }
        }
    }

    async fn post(&self) -> Result<Vec<AcceptedMessage>, ClientError> {
        if self.single {
            let item = &self.messages[0];
            let message = SendRequest {
                recipient: item.recipient.clone(),
                body: item.body.clone(),
                partition_key: item.partition_key.clone(),
            };
            let accepted = self.client.send(&message, Some(&item.key)).await?;
            return Ok(vec![accepted]);
        }
        let messages = self
            .messages
            .iter()
            .map(|item| BatchItem {
                recipient: item.recipient.clone(),
                body: item.body.clone(),
                partition_key: item.partition_key.clone(),
                idempotency_key: Some(item.key.clone()),
            })
            .collect();
        Ok(self.client.send_batch(messages).await?.messages)
    }
}

/// Parses `500,1000,2000` into rates.
pub fn parse_rates(text: &str) -> anyhow::Result<Vec<f64>> {
    text.split(',')
        .map(|part| {
            let rate: f64 = part.trim().parse()?;
            anyhow::ensure!(rate > 0.0, "a rate must be above 0, got {rate}");
            Ok(rate)
        })
        .collect()
}
