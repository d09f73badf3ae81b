//! What a stretch of work cost the machine and the database: CPU seconds per process (each
//! role, Redis, etcd, PostgreSQL with every backend), heap row writes per table (from
//! `pg_stat_user_tables`, partitions summed into their parent) and WAL bytes (from
//! `pg_current_wal_lsn`). A [`Probe`] takes a [`Sample`] before and after; [`Cost::between`]
//! turns the two into figures per delivered message, and [`Cost::read_wal_by_table`] splits
//! the WAL by table ([`crate::wal`]).
//!
//! Longer than 400 lines with its unit tests (the code is about 350).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};

/// The processes and the database one sample reads.
pub struct Probe {
    /// (name, pid) of every process measured apart from PostgreSQL.
    pub processes: Vec<(String, i32)>,
    /// PostgreSQL's data directory (its postmaster's pid is in `postmaster.pid`).
    pub pg_data_dir: Option<PathBuf>,
    pub pool: sqlx::PgPool,
}

/// Counters at one moment.
#[derive(Debug, Clone)]
pub struct Sample {
    at: Instant,
    cpu_s: BTreeMap<String, f64>,
    tables: BTreeMap<String, TableWrites>,
    wal_bytes: i64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct TableWrites {
    pub inserts: f64,
    pub updates: f64,
    /// Updates that were HOT (no index entry written).
    pub hot_updates: f64,
    pub deletes: f64,
}

impl TableWrites {
    pub fn total(&self) -> f64 {
        self.inserts + self.updates + self.deletes
    }

    fn minus(&self, before: &Self) -> Self {
        Self {
            inserts: self.inserts - before.inserts,
            updates: self.updates - before.updates,
            hot_updates: self.hot_updates - before.hot_updates,
            deletes: self.deletes - before.deletes,
        }
    }

    fn per(&self, n: f64) -> Self {
        Self {
            inserts: self.inserts / n,
            updates: self.updates / n,
            hot_updates: self.hot_updates / n,
            deletes: self.deletes / n,
        }
    }
}

/// What the machine and the database spent between two samples.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Cost {
    pub seconds: f64,
    /// Messages the figures are divided by (delivered, or accepted for intake alone).
    pub messages: u64,
    /// CPU seconds per 1,000 messages, per process ("postgres" holds every backend).
    pub cpu_s_per_1000: BTreeMap<String, f64>,
    /// Every measured process together, as a share of the whole machine over the window
    /// (1.0 is every core busy for the whole time).
    pub machine_share: f64,
    /// Every measured process's share of the machine, one by one.
    pub share_by_process: BTreeMap<String, f64>,
    pub row_writes_per_message: f64,
    pub wal_bytes_per_message: f64,
    /// Row writes per message, per table (partitions summed into their parent).
    pub tables_per_message: BTreeMap<String, TableWrites>,
    /// WAL per message by table, read back after the window ([`Cost::read_wal_by_table`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wal_by_table: Option<crate::wal::WalByTable>,
}

/// The `application_name` of the load tester's own sessions: their backends' CPU is the
/// tester's work (drain polls, proofs), not the deployment's, and is left out.
pub const TESTER_APPLICATION: &str = "herald-loadtest";

/// A pool for the load tester's own queries, named so [`Probe`] can leave its backends out.
pub async fn tester_pool(database_url: &str, connections: u32) -> anyhow::Result<sqlx::PgPool> {
    // Its queries are the proof's and the probes' key lookups (see PROOF_SESSION).
    let options = herald_store::proof_options(database_url)
        .map_err(|err| anyhow::anyhow!("bad database URL: {err}"))?
        .application_name(TESTER_APPLICATION);
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(connections)
        // Kept open: a closed session's CPU would be added to the postmaster's reaped
        // children, where it can no longer be told apart.
        .idle_timeout(None)
        .connect_with(options)
        .await
        .map_err(|err| anyhow::anyhow!("cannot connect to the database: {err}"))
}

impl Probe {
    pub async fn sample(&self) -> anyhow::Result<Sample> {
        let mut cpu: BTreeMap<String, f64> = self
            .processes
            .iter()
            .map(|(name, pid)| (name.clone(), cpu_s(*pid, false)))
            .collect();
        if let Some(dir) = &self.pg_data_dir {
            let tester: Vec<i32> =
                sqlx::query_scalar("SELECT pid FROM pg_stat_activity WHERE application_name = $1")
                    .bind(TESTER_APPLICATION)
                    .fetch_all(&self.pool)
                    .await?;
            let tester_s: f64 = tester.iter().map(|pid| cpu_s(*pid, false)).sum();
            cpu.insert("postgres".to_owned(), postgres_cpu_s(dir) - tester_s);
        }
        // Statistics of other sessions reach the shared counters at most a second after
        // their transaction; a fresh snapshot is taken per statement outside a transaction.
        let rows: Vec<(String, i64, i64, i64, i64)> = sqlx::query_as(
            "SELECT coalesce(p.relname, s.relname)::text,
                    sum(s.n_tup_ins)::bigint, sum(s.n_tup_upd)::bigint,
                    sum(s.n_tup_hot_upd)::bigint, sum(s.n_tup_del)::bigint
               FROM pg_stat_user_tables s
               LEFT JOIN pg_inherits i ON i.inhrelid = s.relid
               LEFT JOIN pg_class p ON p.oid = i.inhparent
              GROUP BY 1",
        )
        .fetch_all(&self.pool)
        .await?;
        let tables = rows
            .into_iter()
            .map(|(name, ins, upd, hot, del)| {
                (
                    name,
                    TableWrites {
                        inserts: ins as f64,
                        updates: upd as f64,
                        hot_updates: hot as f64,
                        deletes: del as f64,
                    },
                )
            })
            .collect();
        let wal_bytes: i64 = sqlx::query_scalar("SELECT (pg_current_wal_lsn() - '0/0')::bigint")
            .fetch_one(&self.pool)
            .await?;
        Ok(Sample {
            at: Instant::now(),
            cpu_s: cpu,
            tables,
            wal_bytes,
        })
    }

    /// Waits until the statistics of every session have reached the shared counters: a busy
    /// session publishes its counts at most a second late, but an idle one only after up to
    /// ten seconds, so the counters must stay unchanged for eleven (at most 40 s in all).
    pub async fn settled_sample(&self) -> anyhow::Result<Sample> {
        let writes = |s: &Sample| s.tables.values().map(TableWrites::total).sum::<f64>();
        let mut last = self.sample().await?;
        let mut unchanged_since = Instant::now();
        let deadline = Instant::now() + std::time::Duration::from_secs(40);
        while unchanged_since.elapsed() < std::time::Duration::from_secs(11)
            && Instant::now() < deadline
        {
            tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
            let next = self.sample().await?;
            if writes(&next) != writes(&last) {
                unchanged_since = Instant::now();
            }
            last = next;
        }
        Ok(last)
    }
}

impl Cost {
    pub fn between(before: &Sample, after: &Sample, messages: u64) -> Self {
        let seconds = after.at.duration_since(before.at).as_secs_f64().max(0.001);
        let n = (messages as f64).max(1.0);
        let cores = std::thread::available_parallelism()
            .map(|n| n.get() as f64)
            .unwrap_or(1.0);
        let spent: BTreeMap<String, f64> = after
            .cpu_s
            .iter()
            .map(|(name, s)| {
                let was = before.cpu_s.get(name).copied().unwrap_or(0.0);
                (name.clone(), (s - was).max(0.0))
            })
            .collect();
        let tables: BTreeMap<String, TableWrites> = after
            .tables
            .iter()
            .map(|(name, w)| {
                let was = before.tables.get(name).copied().unwrap_or_default();
                (name.clone(), w.minus(&was))
            })
            .filter(|(_, w)| w.total() > 0.0)
            .collect();
        // (An empty f64 sum is -0.0; adding 0.0 makes it print as 0.)
        let writes: f64 = tables.values().map(TableWrites::total).sum::<f64>() + 0.0;
        Self {
            seconds,
            messages,
            cpu_s_per_1000: spent
                .iter()
                .map(|(name, s)| (name.clone(), s * 1000.0 / n))
                .collect(),
            machine_share: spent.values().sum::<f64>() / (seconds * cores),
            share_by_process: spent
                .iter()
                .map(|(name, s)| (name.clone(), s / (seconds * cores)))
                .collect(),
            row_writes_per_message: writes / n,
            wal_bytes_per_message: (after.wal_bytes - before.wal_bytes) as f64 / n,
            tables_per_message: tables
                .into_iter()
                .map(|(name, w)| (name, w.per(n)))
                .collect(),
            wal_by_table: None,
        }
    }

    /// Adds which tables the WAL between the two samples came from ([`crate::wal`]): read
    /// back from the server's WAL after the window, so call it after the `after` sample.
    /// `own_server`: the tester started this PostgreSQL and may create the extension in it;
    /// in anyone else's database it is used only if already installed.
    pub async fn read_wal_by_table(
        &mut self,
        pool: &sqlx::PgPool,
        before: &Sample,
        after: &Sample,
        own_server: bool,
    ) {
        let (from, to) = (before.wal_bytes, after.wal_bytes);
        self.wal_by_table =
            Some(crate::wal::by_table(pool, from, to, self.messages, own_server).await);
    }

    /// CPU seconds per 1,000 messages, every process together.
    pub fn cpu_total_per_1000(&self) -> f64 {
        self.cpu_s_per_1000.values().sum()
    }

    pub fn render(&self) -> String {
        let mut out = format!(
            "cost per delivered message ({} messages over {:.1}s)\n  \
             row writes {:.1}, WAL {:.2} kB, CPU {:.3} s per 1,000 ({:.0}% of the machine)\n",
            self.messages,
            self.seconds,
            self.row_writes_per_message,
            self.wal_bytes_per_message / 1000.0,
            self.cpu_total_per_1000(),
            self.machine_share * 100.0
        );
        let mut by_cpu: Vec<_> = self.cpu_s_per_1000.iter().collect();
        by_cpu.sort_by(|a, b| b.1.total_cmp(a.1));
        out.push_str("  CPU s per 1,000 by process:");
        for (name, s) in by_cpu {
            out.push_str(&format!(" {name} {s:.3}"));
        }
        out.push('\n');
        let mut by_writes: Vec<_> = self.tables_per_message.iter().collect();
        by_writes.sort_by(|a, b| b.1.total().total_cmp(&a.1.total()));
        out.push_str("  row writes per message by table (ins/upd[hot]/del):");
        for (name, w) in by_writes {
            out.push_str(&format!(
                "\n    {name:<22} {:.2}  ({:.2}/{:.2}[{:.2}]/{:.2})",
                w.total(),
                w.inserts,
                w.updates,
                w.hot_updates,
                w.deletes
            ));
        }
        out.push('\n');
        if let Some(wal) = &self.wal_by_table {
            out.push_str(&wal.render());
        }
        out
    }
}

/// CPU seconds (user + system) a process used so far; with `reaped`, also what its exited
/// children used (the kernel adds a child's times to its parent's when the parent reaps it).
pub fn cpu_s(pid: i32, reaped: bool) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let Some(rest) = stat.rsplit_once(')').map(|(_, rest)| rest) else {
        return 0.0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime, stime, cutime, cstime are fields 14 to 17 of the line: 12 to 15 after the name
    // and the state.
    let range = if reaped { 11..15 } else { 11..13 };
    let ticks: f64 = fields
        .get(range)
        .map(|f| f.iter().filter_map(|v| v.parse::<f64>().ok()).sum())
        .unwrap_or(0.0);
    // Linux reports process times in USER_HZ, which is 100 on every architecture it runs on.
    ticks / 100.0
}

/// CPU seconds of a PostgreSQL server: its postmaster (from `postmaster.pid`), every process
/// it started that still runs (backends, WAL writer, checkpointer, …) and every one it reaped
/// (backends of sessions that ended).
pub fn postgres_cpu_s(data_dir: &Path) -> f64 {
    let Some(postmaster) = std::fs::read_to_string(data_dir.join("postmaster.pid"))
        .ok()
        .and_then(|text| text.lines().next()?.trim().parse::<i32>().ok())
    else {
        return 0.0;
    };
    let children: f64 = herald_testkit::children_of(postmaster)
        .into_iter()
        .map(|pid| cpu_s(pid, false))
        .sum();
    cpu_s(postmaster, true) + children
}

/// Writes a benchmark's JSON report as `<out>/<kind>-<start time>.json`, prints `text` and
/// where the report is.
pub fn write_report(
    out: &Path,
    kind: &str,
    started_at: chrono::DateTime<chrono::Utc>,
    report: &impl Serialize,
    text: &str,
) -> anyhow::Result<PathBuf> {
    let path = out.join(format!(
        "{kind}-{}.json",
        started_at.format("%Y%m%d-%H%M%S")
    ));
    std::fs::create_dir_all(out)?;
    std::fs::write(&path, serde_json::to_vec_pretty(report)?)?;
    println!("{text}");
    println!("report: {}", path.display());
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(cpu: &[(&str, f64)], writes: &[(&str, f64, f64)], wal: i64) -> Sample {
        Sample {
            at: Instant::now(),
            cpu_s: cpu.iter().map(|(n, s)| ((*n).to_owned(), *s)).collect(),
            tables: writes
                .iter()
                .map(|(n, ins, upd)| {
                    (
                        (*n).to_owned(),
                        TableWrites {
                            inserts: *ins,
                            updates: *upd,
                            ..TableWrites::default()
                        },
                    )
                })
                .collect(),
            wal_bytes: wal,
        }
    }

    #[test]
    fn figures_are_the_differences_divided_by_the_messages() {
        let before = sample(&[("api", 1.0)], &[("outbox", 10.0, 0.0)], 1_000);
        let after = sample(
            &[("api", 3.0)],
            &[("outbox", 210.0, 100.0), ("ledger", 100.0, 0.0)],
            701_000,
        );
        let cost = Cost::between(&before, &after, 100);
        assert_eq!(cost.cpu_s_per_1000["api"], 20.0);
        assert_eq!(cost.row_writes_per_message, 4.0);
        assert_eq!(cost.wal_bytes_per_message, 7_000.0);
        assert_eq!(cost.tables_per_message["outbox"].updates, 1.0);
        assert_eq!(cost.tables_per_message["ledger"].inserts, 1.0);
    }

    #[test]
    fn reads_this_process_cpu() {
        let start = cpu_s(std::process::id() as i32, false);
        let mut x = 0u64;
        for i in 0..50_000_000u64 {
            x = x.wrapping_add(i * i);
        }
        std::hint::black_box(x);
        assert!(cpu_s(std::process::id() as i32, false) > start);
    }
}
