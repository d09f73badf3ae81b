//! The run's report: the plain-text summary, the JSON file, and `compare`.
//!
//! Longer than 400 lines: the text, JSON and comparison forms of one report type.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::breakdown::{Stage, Wall};
use crate::chaos::StepRecord;
use crate::latency::{ms, Percentiles};
use crate::load::LoadSettings;
use crate::proof::Proof;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    pub name: String,
    pub started_at: String,
    /// `local` (a deployment started for this run) or the API URL.
    pub target: String,
    /// The deployment's shape, for a local run (poller flags and the like).
    pub shape: Vec<String>,
    pub settings: LoadSettings,
    pub load: LoadCounts,
    pub drain: Drain,
    pub proof: Proof,
    /// `herald verify`'s verdict over the whole database (herald-store's verifier); for a
    /// local run it covers exactly this load (and requests cut off after their commit).
    pub database: serde_json::Value,
    pub latency: Latency,
    pub throughput: Throughput,
    pub breakdown: Vec<Stage>,
    pub wall: Option<Wall>,
    /// Roles whose counters restarted during the run (killed and started again).
    pub restarted_roles: Vec<String>,
    pub chaos: Vec<StepRecord>,
    pub timeline: Vec<TimelineSecond>,
    pub ok: bool,
    /// CPU per process, row writes and WAL per delivered message, from just before the load
    /// to the end of the drain (absent in reports written before it was measured).
    #[serde(default)]
    pub cost: Option<crate::cost::Cost>,
    /// Re-drives of this run's messages (none expected without chaos: waiting is never one).
    #[serde(default)]
    pub redriven: Redriven,
}

/// What was re-driven among a run's messages, read from the database after the drain.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Redriven {
    /// Outbox rows re-driven at least once because their queue store no longer held the job.
    pub lost_jobs: u64,
    /// Claims re-driven because their worker stopped renewing the lease (RETRYING events).
    pub expired_claims: u64,
    /// Sends DEAD at the end.
    pub dead: u64,
}

impl Redriven {
    /// Reads the counts for `ids`, a bounded number at a time: with the 193,560 ids of one
    /// capacity step in one array, PostgreSQL refused the statement ("Cannot enlarge string
    /// buffer containing 1073741809 bytes").
    pub async fn of(pool: &sqlx::PgPool, ids: &[uuid::Uuid]) -> anyhow::Result<Self> {
        let mut total = Self::default();
        for chunk in ids.chunks(20_000) {
            let part = Self::of_chunk(pool, chunk).await?;
            total.lost_jobs += part.lost_jobs;
            total.expired_claims += part.expired_claims;
            total.dead += part.dead;
        }
        Ok(total)
    }

    async fn of_chunk(pool: &sqlx::PgPool, ids: &[uuid::Uuid]) -> anyhow::Result<Self> {
        let (lost_jobs, expired_claims, dead): (i64, i64, i64) = sqlx::query_as(
            "SELECT
                 (SELECT count(*) FROM outbox
                  WHERE message_id = ANY($1) AND last_error LIKE 'stale:%'),
                 (SELECT count(*) FROM message_events
                  WHERE message_id = ANY($1) AND state = 'RETRYING'
                    AND detail->>'reason' LIKE 'claim lease expired%'),
                 (SELECT count(*) FROM outbox
                  WHERE message_id = ANY($1) AND job_type = 'send' AND status = 'DEAD')",
        )
        .bind(ids)
        .fetch_one(pool)
        .await?;
        Ok(Self {
            lost_jobs: lost_jobs as u64,
            expired_claims: expired_claims as u64,
            dead: dead as u64,
        })
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct LoadCounts {
    pub seconds: f64,
    pub requests: u64,
    pub messages_due: u64,
    pub accepted: u64,
    pub not_sent: u64,
    pub failed: u64,
    pub errors: std::collections::BTreeMap<String, u64>,
    pub retries: u64,
    pub replays: u64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Drain {
    /// Every accepted id had an outcome before the timeout.
    pub complete: bool,
    /// From the end of the load until every id had an outcome (or the timeout).
    pub seconds: f64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Latency {
    /// From when the request was due to its 2xx, one sample per request.
    pub accept: Percentiles,
    /// From the accept transaction to the provider's record of the first submit.
    pub accept_to_submit: Option<Percentiles>,
    /// From the accept transaction to the ACCEPTED event.
    pub accept_to_accepted: Percentiles,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Throughput {
    pub offered_per_s: f64,
    pub accepted_per_s: f64,
    /// Delivered messages over the time from the start to the last ACCEPTED.
    pub delivered_per_s: f64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct TimelineSecond {
    pub second: u64,
    pub offered: u64,
    pub accepted: u64,
    pub errors: u64,
    /// Messages that became ACCEPTED in this second.
    pub delivered: u64,
    pub accept_p99_ms: f64,
    /// p99 accept → ACCEPTED of the messages accepted in this second.
    pub end_to_end_p99_ms: f64,
}

impl Report {
    pub fn print_summary(&self) {
        let p = &self.proof;
        println!();
        println!("== {} ({}) ==", self.name, self.started_at);
        println!("target: {}", self.target);
        if !self.shape.is_empty() {
            println!("shape:  {}", self.shape.join(" "));
        }
        let phases: Vec<String> = self
            .settings
            .phases
            .iter()
            .map(|ph| format!("{}/s for {}s", ph.rate, ph.duration.as_secs_f64()))
            .collect();
        println!(
            "load:   {} ({} per request, {} B payload, {} recipients)",
            phases.join(", then "),
            self.settings.batch,
            self.settings.payload_bytes,
            self.settings.recipients
        );
        let l = &self.load;
        println!(
            "sent:   {} messages due, {} accepted (2xx), {} failed, {} not sent (in-flight cap), {} retries, {} replays",
            l.messages_due, l.accepted, l.failed, l.not_sent, l.retries, l.replays
        );
        for (reason, n) in &l.errors {
            println!("        {n} failed: {reason}");
        }
        println!(
            "drain:  {} in {:.1}s after the load",
            if self.drain.complete {
                "complete"
            } else {
                "TIMED OUT"
            },
            self.drain.seconds
        );
        println!();
        println!("proof");
        println!("  accepted                    {}", p.accepted);
        println!("  delivered                   {}", p.delivered);
        println!("  lost                        {}", p.lost);
        println!(
            "  doubled                     {}   (duplicate effects {}, replays answered with a new id {})",
            p.doubled(),
            p.verdict.doubled(),
            p.replay_mismatches
        );
        println!(
            "  duplicate provider submits  {}   (allowed: same idempotency key)",
            p.duplicate_provider_submits
        );
        println!(
            "  re-driven                   {} lost jobs, {} expired claims; {} DEAD",
            self.redriven.lost_jobs, self.redriven.expired_claims, self.redriven.dead
        );
        println!("  every message's end:");
        for line in p.verdict.lines() {
            println!("    {line}");
        }
        println!();
        println!("latency");
        println!(
            "  accept (due → 2xx)          {}",
            self.latency.accept.line()
        );
        match &self.latency.accept_to_submit {
            Some(pc) => println!("  accept → provider submit    {}", pc.line()),
            None => println!("  accept → provider submit    (no submit log: --sim-log)"),
        }
        println!(
            "  accept → ACCEPTED           {}",
            self.latency.accept_to_accepted.line()
        );
        let t = &self.throughput;
        println!(
            "throughput: offered {:.0}/s, accepted {:.0}/s, delivered end to end {:.0}/s",
            t.offered_per_s, t.accepted_per_s, t.delivered_per_s
        );
        println!();
        self.print_breakdown();
        if !self.chaos.is_empty() {
            println!();
            println!("chaos");
            for step in &self.chaos {
                println!(
                    "  {:>6.1}s – {:>6.1}s  {}{}{}",
                    step.started_s,
                    step.ended_s,
                    step.step,
                    step.pid.map(|p| format!(" (pid {p})")).unwrap_or_default(),
                    match &step.error {
                        Some(e) => format!("  FAILED: {e}"),
                        None => "  ok".to_owned(),
                    }
                );
            }
        }
        println!();
        let wrong: Vec<String> = p
            .verdict
            .violations()
            .iter()
            .map(|v| format!("{} {} (expected {})", v.class, v.found, v.expected))
            .collect();
        println!(
            "verdict: {} (lost {}, doubled {}{})",
            if self.ok { "OK" } else { "FAILED" },
            p.lost,
            p.doubled(),
            if wrong.is_empty() {
                String::new()
            } else {
                format!("; wrong: {}", wrong.join(", "))
            }
        );
    }

    pub fn print_breakdown(&self) {
        println!("breakdown (time spent per stage during the run, every role)");
        println!(
            "  {:<14} {:>10} {:>8} {:>9} {:>12}  {:<12} what",
            "stage", "seconds", "calls", "mean", "per message", "roles"
        );
        for s in &self.breakdown {
            println!(
                "  {:<14} {:>10.3} {:>8} {:>9} {:>12}  {:<12} {}",
                s.name,
                s.seconds,
                s.calls,
                ms(s.mean_ms),
                ms(s.ms_per_message),
                s.roles.join(","),
                s.what,
            );
        }
        if !self.restarted_roles.is_empty() {
            println!(
                "  (counters restarted during the run: {}; their increases since the restart are included)",
                self.restarted_roles.join(", ")
            );
        }
        match &self.wall {
            Some(Wall {
                stage,
                previous: Some(file),
                ms_per_message,
                previous_ms_per_message: Some(before),
            }) => println!(
                "  the new wall: {stage} — grew most since {file}: {} → {} per message ({:+.0} %)",
                ms(*before),
                ms(*ms_per_message),
                pct(*ms_per_message, *before)
            ),
            Some(w) => println!(
                "  the wall: {} — the most time per message ({}); no previous run to compare with",
                w.stage,
                ms(w.ms_per_message)
            ),
            None => println!("  no stage recorded any time"),
        }
        if let Some(cost) = &self.cost {
            println!();
            print!("{}", cost.render());
        }
    }

    /// Writes the report as pretty JSON.
    pub fn write(&self, path: &Path) -> anyhow::Result<()> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(path, serde_json::to_vec_pretty(self)?)?;
        Ok(())
    }

    pub fn read(path: &Path) -> anyhow::Result<Self> {
        let bytes = std::fs::read(path)
            .map_err(|err| anyhow::anyhow!("cannot read {}: {err}", path.display()))?;
        serde_json::from_slice(&bytes)
            .map_err(|err| anyhow::anyhow!("{} is not a load test report: {err}", path.display()))
    }
}

fn pct(now: f64, before: f64) -> f64 {
    if before > 0.0 {
        (now / before - 1.0) * 100.0
    } else {
        0.0
    }
}

/// The newest `*.json` report in `dir`, if any.
pub fn latest_in(dir: &Path) -> Option<PathBuf> {
    let mut reports: Vec<(std::time::SystemTime, PathBuf)> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .filter_map(|p| Some((std::fs::metadata(&p).ok()?.modified().ok()?, p)))
        .collect();
    reports.sort();
    reports.pop().map(|(_, p)| p)
}

/// Prints two reports side by side with the ratio B / A.
pub fn compare(a: &Report, b: &Report) -> String {
    let mut out = String::new();
    let mut row = |what: &str, x: f64, y: f64, unit: &str| {
        let ratio = if x != 0.0 {
            format!("{:.2}x", y / x)
        } else {
            "-".to_owned()
        };
        out.push_str(&format!(
            "| {what} | {} | {} | {ratio} |\n",
            num(x, unit),
            num(y, unit)
        ));
    };
    row(
        "offered (msg/s)",
        a.throughput.offered_per_s,
        b.throughput.offered_per_s,
        "",
    );
    row(
        "accepted (msg/s)",
        a.throughput.accepted_per_s,
        b.throughput.accepted_per_s,
        "",
    );
    row(
        "delivered end to end (msg/s)",
        a.throughput.delivered_per_s,
        b.throughput.delivered_per_s,
        "",
    );
    row(
        "drain after the load (s)",
        a.drain.seconds,
        b.drain.seconds,
        "",
    );
    for (what, pa, pb) in [
        ("accept", &a.latency.accept, &b.latency.accept),
        (
            "accept → ACCEPTED",
            &a.latency.accept_to_accepted,
            &b.latency.accept_to_accepted,
        ),
    ] {
        row(&format!("{what} p50"), pa.p50_ms, pb.p50_ms, "ms");
        row(&format!("{what} p99"), pa.p99_ms, pb.p99_ms, "ms");
        row(&format!("{what} max"), pa.max_ms, pb.max_ms, "ms");
    }
    if let (Some(pa), Some(pb)) = (&a.latency.accept_to_submit, &b.latency.accept_to_submit) {
        row("accept → provider submit p50", pa.p50_ms, pb.p50_ms, "ms");
        row("accept → provider submit p99", pa.p99_ms, pb.p99_ms, "ms");
    }
    for stage in &a.breakdown {
        if let Some(other) = b.breakdown.iter().find(|s| s.name == stage.name) {
            row(
                &format!("{} per message", stage.name),
                stage.ms_per_message,
                other.ms_per_message,
                "ms",
            );
        }
    }
    row("lost", a.proof.lost as f64, b.proof.lost as f64, "");
    row(
        "doubled",
        a.proof.doubled() as f64,
        b.proof.doubled() as f64,
        "",
    );
    row(
        "duplicate provider submits",
        a.proof.duplicate_provider_submits as f64,
        b.proof.duplicate_provider_submits as f64,
        "",
    );
    format!(
        "A: {} ({}){}\nB: {} ({}){}\n\n| | A | B | B / A |\n|---|---:|---:|---:|\n{out}",
        a.name,
        a.started_at,
        shape(a),
        b.name,
        b.started_at,
        shape(b)
    )
}

fn shape(report: &Report) -> String {
    if report.shape.is_empty() {
        String::new()
    } else {
        format!(": {}", report.shape.join(" "))
    }
}

fn num(value: f64, unit: &str) -> String {
    if unit == "ms" {
        ms(value)
    } else if value.fract() == 0.0 || value.abs() >= 100.0 {
        format!("{value:.0}")
    } else {
        format!("{value:.1}")
    }
}

/// `Duration` as seconds (a float) in the JSON report.
pub mod seconds {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        Ok(Duration::from_secs_f64(f64::deserialize(d)?.max(0.0)))
    }
}
