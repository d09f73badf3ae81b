//! `herald verify`: the proof that every accepted message got where it should. Every message in
//! the database is classified against the provider's own record (submits and the receipts it
//! sent), and every effect the provider took must belong to a message; the verdict is decided
//! by `herald_core::verdict`.

use std::time::Duration;

use herald_core::verdict::{Expectations, Verdict};
use sqlx::PgPool;

use crate::cli::VerifyArgs;
use crate::telemetry;

pub async fn main(args: VerifyArgs) -> anyhow::Result<i32> {
    telemetry::init_logs(crate::cli::LogFormat::Pretty);
    let cannot = |err: &dyn std::fmt::Display| {
        anyhow::anyhow!(
            "cannot connect to {}: {err}",
            crate::cli::masked_url(&args.database_url)
        )
    };
    let options = herald_store::proof_options(&args.database_url).map_err(|e| cannot(&e))?;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect_with(options)
        .await
        .map_err(|e| cannot(&e))?;
    let verdict = verify(&pool, &args.provider_sim, args.expect.clone()).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&verdict)?);
    } else {
        for line in verdict.lines() {
            println!("{line}");
        }
    }
    Ok(if verdict.ok() { 0 } else { 1 })
}

/// The verdict over the whole database and the simulator's `GET /v1/effects`.
pub async fn verify(
    pool: &PgPool,
    provider_sim: &str,
    expected: Expectations,
) -> anyhow::Result<Verdict> {
    // The database first, then the provider: see `herald_store::verify::gather`.
    let gathered = herald_store::verify::gather(pool, None).await?;
    let provider =
        herald_provider_sim::fetch_provider_views(provider_sim, Duration::from_secs(60)).await?;
    Ok(herald_store::verify::conclude(pool, &gathered, &provider, expected).await?)
}
