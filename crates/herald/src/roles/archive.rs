//! `herald archive`: what retention wrote to `--archive-dir` before removing it, read back.
//! `verify` checks each file against its manifest; `restore` puts the rows back
//! (`herald_store::archive`).

use std::path::PathBuf;

use crate::cli::ArchiveCommand;

pub async fn main(command: ArchiveCommand) -> anyhow::Result<i32> {
    match command {
        ArchiveCommand::Verify { paths } => Ok(verify(&paths)),
        ArchiveCommand::Restore {
            database_url,
            paths,
        } => restore(&database_url, &paths).await,
    }
}

/// Every manifest under the paths; a path that cannot be read is reported and counted.
fn manifests(paths: &[PathBuf], failed: &mut u64) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for path in paths {
        match herald_store::archive::manifests(path) {
            Ok(manifests) if manifests.is_empty() => {
                println!("FAILED {}: no archive manifest there", path.display());
                *failed += 1;
            }
            Ok(manifests) => found.extend(manifests),
            Err(err) => {
                println!("FAILED {err}");
                *failed += 1;
            }
        }
    }
    found
}

fn verify(paths: &[PathBuf]) -> i32 {
    let mut failed = 0;
    let found = manifests(paths, &mut failed);
    let (mut rows, mut ok) = (0, 0);
    for manifest in &found {
        match herald_store::archive::verify(manifest) {
            Ok(m) => {
                rows += m.rows;
                ok += 1;
                println!(
                    "OK     {} ({} {}, ids {} .. {}, {} bytes, sha256 {})",
                    m.file, m.rows, m.kind, m.first_id, m.last_id, m.bytes, m.sha256
                );
            }
            Err(err) => {
                failed += 1;
                println!("FAILED {err}");
            }
        }
    }
    println!("{ok} file(s) verified, {rows} row(s); {failed} failed");
    i32::from(failed > 0)
}

async fn restore(database_url: &str, paths: &[PathBuf]) -> anyhow::Result<i32> {
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(database_url)
        .await
        .map_err(|err| {
            anyhow::anyhow!(
                "cannot connect to {}: {err}",
                crate::cli::masked_url(database_url)
            )
        })?;
    let mut failed = 0;
    let found = manifests(paths, &mut failed);
    for manifest in &found {
        match herald_store::archive::restore(&pool, manifest).await {
            Ok(rows) => println!("restored {rows} row(s) from {}", manifest.display()),
            Err(err) => {
                failed += 1;
                println!("FAILED {}: {err}", manifest.display());
            }
        }
    }
    Ok(i32::from(failed > 0))
}
