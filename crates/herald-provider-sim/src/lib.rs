//! The provider simulator: a real HTTP server that behaves like an SMS or e-mail gateway.
//! `POST /v1/submit` with an `Idempotency-Key` answers `{provider_id, gateway}`; a repeated
//! key answers the first answer again (and is counted as a duplicate submit). Provider ids are
//! short counters per gateway that wrap, so two gateways issue the same id. A submit whose key
//! is still being submitted by another request answers 409, as real gateways do.
//! `GET /v1/submits/{key}` answers what a submit under the key got (404: none took effect),
//! which is how a client settles a submit whose answer it lost. Latency, errors and timeouts
//! are injected by configurable rates. Every first submit of a key is appended to
//! a log file before it is answered, so delivery can be proven after any crash, and the log is
//! read back on start.
//!
//! Longer than 400 lines: the submit, lookup and statistics routes share the simulator's state and
//! its fault injection; the receipts it posts back are in `receipts.rs`.

pub mod config;
mod receipts;
mod record;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use rand::Rng;
use serde::{Deserialize, Serialize};
use tokio_util::task::TaskTracker;

pub use receipts::PlannedReceipt;
pub use receipts::{Faults, ReceiptRates, ReceiptSecrets};
pub use record::{Effect, Record, SubmitAnswer};

/// What the simulator cannot start or answer with.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// A setting it cannot run with.
    #[error("{0}")]
    Settings(String),
    /// Its submit log cannot be opened, read or written.
    #[error("submit log {}: {source}", path.display())]
    Log {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A line it was to write or read back is not what it writes.
    #[error("{0}")]
    Encoding(#[from] serde_json::Error),
    /// Asking a running simulator over HTTP failed.
    #[error("{0}")]
    Http(#[from] reqwest::Error),
    /// A running simulator answered something it does not write.
    #[error("{0}")]
    Unreadable(String),
}

/// Fails with a settings error unless `ok`.
fn require(ok: bool, message: impl FnOnce() -> String) -> Result<(), SimError> {
    if ok {
        Ok(())
    } else {
        Err(SimError::Settings(message()))
    }
}

/// The simulator's behaviour.
#[derive(Debug, Clone)]
pub struct SimSettings {
    /// Gateway names; a key is routed to one of them by hash.
    pub gateways: Vec<String>,
    /// Provider ids count 1..=wrap per gateway, then start again.
    pub id_wrap: u32,
    /// Fixed latency of every submit.
    pub latency: Duration,
    /// Extra random latency, uniform in 0..=jitter.
    pub jitter: Duration,
    /// Share of submits answered 503 without taking effect.
    pub error_rate: f64,
    /// Share of submits that take effect but answer only after `timeout_delay` (the client
    /// times out first: the outcome is unknown to it).
    pub timeout_rate: f64,
    pub timeout_delay: Duration,
    /// Share of submits refused for their content (422), with no effect.
    pub reject_rate: f64,
    /// Answer every submit with this status and take no effect: a gateway Herald is
    /// misconfigured for (404: wrong URL, 401: wrong credentials).
    pub refuse_status: Option<u16>,
    /// Append-only record of every first submit.
    pub log_path: PathBuf,
    /// Where delivery receipts go: Herald's API base URL (receipts are posted to
    /// `{callback}/v1/providers/{gateway}/receipts`). None: no receipts.
    pub callback_url: Option<String>,
    /// Each gateway's receipt signing secret (the API holds the same); a gateway without one
    /// posts its receipts unsigned.
    pub receipt_secrets: ReceiptSecrets,
    /// The kinds of receipts sent, by rate.
    pub receipts: ReceiptRates,
}

impl Default for SimSettings {
    /// The behaviour of `herald provider-sim`'s defaults.
    fn default() -> Self {
        config::SimConfig::default()
            .settings()
            .expect("the default settings read no secret")
    }
}

impl SimSettings {
    /// Checks every setting: rates within 0..=1, a refusal status that is an error status.
    pub fn validate(&self) -> Result<(), SimError> {
        let settings = self;
        require(!settings.gateways.is_empty(), || {
            "at least one gateway is needed".to_owned()
        })?;
        require(settings.id_wrap > 0, || {
            "id wrap must be at least 1".to_owned()
        })?;
        for (name, rate) in [
            ("error", settings.error_rate),
            ("timeout", settings.timeout_rate),
            ("reject", settings.reject_rate),
        ] {
            require((0.0..=1.0).contains(&rate), || {
                format!("{name} rate must be within 0..=1, got {rate}")
            })?;
        }
        if let Some(status) = settings.refuse_status {
            require((400..=599).contains(&status), || {
                format!("the refusal status must be a 4xx or 5xx, got {status}")
            })?;
        }
        settings.receipts.validate()
    }
}

/// Counts for `GET /v1/stats`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stats {
    /// Every submit that took effect or was deduped (errors excluded).
    pub submits: u64,
    pub distinct_keys: u64,
    /// Submits whose key was seen before (answered with the first answer).
    pub duplicate_submits: u64,
    pub injected_errors: u64,
    pub injected_timeouts: u64,
    /// Submits refused for their content (422, no effect).
    #[serde(default)]
    pub injected_rejections: u64,
    /// Receipts delivered to the callback (answered 2xx).
    pub receipts_sent: u64,
    /// Receipts given up on after every retry failed.
    pub receipts_failed: u64,
    /// Submits answered 409 because another submit under the same key was in progress.
    #[serde(default)]
    pub conflicts: u64,
}

#[derive(Clone)]
struct Sim {
    settings: Arc<SimSettings>,
    faults: Arc<std::sync::Mutex<Faults>>,
    record: Arc<tokio::sync::Mutex<Record>>,
    receipts: Option<receipts::Sender>,
    /// Keys whose submit is being answered now.
    in_progress: Arc<std::sync::Mutex<std::collections::HashSet<String>>>,
    /// Work the handlers start and leave running: receipts, a timed-out key's release.
    tasks: TaskTracker,
}

/// The work a simulator's handlers left running (receipt deliveries, a timed-out key's
/// release). A simulator that stops waits for it ([`Background::finish`]) instead of dropping
/// receipts it promised without a word.
#[derive(Clone)]
pub struct Background {
    tasks: TaskTracker,
}

impl Background {
    /// Tasks still running.
    pub fn running(&self) -> usize {
        self.tasks.len()
    }

    /// Waits up to `grace` for the running tasks (no new ones start after the server stopped);
    /// answers how many were still running, and so are dropped.
    pub async fn finish(&self, grace: Duration) -> usize {
        self.tasks.close();
        let _ = tokio::time::timeout(grace, self.tasks.wait()).await;
        self.tasks.len()
    }
}

/// Marks a key's submit in progress until dropped.
struct InProgress {
    keys: Arc<std::sync::Mutex<std::collections::HashSet<String>>>,
    key: String,
}

impl InProgress {
    /// `None` when another submit under `key` is in progress.
    fn start(
        keys: &Arc<std::sync::Mutex<std::collections::HashSet<String>>>,
        key: &str,
    ) -> Option<Self> {
        let mut held = keys.lock().ok()?;
        if !held.insert(key.to_owned()) {
            return None;
        }
        Some(Self {
            keys: keys.clone(),
            key: key.to_owned(),
        })
    }
}

impl Drop for InProgress {
    fn drop(&mut self) {
        if let Ok(mut held) = self.keys.lock() {
            held.remove(&self.key);
        }
    }
}

/// Builds the simulator's router; the log is opened (and read back) here. Its background
/// work runs untracked: [`simulator`] for a server that waits for it when it stops.
pub fn router(settings: SimSettings) -> Result<Router, SimError> {
    simulator(settings).map(|(router, _)| router)
}

/// [`router`], and the work its handlers leave running.
pub fn simulator(settings: SimSettings) -> Result<(Router, Background), SimError> {
    settings.validate()?;
    // A deployment's secrets may cover more gateways than this simulator runs (one secret set
    // for several simulators): those are unused, not wrong.
    for gateway in settings.receipt_secrets.0.keys() {
        if !settings.gateways.contains(gateway) {
            tracing::warn!(%gateway, gateways = %settings.gateways.join(", "),
                "a receipt secret names a gateway this simulator does not run; it is unused");
        }
    }
    let record = Arc::new(tokio::sync::Mutex::new(Record::open(
        &settings.log_path,
        &settings.gateways,
        settings.id_wrap,
    )?));
    let tasks = TaskTracker::new();
    let receipts = settings.callback_url.as_ref().map(|url| {
        receipts::Sender::new(
            url,
            settings.receipt_secrets.clone(),
            settings.receipts.clone(),
            record.clone(),
            tasks.clone(),
        )
    });
    let sim = Sim {
        faults: Arc::new(std::sync::Mutex::new(Faults {
            error_rate: settings.error_rate,
            timeout_rate: settings.timeout_rate,
            reject_rate: settings.reject_rate,
        })),
        settings: Arc::new(settings),
        record,
        receipts: receipts.transpose()?,
        in_progress: Default::default(),
        tasks: tasks.clone(),
    };
    let router = Router::new()
        .route("/v1/submit", post(submit))
        .route("/v1/stats", get(stats))
        .route("/v1/submits", get(submits))
        .route("/v1/submits/{key}", get(lookup))
        .route("/v1/effects", get(effects))
        .route("/v1/faults", get(get_faults).put(set_faults))
        .with_state(sim);
    Ok((router, Background { tasks }))
}

#[derive(Deserialize)]
struct SubmitRequest {
    recipient: String,
    #[allow(dead_code)]
    body: serde_json::Value,
}

async fn submit(State(sim): State<Sim>, headers: HeaderMap, body: axum::body::Bytes) -> Response {
    if let Some(status) = sim.settings.refuse_status {
        metrics::counter!("herald_sim_submits_total", "outcome" => "error").increment(1);
        sim.record.lock().await.count_error();
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::NOT_FOUND);
        return error(
            status,
            "refused: this gateway is configured to refuse every submit",
        );
    }
    let Some(key) = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .filter(|k| !k.is_empty())
        .map(str::to_owned)
    else {
        return error(
            StatusCode::BAD_REQUEST,
            "Idempotency-Key header is required",
        );
    };
    let request: SubmitRequest = match serde_json::from_slice(&body) {
        Ok(request) => request,
        Err(err) => return error(StatusCode::BAD_REQUEST, &format!("invalid body: {err}")),
    };
    if request.recipient.is_empty() {
        return error(StatusCode::UNPROCESSABLE_ENTITY, "recipient is empty");
    }
    let Some(in_progress) = InProgress::start(&sim.in_progress, &key) else {
        sim.record.lock().await.count_conflict();
        metrics::counter!("herald_sim_submits_total", "outcome" => "conflict").increment(1);
        return error(
            StatusCode::CONFLICT,
            "a submit with this Idempotency-Key is in progress; retry later",
        );
    };
    let faults = sim.faults.lock().map(|f| *f).unwrap_or_default();
    let (latency, fail, time_out, reject) = {
        let mut rng = rand::rng();
        let jitter = sim.settings.jitter.as_micros() as u64;
        let extra = if jitter > 0 {
            rng.random_range(0..=jitter)
        } else {
            0
        };
        (
            sim.settings.latency + Duration::from_micros(extra),
            rng.random_bool(faults.error_rate),
            rng.random_bool(faults.timeout_rate),
            rng.random_bool(faults.reject_rate),
        )
    };
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    if fail {
        sim.record.lock().await.count_error();
        metrics::counter!("herald_sim_submits_total", "outcome" => "error").increment(1);
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "injected error (no effect)",
        );
    }
    if reject {
        sim.record.lock().await.count_rejection();
        metrics::counter!("herald_sim_submits_total", "outcome" => "rejected").increment(1);
        return error(
            StatusCode::UNPROCESSABLE_ENTITY,
            "recipient refused by the provider (injected rejection, no effect)",
        );
    }
    let answer = match sim.record.lock().await.submit(&key) {
        Ok(answer) => answer,
        Err(err) => {
            tracing::error!(error = %err, "cannot append to the submit log");
            return error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "submit log unavailable (no effect)",
            );
        }
    };
    metrics::counter!("herald_sim_submits_total", "outcome" => if answer.duplicate { "duplicate" } else { "first" })
        .increment(1);
    if !answer.duplicate {
        if let Some(receipts) = &sim.receipts {
            receipts.schedule(&key, &answer);
        }
    }
    if time_out {
        sim.record.lock().await.count_timeout();
        // The gateway keeps working on the key for the whole delay, whether or not the client
        // waits for the answer: a submit under the same key meanwhile is a 409.
        let delay = sim.settings.timeout_delay;
        sim.tasks.spawn(async move {
            tokio::time::sleep(delay).await;
            drop(in_progress);
        });
        tokio::time::sleep(delay).await;
    } else {
        drop(in_progress);
    }
    Json(answer).into_response()
}

/// `GET /v1/faults`: the injected error and timeout rates now.
async fn get_faults(State(sim): State<Sim>) -> Json<Faults> {
    Json(sim.faults.lock().map(|f| *f).unwrap_or_default())
}

/// `PUT /v1/faults`: changes the injected rates at run time (a provider outage and its end).
async fn set_faults(State(sim): State<Sim>, Json(faults): Json<Faults>) -> Response {
    let rates = [faults.error_rate, faults.timeout_rate, faults.reject_rate];
    if !rates.iter().all(|rate| (0.0..=1.0).contains(rate)) {
        return error(
            StatusCode::UNPROCESSABLE_ENTITY,
            "rates must be within 0..=1",
        );
    }
    if let Ok(mut current) = sim.faults.lock() {
        *current = faults;
    }
    tracing::info!(?faults, "fault rates changed");
    Json(faults).into_response()
}

async fn stats(State(sim): State<Sim>) -> Json<Stats> {
    Json(sim.record.lock().await.stats())
}

/// `GET /v1/submits/{key}`: the answer a submit under `key` got, or 404 when none took effect.
async fn lookup(
    State(sim): State<Sim>,
    axum::extract::Path(key): axum::extract::Path<String>,
) -> Response {
    match sim.record.lock().await.lookup(&key) {
        Some(answer) => Json(answer).into_response(),
        None => error(
            StatusCode::NOT_FOUND,
            "no submit under this key took effect",
        ),
    }
}

/// Every key with its submit count, one `key count` line each.
async fn submits(State(sim): State<Sim>) -> String {
    sim.record.lock().await.key_counts()
}

/// Every key's effect and planned receipts, one JSON line each (for the proof).
async fn effects(State(sim): State<Sim>) -> String {
    sim.record
        .lock()
        .await
        .effects(sim.settings.callback_url.is_some())
}

/// Reads a running simulator's `GET /v1/effects`: what it did with every idempotency key.
pub async fn fetch_effects(
    sim_url: &str,
    timeout: Duration,
) -> Result<std::collections::HashMap<String, Effect>, SimError> {
    let url = format!("{}/v1/effects", sim_url.trim_end_matches('/'));
    let text = reqwest::Client::new()
        .get(&url)
        .timeout(timeout)
        .send()
        .await?
        .error_for_status()?
        .text()
        .await?;
    let mut effects = std::collections::HashMap::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let effect: Effect = serde_json::from_str(line).map_err(|err| {
            SimError::Unreadable(format!("unreadable line from {url}: {err}: {line:?}"))
        })?;
        effects.insert(effect.key.clone(), effect);
    }
    Ok(effects)
}

impl Effect {
    /// The effect as the proof sees it: submits and the final receipt the provider sent.
    pub fn view(&self) -> herald_core::verdict::ProviderView {
        let receipts = self.receipts.as_ref().map(|planned| {
            planned
                .iter()
                .map(|r| (r.status.as_str(), r.malformed_timestamp))
        });
        herald_core::verdict::ProviderView {
            submits: self.submits,
            final_receipt: herald_core::verdict::ProviderFinal::from_receipts(receipts),
        }
    }
}

/// [`fetch_effects`] as the proof sees them, by effect key.
pub async fn fetch_provider_views(
    sim_url: &str,
    timeout: Duration,
) -> Result<std::collections::HashMap<String, herald_core::verdict::ProviderView>, SimError> {
    Ok(fetch_effects(sim_url, timeout)
        .await?
        .into_iter()
        .map(|(key, effect)| {
            let view = effect.view();
            (key, view)
        })
        .collect())
}

fn error(status: StatusCode, detail: &str) -> Response {
    (status, Json(serde_json::json!({ "error": detail }))).into_response()
}
