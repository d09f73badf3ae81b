//! Herald's queue stores. Each job type has its own Redis instance(s); a job is exactly one
//! stream entry and nothing else (no lock or uniqueness keys: idempotency lives in
//! PostgreSQL). Entries are published in one pipelined round trip per batch, read through a
//! consumer group, and acknowledged *and deleted* once handled, so the stream holds only
//! work in flight.

pub mod config;
pub mod metrics;
pub mod monitor;

use std::time::{Duration, Instant};

use deadpool_redis::{Manager, Pool, Runtime};
use herald_core::job::Job;
use herald_core::{JobKind, JobType};
use redis::streams::{StreamAutoClaimReply, StreamId, StreamReadReply};
use redis::AsyncConnectionConfig;

use crate::metrics::{measured, RedisOp};

#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("redis pool: {0}")]
    Pool(#[from] deadpool_redis::PoolError),
    #[error("cannot build the redis pool: {0}")]
    Build(String),
    #[error("cannot encode job: {0}")]
    Encode(#[from] serde_json::Error),
}

impl QueueError {
    /// The store refused a write past its `maxmemory` (Redis error code `OOM`), for a single
    /// command or for any command of a pipeline: the store is full, not broken.
    pub fn is_out_of_memory(&self) -> bool {
        match self {
            Self::Redis(err) => is_oom(err),
            _ => false,
        }
    }
}

fn is_oom(err: &redis::RedisError) -> bool {
    err.code() == Some("OOM")
        || err
            .clone()
            .into_server_errors()
            .is_some_and(|refused| refused.iter().any(|(_, refusal)| refusal.code() == "OOM"))
}

/// Where one job type's store lives and how many connections a role may hold to it. `K` is
/// Herald's [`JobType`] but in tests of the worker runtime with a job type of their own.
#[derive(Debug, Clone)]
pub struct StoreSettings<K = JobType> {
    pub url: String,
    pub job_type: K,
    /// Which of the job type's shards this store is (partition p publishes to shard
    /// `p mod shards`).
    pub shard: u32,
    pub max_connections: usize,
}

/// A delivered stream entry: the entry id to acknowledge, and the job if it could be decoded.
#[derive(Debug)]
pub struct Delivery<K = JobType> {
    pub entry_id: String,
    pub job: Result<Job<K>, String>,
}

/// A Redis connection pool's state at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolStatus {
    pub max_size: usize,
    /// Open connections, idle or in use.
    pub size: usize,
    /// Idle connections.
    pub available: usize,
    /// Callers waiting for a connection.
    pub waiting: usize,
}

/// One shard of a job type's queue store: its stream and consumer group.
#[derive(Clone)]
pub struct QueueStore<K = JobType> {
    pool: Pool,
    job_type: K,
    shard: u32,
    stream: String,
    group: String,
}

/// Longest a blocking read waits; the connection's response timeout is well above it.
pub const MAX_BLOCK: Duration = Duration::from_secs(2);

impl<K: JobKind> QueueStore<K> {
    /// Builds the pool. Connections are opened lazily, so Redis may be down at start.
    pub fn new(settings: &StoreSettings<K>) -> Result<Self, QueueError> {
        Self::with_tls(settings, &herald_core::ClientTls::default())
    }

    /// Builds the pool; a `rediss://` URL connects over TLS, trusting `tls.ca` (else the
    /// system's roots) and presenting `tls.identity` when given. A `redis://` URL ignores
    /// `tls` (one job type's store may be TLS, the other's not).
    pub fn with_tls(
        settings: &StoreSettings<K>,
        tls: &herald_core::ClientTls,
    ) -> Result<Self, QueueError> {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(2)))
            .set_response_timeout(Some(MAX_BLOCK + Duration::from_secs(3)));
        let manager = if tls.is_empty() || !settings.url.starts_with("rediss://") {
            Manager::new_with_config(settings.url.as_str(), config)?
        } else {
            let certificates = redis::TlsCertificates {
                client_tls: tls.identity.as_ref().map(|id| redis::ClientTlsConfig {
                    client_cert: id.cert.clone(),
                    client_key: id.key.clone(),
                }),
                root_cert: tls.ca.clone(),
            };
            let client = redis::Client::build_with_tls(settings.url.as_str(), certificates)?;
            Manager::new_with_config(client.get_connection_info().clone(), config)?
        };
        let pool = Pool::builder(manager)
            .max_size(settings.max_connections)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(Duration::from_secs(5)))
            .create_timeout(Some(Duration::from_secs(3)))
            .build()
            .map_err(|err| QueueError::Build(err.to_string()))?;
        let job_type = settings.job_type;
        let name = job_type.name();
        Ok(Self {
            pool,
            job_type,
            shard: settings.shard,
            stream: format!("herald:{name}:{}", settings.shard),
            group: format!("herald-{name}-workers"),
        })
    }

    pub fn job_type(&self) -> K {
        self.job_type
    }

    pub fn shard(&self) -> u32 {
        self.shard
    }

    /// The connection pool's state now: its limit, open connections, idle ones and waiters.
    pub fn pool_status(&self) -> PoolStatus {
        let status = self.pool.status();
        PoolStatus {
            max_size: status.max_size,
            size: status.size,
            available: status.available,
            waiting: status.waiting,
        }
    }

    /// The stream's key (for operators and tests).
    pub fn stream_key(&self) -> &str {
        &self.stream
    }

    pub fn group(&self) -> &str {
        &self.group
    }

    /// Readiness probe: one PING.
    pub async fn ping(&self) -> Result<(), QueueError> {
        let mut conn = self.pool.get().await?;
        let _: String = redis::cmd("PING").query_async(&mut conn).await?;
        Ok(())
    }

    /// Appends every job to the stream in one pipelined round trip and returns the entry ids.
    /// On error some entries may have been written: the caller must treat the batch as not
    /// published (a duplicate copy is harmless, a missing one is not).
    pub async fn publish(&self, jobs: &[Job<K>]) -> Result<Vec<String>, QueueError> {
        if jobs.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for job in jobs {
            pipe.cmd("XADD")
                .arg(&self.stream)
                .arg("*")
                .arg("job")
                .arg(serde_json::to_string(job)?);
        }
        let started = Instant::now();
        let result = measured(RedisOp::Publish, async {
            let mut conn = self.pool.get().await?;
            let ids: Vec<String> = pipe.query_async(&mut conn).await?;
            Ok::<_, QueueError>(ids)
        })
        .await;
        ::metrics::histogram!(metrics::PUBLISH_DURATION, "job_type" => self.job_type.name())
            .record(started.elapsed().as_secs_f64());
        result
    }

    /// Creates the consumer group (and the stream) if missing. Safe to call at any time.
    pub async fn ensure_group(&self) -> Result<(), QueueError> {
        let mut conn = self.pool.get().await?;
        let created: Result<String, redis::RedisError> = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(&self.stream)
            .arg(&self.group)
            .arg("0")
            .arg("MKSTREAM")
            .query_async(&mut conn)
            .await;
        match created {
            Ok(_) => Ok(()),
            Err(err) if err.code() == Some("BUSYGROUP") => Ok(()),
            // A store past maxmemory refuses XGROUP CREATE even when the group exists, and only
            // reading the stream can free it: ask with a read-only command instead.
            Err(err) if is_oom(&err) => {
                let exists: Result<redis::Value, redis::RedisError> = redis::cmd("XPENDING")
                    .arg(&self.stream)
                    .arg(&self.group)
                    .query_async(&mut conn)
                    .await;
                match exists {
                    Ok(_) => Ok(()),
                    Err(_) => Err(err.into()),
                }
            }
            Err(err) => Err(err.into()),
        }
    }

    /// Reads up to `count` new entries for `consumer`, waiting at most `block` (capped at
    /// [`MAX_BLOCK`]). A store restarted without its data (no stream, no group) is healed by
    /// recreating the group and reading again.
    pub async fn read(
        &self,
        consumer: &str,
        count: usize,
        block: Duration,
    ) -> Result<Vec<Delivery<K>>, QueueError> {
        let block = block.min(MAX_BLOCK);
        match self.read_once(consumer, count, block).await {
            Err(QueueError::Redis(err)) if err.code() == Some("NOGROUP") => {
                tracing::warn!(stream = %self.stream, "consumer group missing (store restarted?); recreating it");
                self.ensure_group().await?;
                self.read_once(consumer, count, block).await
            }
            other => other,
        }
    }

    async fn read_once(
        &self,
        consumer: &str,
        count: usize,
        block: Duration,
    ) -> Result<Vec<Delivery<K>>, QueueError> {
        let mut conn = self.pool.get().await?;
        let reply: Option<StreamReadReply> = redis::cmd("XREADGROUP")
            .arg("GROUP")
            .arg(&self.group)
            .arg(consumer)
            .arg("COUNT")
            .arg(count)
            .arg("BLOCK")
            .arg(block.as_millis() as u64)
            .arg("STREAMS")
            .arg(&self.stream)
            .arg(">")
            .query_async(&mut conn)
            .await?;
        Ok(reply
            .map(|reply| {
                reply
                    .keys
                    .into_iter()
                    .flat_map(|key| key.ids)
                    .map(decode)
                    .collect()
            })
            .unwrap_or_default())
    }

    /// Takes over entries another consumer read but did not acknowledge for `min_idle` (it
    /// died): they are handled again by `consumer`.
    pub async fn reclaim_idle(
        &self,
        consumer: &str,
        min_idle: Duration,
        count: usize,
    ) -> Result<Vec<Delivery<K>>, QueueError> {
        let mut conn = self.pool.get().await?;
        let reply: Result<StreamAutoClaimReply, redis::RedisError> = redis::cmd("XAUTOCLAIM")
            .arg(&self.stream)
            .arg(&self.group)
            .arg(consumer)
            .arg(min_idle.as_millis() as u64)
            .arg("0-0")
            .arg("COUNT")
            .arg(count)
            .query_async(&mut conn)
            .await;
        match reply {
            Ok(reply) => Ok(reply.claimed.into_iter().map(decode).collect()),
            Err(err) if err.code() == Some("NOGROUP") => Ok(Vec::new()),
            Err(err) => Err(err.into()),
        }
    }

    /// Acknowledges and deletes handled entries in one round trip: the stream keeps only work
    /// in flight.
    pub async fn ack_and_delete(&self, entry_ids: &[String]) -> Result<(), QueueError> {
        if entry_ids.is_empty() {
            return Ok(());
        }
        measured(RedisOp::Ack, async {
            let mut conn = self.pool.get().await?;
            let mut pipe = redis::pipe();
            pipe.cmd("XACK")
                .arg(&self.stream)
                .arg(&self.group)
                .arg(entry_ids)
                .ignore()
                .cmd("XDEL")
                .arg(&self.stream)
                .arg(entry_ids)
                .ignore();
            pipe.query_async::<()>(&mut conn).await?;
            Ok(())
        })
        .await
    }

    /// When the oldest entry still in the stream was added, in milliseconds since the epoch
    /// (from its id), or `None` when the stream is empty or missing. An entry stays in the
    /// stream until a worker handled it and deleted it, whether it was read or not: a job
    /// published before this time and not handled is not waiting in the stream any more, the
    /// store lost it (a restart, a flush).
    pub async fn oldest_entry_ms(&self) -> Result<Option<u64>, QueueError> {
        let mut conn = self.pool.get().await?;
        let reply: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
            .arg(&self.stream)
            .arg("-")
            .arg("+")
            .arg("COUNT")
            .arg(1)
            .query_async(&mut conn)
            .await?;
        Ok(reply
            .ids
            .first()
            .and_then(|entry| entry.id.split('-').next()?.parse().ok()))
    }

    /// Deletes every key of the store's database (benchmarks and tests only).
    pub async fn flush_all(&self) -> Result<(), QueueError> {
        let mut conn = self.pool.get().await?;
        let _: String = redis::cmd("FLUSHDB").query_async(&mut conn).await?;
        Ok(())
    }
}

fn decode<K: JobKind>(entry: StreamId) -> Delivery<K> {
    let job = match entry.get::<String>("job") {
        Some(raw) => serde_json::from_str::<Job<K>>(&raw).map_err(|err| format!("{err}: {raw}")),
        None => Err(format!("entry has no job field: {:?}", entry.map)),
    };
    Delivery {
        entry_id: entry.id,
        job,
    }
}
