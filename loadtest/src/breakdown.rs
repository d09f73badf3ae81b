//! Where the time went: every role's `/metrics` is scraped before, during (every 2 s, so a
//! killed role's counters are not lost) and after the run, and each stage's histogram
//! `_sum` / `_count` increase is added up — total seconds, calls, mean — then compared with
//! the previous run to call out the stage that grew most: the new wall.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

/// The stages of one message's path, in path order: (name, histogram, what it times).
pub const STAGES: [(&str, &str, &str); 7] = [
    (
        "accept",
        "herald_accept_transaction_duration_seconds",
        "api: accept transaction (messages, receipts)",
    ),
    (
        "claim",
        "herald_outbox_claim_duration_seconds",
        "poller: claim a batch",
    ),
    (
        "publish",
        "herald_queue_publish_duration_seconds",
        "poller: pipelined XADDs",
    ),
    (
        "mark",
        "herald_outbox_mark_duration_seconds",
        "poller: batch PUBLISHED",
    ),
    (
        "confirm",
        "herald_ownership_confirm_duration_seconds",
        "worker: DONE + CLAIMED",
    ),
    (
        "provider call",
        "herald_provider_call_duration_seconds",
        "worker: provider submit",
    ),
    (
        "ledger",
        "herald_ledger_write_duration_seconds",
        "worker: ledger row + ACCEPTED",
    ),
];

/// `_sum` and `_count` of every histogram or summary in a scrape, summed over label sets.
pub fn parse(text: &str) -> HashMap<String, (f64, f64)> {
    let mut out: HashMap<String, (f64, f64)> = HashMap::new();
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let (series, value) = match line.rsplit_once(' ') {
            Some((series, value)) => (series.trim(), value.trim()),
            None => continue,
        };
        let name = series.split('{').next().unwrap_or(series);
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        if let Some(base) = name.strip_suffix("_sum") {
            out.entry(base.to_owned()).or_default().0 += value;
        } else if let Some(base) = name.strip_suffix("_count") {
            out.entry(base.to_owned()).or_default().1 += value;
        }
    }
    out
}

/// Increases of `_sum` and `_count` per role and histogram, across scrapes. A value lower
/// than the last one means the role restarted: its counters began again at zero, so the new
/// value is the increase since the restart.
#[derive(Debug, Default, Clone)]
pub struct Accumulator {
    last: HashMap<(String, String), (f64, f64)>,
    total: HashMap<(String, String), (f64, f64)>,
    fresh: std::collections::HashSet<String>,
    pub resets: BTreeMap<String, u64>,
}

impl Accumulator {
    pub fn observe(&mut self, role: &str, scrape: HashMap<String, (f64, f64)>) {
        // A role seen before, or one known to have started again, counts every histogram it
        // did not have last time from zero; the first scrape of a role is only the baseline.
        let from_zero = self.fresh.remove(role) || self.seen_role(role);
        for (metric, (sum, count)) in scrape {
            let key = (role.to_owned(), metric);
            let total = self.total.entry(key.clone()).or_default();
            match self.last.get(&key).copied() {
                Some((last_sum, last_count)) if count < last_count || sum < last_sum => {
                    *self.resets.entry(role.to_owned()).or_default() += 1;
                    total.0 += sum;
                    total.1 += count;
                }
                Some((last_sum, last_count)) => {
                    total.0 += sum - last_sum;
                    total.1 += count - last_count;
                }
                None if from_zero => {
                    total.0 += sum;
                    total.1 += count;
                }
                None => {}
            }
            self.last.insert(key, (sum, count));
        }
    }

    /// The role was stopped and is starting again: its counters begin at zero.
    pub fn restarted(&mut self, role: &str) {
        self.last.retain(|(r, _), _| r != role);
        self.fresh.insert(role.to_owned());
        *self.resets.entry(role.to_owned()).or_default() += 1;
    }

    fn seen_role(&self, role: &str) -> bool {
        self.last.keys().any(|(r, _)| r == role)
    }

    /// The breakdown over every stage, with `messages` delivered to normalise by.
    pub fn stages(&self, messages: u64) -> Vec<Stage> {
        STAGES
            .iter()
            .map(|(name, metric, what)| {
                let mut stage = Stage {
                    name: (*name).to_owned(),
                    metric: (*metric).to_owned(),
                    what: (*what).to_owned(),
                    ..Stage::default()
                };
                for ((role, m), (sum, count)) in &self.total {
                    if m == metric && *count > 0.0 {
                        stage.seconds += sum;
                        stage.calls += *count as u64;
                        stage.roles.push(role.clone());
                    }
                }
                stage.roles.sort();
                if stage.calls > 0 {
                    stage.mean_ms = stage.seconds * 1000.0 / stage.calls as f64;
                }
                if messages > 0 {
                    stage.ms_per_message = stage.seconds * 1000.0 / messages as f64;
                }
                stage
            })
            .collect()
    }
}

/// One stage of the breakdown.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Stage {
    pub name: String,
    pub metric: String,
    pub what: String,
    /// Seconds spent in the stage, over every role and concurrent task.
    pub seconds: f64,
    pub calls: u64,
    pub mean_ms: f64,
    /// Stage time per delivered message (calls cover batches or single messages).
    pub ms_per_message: f64,
    pub roles: Vec<String>,
}

/// The stage called out: the one whose time per message grew most since the previous run,
/// or without one, the stage that costs most per message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Wall {
    pub stage: String,
    /// Against the previous run (its file), or None for the largest stage of this run.
    pub previous: Option<String>,
    pub ms_per_message: f64,
    pub previous_ms_per_message: Option<f64>,
}

pub fn wall(stages: &[Stage], previous: Option<(&str, &[Stage])>) -> Option<Wall> {
    match previous {
        Some((file, before)) => stages
            .iter()
            .filter_map(|stage| {
                let old = before.iter().find(|s| s.name == stage.name)?;
                Some((stage, old, stage.ms_per_message - old.ms_per_message))
            })
            .max_by(|a, b| a.2.total_cmp(&b.2))
            .map(|(stage, old, _)| Wall {
                stage: stage.name.clone(),
                previous: Some(file.to_owned()),
                ms_per_message: stage.ms_per_message,
                previous_ms_per_message: Some(old.ms_per_message),
            }),
        None => stages
            .iter()
            .filter(|s| s.calls > 0)
            .max_by(|a, b| a.ms_per_message.total_cmp(&b.ms_per_message))
            .map(|stage| Wall {
                stage: stage.name.clone(),
                previous: None,
                ms_per_message: stage.ms_per_message,
                previous_ms_per_message: None,
            }),
    }
}

/// Scrapes `targets` (role, base URL) every `every` until finished, then once more.
pub struct Scraper {
    handle: ScrapeHandle,
    task: tokio::task::JoinHandle<()>,
    stop: CancellationToken,
}

/// What chaos steps use: scrape a role right before it is stopped, and tell the accumulator
/// when it starts again, so no increase is lost or counted twice.
#[derive(Clone)]
pub struct ScrapeHandle {
    accumulator: Arc<Mutex<Accumulator>>,
    targets: Arc<Vec<(String, String)>>,
    client: reqwest::Client,
}

impl ScrapeHandle {
    /// Scrapes `role` now (its last words before a kill or SIGTERM).
    pub async fn scrape_role(&self, role: &str) {
        let targets: Vec<_> = self
            .targets
            .iter()
            .filter(|(r, _)| r == role)
            .cloned()
            .collect();
        scrape_all(&self.client, &targets, &self.accumulator).await;
    }

    /// `role` is down and will start from zero.
    pub fn restarted(&self, role: &str) {
        self.accumulator
            .lock()
            .expect("scrape lock")
            .restarted(role);
    }
}

impl Scraper {
    /// Takes the first scrape of every target before returning, so the run starts from it.
    pub async fn start(targets: Vec<(String, String)>, every: Duration) -> Self {
        let handle = ScrapeHandle {
            accumulator: Arc::new(Mutex::new(Accumulator::default())),
            targets: Arc::new(targets),
            client: reqwest::Client::new(),
        };
        scrape_all(&handle.client, &handle.targets, &handle.accumulator).await;
        let stop = CancellationToken::new();
        let task = tokio::spawn({
            let (handle, stop) = (handle.clone(), stop.clone());
            async move {
                loop {
                    tokio::select! {
                        _ = stop.cancelled() => break,
                        _ = tokio::time::sleep(every) => {}
                    }
                    scrape_all(&handle.client, &handle.targets, &handle.accumulator).await;
                }
                scrape_all(&handle.client, &handle.targets, &handle.accumulator).await;
            }
        });
        Self { handle, task, stop }
    }

    pub fn handle(&self) -> ScrapeHandle {
        self.handle.clone()
    }

    /// Takes the last scrape and returns the increases.
    pub async fn finish(self) -> Accumulator {
        self.stop.cancel();
        let _ = self.task.await;
        let accumulator = self.handle.accumulator.lock().expect("scrape lock").clone();
        accumulator
    }
}

async fn scrape_all(
    client: &reqwest::Client,
    targets: &[(String, String)],
    accumulator: &Mutex<Accumulator>,
) {
    let scrapes = futures::future::join_all(targets.iter().map(|(role, url)| async move {
        let text = client
            .get(format!("{}/metrics", url.trim_end_matches('/')))
            .timeout(Duration::from_secs(2))
            .send()
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        Some((role.clone(), parse(&text)))
    }))
    .await;
    let mut accumulator = accumulator.lock().expect("scrape lock");
    // A role that is down (killed, paused) is simply not observed this time.
    for (role, scrape) in scrapes.into_iter().flatten() {
        accumulator.observe(&role, scrape);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# TYPE herald_outbox_claim_duration_seconds histogram
herald_outbox_claim_duration_seconds_bucket{le=\"0.001\"} 3
herald_outbox_claim_duration_seconds_sum 0.5
herald_outbox_claim_duration_seconds_count 10
herald_queue_publish_duration_seconds_sum{job_type=\"send\"} 1
herald_queue_publish_duration_seconds_count{job_type=\"send\"} 4
herald_queue_publish_duration_seconds_sum{job_type=\"status\"} 1
herald_queue_publish_duration_seconds_count{job_type=\"status\"} 4
";

    #[test]
    fn sums_label_sets_and_survives_a_restart() {
        let parsed = parse(TEXT);
        assert_eq!(parsed["herald_queue_publish_duration_seconds"], (2.0, 8.0));
        let mut acc = Accumulator::default();
        acc.observe("poller-0", parsed.clone());
        let mut later = parsed.clone();
        later.insert(
            "herald_outbox_claim_duration_seconds".to_owned(),
            (1.5, 30.0),
        );
        acc.observe("poller-0", later);
        // Restarted: counters from zero.
        let mut restarted = HashMap::new();
        restarted.insert(
            "herald_outbox_claim_duration_seconds".to_owned(),
            (0.25, 5.0),
        );
        acc.observe("poller-0", restarted);
        let stages = acc.stages(100);
        let claim = stages.iter().find(|s| s.name == "claim").unwrap();
        assert_eq!(claim.calls, 25);
        assert!((claim.seconds - 1.25).abs() < 1e-9);
        assert!((claim.ms_per_message - 12.5).abs() < 1e-9);
        assert_eq!(acc.resets["poller-0"], 1);
        // Told of a restart, higher values after it still count from zero.
        acc.restarted("poller-0");
        let mut again = HashMap::new();
        again.insert(
            "herald_outbox_claim_duration_seconds".to_owned(),
            (9.0, 90.0),
        );
        acc.observe("poller-0", again);
        let claim = acc
            .stages(100)
            .into_iter()
            .find(|s| s.name == "claim")
            .unwrap();
        assert_eq!(claim.calls, 115);
        // The first scrape of a role is the baseline, every histogram in it.
        let mut fresh = Accumulator::default();
        fresh.observe("api", parse(TEXT));
        assert!(fresh.stages(1).iter().all(|s| s.calls == 0));
    }

    #[test]
    fn the_wall_is_the_stage_that_grew_most_per_message() {
        let stage = |name: &str, ms: f64| Stage {
            name: name.to_owned(),
            calls: 1,
            ms_per_message: ms,
            ..Stage::default()
        };
        let before = vec![stage("claim", 1.0), stage("publish", 2.0)];
        let now = vec![stage("claim", 3.0), stage("publish", 2.5)];
        let wall = wall(&now, Some(("a.json", &before))).unwrap();
        assert_eq!(wall.stage, "claim");
        assert_eq!(self::wall(&now, None).unwrap().stage, "claim");
    }
}
