//! Watching a queue store's memory and streams: the numbers behind backpressure (pollers stop
//! publishing to a store that is nearly full) and what readiness reports (the API names the
//! store in its `/readyz` answer).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::{QueueError, QueueStore};

/// One reading of a store.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StoreStats {
    pub used_memory: u64,
    /// `maxmemory`; 0 means no limit was set.
    pub max_memory: u64,
    pub stream_length: u64,
    /// Entries delivered to a consumer and not acknowledged yet.
    pub pending: u64,
    /// Keys in the store's database (one stream per shard, nothing per job).
    pub keys: u64,
    /// `maxmemory-policy` as `INFO memory` reports it (`None` when the server does not say).
    pub eviction_policy: Option<String>,
}

impl StoreStats {
    /// Whether the store may delete data on its own: any `maxmemory-policy` but `noeviction`
    /// may drop a stream (its jobs) under memory pressure.
    pub fn may_evict(&self) -> bool {
        self.eviction_policy
            .as_deref()
            .is_some_and(|policy| policy != "noeviction")
    }

    /// used / max, or 0 when no limit is set.
    pub fn memory_ratio(&self) -> f64 {
        if self.max_memory == 0 {
            0.0
        } else {
            self.used_memory as f64 / self.max_memory as f64
        }
    }
}

impl QueueStore {
    /// Reads memory, stream length, pending count and key count.
    pub async fn stats(&self) -> Result<StoreStats, QueueError> {
        let mut conn = self.pool.get().await?;
        let (info, stream_length, keys): (String, u64, u64) = redis::pipe()
            .cmd("INFO")
            .arg("memory")
            .cmd("XLEN")
            .arg(&self.stream)
            .cmd("DBSIZE")
            .query_async(&mut conn)
            .await?;
        let field = |name: &str| {
            info.lines()
                .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
                .and_then(|value| value.trim().parse::<u64>().ok())
                .unwrap_or(0)
        };
        let pending: Result<redis::Value, redis::RedisError> = redis::cmd("XPENDING")
            .arg(&self.stream)
            .arg(&self.group)
            .query_async(&mut conn)
            .await;
        let pending = match pending {
            Ok(redis::Value::Array(items)) => match items.first() {
                Some(redis::Value::Int(n)) => *n as u64,
                _ => 0,
            },
            Ok(_) => 0,
            Err(err) if err.code() == Some("NOGROUP") => 0,
            Err(err) => return Err(err.into()),
        };
        let eviction_policy = info
            .lines()
            .find_map(|line| line.strip_prefix("maxmemory_policy:"))
            .map(|policy| policy.trim().to_owned());
        Ok(StoreStats {
            used_memory: field("used_memory"),
            max_memory: field("maxmemory"),
            stream_length,
            pending,
            keys,
            eviction_policy,
        })
    }
}

/// Whether a store may take more jobs.
#[derive(Debug, Clone, PartialEq)]
pub enum Pressure {
    Ok,
    /// Memory use at or above the threshold: stop publishing until it drains.
    Full {
        ratio: f64,
        threshold: f64,
    },
    /// The store may evict data (`maxmemory-policy` is not `noeviction`): nothing is published
    /// to it, since a job in it could vanish without a trace in Redis.
    Evicting {
        policy: String,
    },
    /// The last reading failed (or none was made yet).
    Unreachable,
}

impl Pressure {
    pub fn is_ok(&self) -> bool {
        *self == Pressure::Ok
    }
}

/// A store and its latest reading, refreshed in the background. Clones share the reading.
#[derive(Clone)]
pub struct MonitoredStore {
    pub store: QueueStore,
    threshold: f64,
    ratio_bits: Arc<AtomicU64>,
    reachable: Arc<AtomicBool>,
    /// The eviction policy of the last reading, when it is not `noeviction`.
    evicting: Arc<std::sync::Mutex<Option<String>>>,
}

/// Memory use as a share of `maxmemory`, by job type and shard.
pub const MEMORY_RATIO: &str = "herald_queue_memory_ratio";
pub const STREAM_LENGTH: &str = "herald_queue_stream_length";
pub const PENDING: &str = "herald_queue_pending_entries";
pub const KEYS: &str = "herald_queue_keys";
/// 1 when the store answered the last reading, 0 when it did not.
pub const UP: &str = "herald_queue_up";
/// 1 when the store's `maxmemory-policy` may evict data (anything but `noeviction`).
pub const EVICTING: &str = "herald_queue_eviction_policy_unsafe";

pub fn describe() {
    metrics::describe_gauge!(
        MEMORY_RATIO,
        "Queue store memory used / maxmemory, by job type and shard."
    );
    metrics::describe_gauge!(
        STREAM_LENGTH,
        "Entries in the job type's stream (published, not yet acknowledged)."
    );
    metrics::describe_gauge!(
        PENDING,
        "Entries delivered to a worker and not yet acknowledged."
    );
    metrics::describe_gauge!(
        KEYS,
        "Keys in the queue store (one stream per shard; nothing per job)."
    );
    metrics::describe_gauge!(UP, "1 if the queue store answered the last reading.");
    metrics::describe_gauge!(
        EVICTING,
        "1 if the queue store's maxmemory-policy may evict data (publishing to it stops)."
    );
}

impl MonitoredStore {
    /// Starts reading `store` every `interval` until `cancel`. `threshold` is the memory ratio
    /// at which the store counts as full (e.g. 0.8).
    pub fn start(
        store: QueueStore,
        threshold: f64,
        interval: Duration,
        cancel: CancellationToken,
    ) -> Self {
        let monitored = Self {
            store,
            threshold,
            ratio_bits: Arc::new(AtomicU64::new(0f64.to_bits())),
            reachable: Arc::new(AtomicBool::new(true)),
            evicting: Arc::default(),
        };
        let reader = monitored.clone();
        tokio::spawn(async move {
            loop {
                reader.refresh().await;
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tokio::time::sleep(interval) => {}
                }
            }
        });
        monitored
    }

    /// Takes one reading now and publishes it as gauges.
    pub async fn refresh(&self) {
        let job_type = self.store.job_type().as_str();
        let shard = self.store.shard().to_string();
        match self.store.stats().await {
            Ok(stats) => {
                self.ratio_bits
                    .store(stats.memory_ratio().to_bits(), Ordering::Relaxed);
                self.reachable.store(true, Ordering::Relaxed);
                let evicting = stats
                    .may_evict()
                    .then(|| stats.eviction_policy.clone().unwrap_or_default());
                if let Ok(mut current) = self.evicting.lock() {
                    if evicting.is_some() && *current != evicting {
                        tracing::error!(job_type, shard, policy = ?evicting,
                            "the queue store may evict data: set maxmemory-policy noeviction; nothing is published to it until then");
                    }
                    *current = evicting.clone();
                }
                let labels = [("job_type", job_type.to_owned()), ("shard", shard)];
                metrics::gauge!(EVICTING, &labels).set(if evicting.is_some() { 1.0 } else { 0.0 });
                metrics::gauge!(MEMORY_RATIO, &labels).set(stats.memory_ratio());
                metrics::gauge!(STREAM_LENGTH, &labels).set(stats.stream_length as f64);
                metrics::gauge!(PENDING, &labels).set(stats.pending as f64);
                metrics::gauge!(KEYS, &labels).set(stats.keys as f64);
                metrics::gauge!(UP, &labels).set(1.0);
            }
            Err(err) => {
                if self.reachable.swap(false, Ordering::Relaxed) {
                    tracing::warn!(job_type, shard, error = %err, "queue store unreachable");
                }
                metrics::gauge!(UP, "job_type" => job_type, "shard" => shard).set(0.0);
            }
        }
    }

    /// The store's state as of the last reading.
    pub fn pressure(&self) -> Pressure {
        if !self.reachable.load(Ordering::Relaxed) {
            return Pressure::Unreachable;
        }
        if let Some(policy) = self.evicting.lock().ok().and_then(|p| p.clone()) {
            return Pressure::Evicting { policy };
        }
        let ratio = f64::from_bits(self.ratio_bits.load(Ordering::Relaxed));
        if ratio >= self.threshold {
            Pressure::Full {
                ratio,
                threshold: self.threshold,
            }
        } else {
            Pressure::Ok
        }
    }

    /// A sentence for `/readyz` when the store is not OK.
    pub fn describe_pressure(&self) -> Option<String> {
        let name = self.store.stream_key();
        match self.pressure() {
            Pressure::Ok => None,
            Pressure::Full { ratio, threshold } => Some(format!(
                "queue store {name} is {:.0}% full (threshold {:.0}%): publishing paused",
                ratio * 100.0,
                threshold * 100.0
            )),
            Pressure::Evicting { policy } => Some(format!(
                "queue store {name} has maxmemory-policy {policy}, which may evict jobs: set noeviction; publishing paused"
            )),
            Pressure::Unreachable => Some(format!("queue store {name} is unreachable")),
        }
    }
}
