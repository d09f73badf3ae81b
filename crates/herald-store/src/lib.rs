//! Herald's PostgreSQL layer. Every statement Herald runs against the database is here, next
//! to the function that runs it: the accept transaction, the outbox claim / mark / re-drive
//! (each fenced by the partition's epoch), the worker's ownership confirmation and ledger
//! write, message histories and the verifier's counts. Functions take a pool or a transaction
//! explicitly so the caller sees where transactions begin and end.

#[macro_use]
mod sql;

pub mod accept;
pub mod archive;
pub mod backlog;
pub mod config;
pub mod effects;
pub mod group;
pub mod leases;
pub mod messages;
pub mod metrics;
pub mod migrate;
pub mod migration_rules;
pub mod outbox;
pub mod receipts;
pub mod retention;
pub mod runtime_role;
pub mod verify;
pub mod wakeups;

use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;

/// Errors of the store that callers branch on.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("the database was installed with {recorded} partitions; {requested} were asked for (the count cannot change after install)")]
    PartitionCountMismatch { recorded: u32, requested: u32 },
    #[error("the database has no recorded partition count: run `herald migrate` first")]
    NotMigrated,
    #[error("stored data is invalid: {0}")]
    Corrupt(String),
    /// A write shared with other callers (group commit) failed; the text is its error.
    #[error("the shared write failed: {0}")]
    GroupWrite(String),
    /// The connection broke after the write was sent: PostgreSQL may or may not have
    /// committed it. A caller must not be told that nothing was written.
    #[error("the outcome of the write is unknown (the connection broke after it was sent): {0}")]
    OutcomeUnknown(String),
    /// The partition's recorded epoch is not the caller's: a newer owner took it over, and the
    /// statement changed nothing.
    #[error("partition {partition} is fenced: epoch {epoch} is no longer its owner's")]
    Fenced { partition: u32, epoch: i64 },
    /// Rows to be removed could not be archived first: nothing was removed.
    #[error("archiving failed, nothing was removed: {0}")]
    Archive(#[from] archive::ArchiveError),
}

/// Classifies an error of a write that was already sent: a broken connection (no answer from
/// the server) leaves the outcome unknown; an answer (an error the server sent) means the
/// statement, and with it an implicit or open transaction, did not commit.
pub(crate) fn after_sending(err: sqlx::Error) -> StoreError {
    match err {
        sqlx::Error::Io(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::WorkerCrashed => StoreError::OutcomeUnknown(err.to_string()),
        other => StoreError::Database(other),
    }
}

/// How a role connects to PostgreSQL.
#[derive(Debug, Clone)]
pub struct PoolSettings {
    pub url: String,
    pub max_connections: u32,
    pub acquire_timeout: Duration,
    /// The role runs the same few batched statements all the time (workers, pollers): its
    /// sessions plan each once, not at every call (see [`GENERIC_PLANS`]).
    pub generic_plans: bool,
}

/// The session settings of a role whose statements are a few batched ones, each taking its
/// batch as arrays. PostgreSQL plans a prepared statement again at every call while it
/// estimates a custom plan cheaper than the generic one, and a statement that writes the
/// partitioned outbox plans every one of its 64 children: the status worker's finishing
/// statement spent 22 ms planning and 19 ms running per call, and the poller's claim 4.4 ms
/// planning and 1 ms running (`loadtest/README.md`). Their values never change the best plan
/// (arrays of keys; the states are constants in the text), and a generic plan prunes the
/// outbox's children as it runs. A generic plan guesses the size of its arrays, and a guess
/// past `jit_above_cost` compiled the statement at every call: the reconciliation's
/// statement, which reads one row, took 250 ms, nearly all of it JIT. None of these
/// statements runs long enough to gain from JIT.
///
/// Nor do they join anything but a batch's keys to an index: the planner costs a nested loop
/// into the partitioned outbox as a probe of all 64 children per key (it does not count
/// run-time pruning), so it chose hash joins over every child, or TID scans of every child,
/// for updates of a few rows. Without hash and merge joins, every join of a batch to a table
/// is a nested loop of index probes, each pruned to its key's child as it runs: at 600 msg/s
/// the send confirm (5 to 9 jobs) fell from 15.4 to 6.3 ms a call, the status finish from 6.3
/// to 0.6 ms (`sql.rs::the_locked_rows!`).
pub const GENERIC_PLANS: [(&str, &str); 4] = [
    ("plan_cache_mode", "force_generic_plan"),
    ("jit", "off"),
    ("enable_hashjoin", "off"),
    ("enable_mergejoin", "off"),
];

/// The session settings of a connection that reads the proof's facts (`herald verify`,
/// `herald dev`'s demo, the load tester): no JIT. Its statements look messages up by key a
/// few thousand at a time; right after a load, before autovacuum has analysed the new rows,
/// the planner's guess passed `jit_above_cost` and compiling 434 functions took 1.3 s of a
/// 1.4 s statement that runs in 76 ms without (5,000 ids, `herald dev`).
pub const PROOF_SESSION: [(&str, &str); 1] = [("jit", "off")];

/// The connect options of a proof reader ([`PROOF_SESSION`]) for `url`.
pub fn proof_options(url: &str) -> Result<PgConnectOptions, StoreError> {
    let options: PgConnectOptions = url.parse()?;
    Ok(options.options(PROOF_SESSION))
}

/// Opens a pool; fails fast when the database cannot be reached.
pub async fn connect(settings: &PoolSettings) -> Result<PgPool, StoreError> {
    let mut options: PgConnectOptions = settings.url.parse()?;
    if settings.generic_plans {
        options = options.options(GENERIC_PLANS);
    }
    let pool = PgPoolOptions::new()
        .max_connections(settings.max_connections)
        .acquire_timeout(settings.acquire_timeout)
        .connect_with(options.application_name("herald"))
        .await?;
    Ok(pool)
}

/// Readiness probe: one round trip.
pub async fn ping(pool: &PgPool) -> Result<(), StoreError> {
    sqlx::query("SELECT 1").execute(pool).await?;
    Ok(())
}
