//! The Debian packages Herald's local servers need, and installing the missing ones.

use std::path::Path;

use crate::redis::which;

/// A server program and the Debian package that provides it.
#[derive(Debug, Clone, Copy)]
pub struct Needed {
    pub what: &'static str,
    pub package: &'static str,
    present: fn() -> bool,
}

/// Everything `herald dev` and the test suite start.
pub const NEEDED: [Needed; 3] = [
    Needed {
        what: "PostgreSQL server",
        package: "postgresql-15",
        present: || crate::postgres::bin_dir().is_ok(),
    },
    Needed {
        what: "redis-server",
        package: "redis-server",
        present: || which("redis-server").is_some(),
    },
    Needed {
        what: "etcd",
        package: "etcd-server",
        present: || which("etcd").is_some(),
    },
];

/// The packages whose programs are missing.
pub fn missing() -> Vec<Needed> {
    NEEDED.iter().copied().filter(|n| !(n.present)()).collect()
}

/// Installs missing packages with apt-get when running as root; otherwise fails with the exact
/// command to run.
pub async fn ensure_installed() -> anyhow::Result<()> {
    let missing = missing();
    if missing.is_empty() {
        return Ok(());
    }
    let names: Vec<&str> = missing.iter().map(|n| n.package).collect();
    let command = format!("apt-get install -y {}", names.join(" "));
    if !nix::unistd::Uid::effective().is_root() || !Path::new("/usr/bin/apt-get").exists() {
        anyhow::bail!(
            "missing: {}. Install them with: sudo apt-get update && sudo {command}",
            missing
                .iter()
                .map(|n| n.what)
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    tracing::info!(packages = %names.join(" "), "installing missing packages");
    for args in [
        vec!["update", "-qq"],
        [vec!["install", "-y", "-qq"], names.clone()].concat(),
    ] {
        let status = tokio::process::Command::new("apt-get")
            .args(&args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .await?;
        anyhow::ensure!(status.success(), "apt-get {} failed", args.join(" "));
    }
    let still = missing_after_install();
    anyhow::ensure!(
        still.is_empty(),
        "still missing after install: {}",
        still.join(", ")
    );
    Ok(())
}

fn missing_after_install() -> Vec<&'static str> {
    missing().iter().map(|n| n.package).collect()
}
