//! `herald verify`: the proof that nothing was lost or doubled.

use std::time::Duration;

use serde::Serialize;
use sqlx::PgPool;

use crate::cli::VerifyArgs;
use crate::telemetry;

/// The database's counts checked against the provider's own record.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    #[serde(flatten)]
    pub ledger: herald_store::verify::LedgerSummary,
    /// Submits the provider recorded (first ones and repeats of a key).
    pub provider_submits: u64,
    /// Keys the provider received more than once (allowed: retries carry the same key).
    pub provider_duplicate_submits: u64,
    /// Ledger effects the provider has no submit for (must be 0).
    pub missing_at_provider: u64,
}

impl Report {
    /// Nothing lost, nothing doubled, every effect backed by a provider submit.
    pub fn ok(&self) -> bool {
        self.ledger.lost == 0 && self.ledger.duplicate_effects == 0 && self.missing_at_provider == 0
    }

    pub fn print(&self) {
        let l = &self.ledger;
        println!("accepted:                   {}", l.accepted);
        println!("delivered (ledger rows):    {}", l.delivered);
        println!("dead:                       {}", l.dead);
        println!("failed:                     {}", l.failed);
        println!("lost:                       {}", l.lost);
        println!("duplicate effects:          {}", l.duplicate_effects);
        println!("provider submits:           {}", self.provider_submits);
        println!(
            "provider duplicate submits: {} (allowed: same key)",
            self.provider_duplicate_submits
        );
        println!("effects missing at provider: {}", self.missing_at_provider);
        if !l.lost_sample.is_empty() {
            println!("some lost ids: {:?}", l.lost_sample);
        }
        println!("verdict: {}", if self.ok() { "OK" } else { "FAILED" });
    }
}

pub async fn main(args: VerifyArgs) -> anyhow::Result<i32> {
    telemetry::init_logs(crate::cli::LogFormat::Pretty);
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect(&args.database_url)
        .await
        .map_err(|err| {
            anyhow::anyhow!(
                "cannot connect to {}: {err}",
                crate::cli::masked_url(&args.database_url)
            )
        })?;
    let report = verify(&pool, &args.provider_sim).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        report.print();
    }
    Ok(if report.ok() { 0 } else { 1 })
}

/// Builds the report from the database and the simulator's `GET /v1/submits`.
pub async fn verify(pool: &PgPool, provider_sim: &str) -> anyhow::Result<Report> {
    let ledger = herald_store::verify::ledger_summary(pool).await?;
    let keys = herald_store::verify::ledger_keys(pool).await?;
    let counts =
        herald_provider_sim::fetch_submit_counts(provider_sim, Duration::from_secs(60)).await?;
    let missing_at_provider = keys
        .iter()
        .filter(|key| !counts.contains_key(key.as_str()))
        .count() as u64;
    Ok(Report {
        ledger,
        provider_submits: counts.values().sum(),
        provider_duplicate_submits: counts.values().map(|n| n.saturating_sub(1)).sum(),
        missing_at_provider,
    })
}
