//! What operators look at is checked against what the roles really export: a real Prometheus
//! scrapes every role under a short load, every dashboard panel's query must return series,
//! every alert rule must evaluate cleanly over metrics that exist, and docs/METRICS.md must
//! list exactly the metrics the roles export.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use herald_testkit::{LocalPrometheus, ScrapeJob};
use serde_json::Value;

use crate::wait::{until, PATIENCE};
use crate::{Deployment, Options};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn host(url: &str) -> String {
    url.trim_start_matches("http://").to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboards_alerts_and_metric_docs_match_what_the_roles_export() {
    let herald = Deployment::start(Options {
        fleet: true,
        pollers: 2,
        ..Options::default()
    })
    .await;
    let jobs = vec![
        scrape("herald-api", &[&herald.api_url]),
        scrape(
            "herald-poller",
            &herald
                .poller_admins
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>(),
        ),
        scrape("herald-worker-send", &[&herald.worker_admin]),
        scrape("herald-worker-status", &[&herald.status_worker_admin]),
        scrape("herald-provider-sim", &[&herald.sim_url]),
    ];
    let rules = repo_root().join("dashboards/herald-alerts.rules.yml");
    let prometheus = LocalPrometheus::start(&jobs, &[rules])
        .await
        .expect("prometheus");

    let ids = herald.send(2_000, 200, 2).await;
    herald
        .wait_delivered(ids.len() as i64, Duration::from_secs(120))
        .await;
    wait_for_targets(&prometheus, 6).await;

    let exported = exported_metrics(&herald).await;
    let documented = documented_metrics();
    let mut undocumented = Vec::new();
    for name in exported.difference(&documented) {
        undocumented.push(format!("{name} is exported but not in docs/METRICS.md"));
    }
    for name in documented.difference(&exported) {
        undocumented.push(format!(
            "{name} is in docs/METRICS.md but no role exports it"
        ));
    }
    assert!(
        undocumented.is_empty(),
        "{} problems:\n{}",
        undocumented.len(),
        undocumented.join("\n")
    );

    let dashboards = dashboard_queries();
    assert!(
        dashboards.len() >= 4,
        "expected the four dashboards, found {}",
        dashboards.len()
    );
    // Receipts and the backlog gauges trail the sends, and a rule is healthy only once it was
    // evaluated: wait until scrapes and rule evaluations have seen the load.
    let alerts = until(
        "every panel query returns series and every alert rule evaluates cleanly",
        Duration::from_secs(120),
        || prometheus_problems(&prometheus, &dashboards),
    )
    .await;
    assert!(alerts >= 9, "the rules file holds only {alerts} alerts");
}

/// How many alerting rules Prometheus evaluates, when every dashboard query returns series,
/// every rule is healthy and every metric they read is stored; else every problem seen.
async fn prometheus_problems(
    prometheus: &LocalPrometheus,
    dashboards: &[(String, String, String)],
) -> Result<usize, String> {
    let stored: BTreeSet<String> = prometheus
        .metric_names()
        .await
        .map_err(|err| format!("{err:#}"))?
        .into_iter()
        .collect();
    let mut failures = Vec::new();
    for (file, panel, expr) in dashboards {
        let query = substitute_variables(expr);
        match prometheus.query(&query).await {
            Ok(series) if series.is_empty() => {
                failures.push(format!("{file} / {panel}: no series for {query}"))
            }
            Ok(_) => {}
            Err(err) => failures.push(format!("{file} / {panel}: {err:#}")),
        }
        for name in referenced_metrics(expr) {
            if !stored.contains(&name) {
                failures.push(format!("{file} / {panel}: {name} is exported by no role"));
            }
        }
    }

    let groups = prometheus.rules().await.map_err(|err| format!("{err:#}"))?;
    let mut alerts = 0;
    for rule in groups
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
    {
        let name = rule["name"].as_str().unwrap_or("?").to_owned();
        let expr = rule["query"].as_str().unwrap_or_default().to_owned();
        alerts += usize::from(rule["type"] == "alerting");
        if rule["health"] != "ok" {
            failures.push(format!(
                "alert {name}: health {} ({})",
                rule["health"], rule["lastError"]
            ));
        }
        if let Err(err) = prometheus.query(&expr).await {
            failures.push(format!("alert {name}: {err:#}"));
        }
        for metric in referenced_metrics(&expr) {
            if !stored.contains(&metric) {
                failures.push(format!("alert {name}: {metric} is exported by no role"));
            }
        }
    }
    if failures.is_empty() {
        Ok(alerts)
    } else {
        Err(format!(
            "{} problems over {} panel queries and {alerts} alerts:\n{}",
            failures.len(),
            dashboards.len(),
            failures.join("\n")
        ))
    }
}

fn scrape(job: &str, urls: &[&str]) -> ScrapeJob {
    ScrapeJob {
        job: job.to_owned(),
        targets: urls.iter().map(|u| host(u)).collect(),
    }
}

async fn wait_for_targets(prometheus: &LocalPrometheus, count: usize) {
    until(&format!("{count} herald targets up"), PATIENCE, || async {
        let up = prometheus
            .query("up{job=~\"herald-.*\"} == 1")
            .await
            .map_err(|err| format!("{err:#}"))?;
        if up.len() >= count {
            Ok(())
        } else {
            Err(format!("{} targets up", up.len()))
        }
    })
    .await
}

/// Metric names from every role's `/metrics`, read from the `# TYPE` lines (so histograms
/// count once, without their `_bucket`/`_sum`/`_count` series).
async fn exported_metrics(herald: &Deployment) -> BTreeSet<String> {
    let mut urls = vec![
        herald.api_url.clone(),
        herald.worker_admin.clone(),
        herald.status_worker_admin.clone(),
        herald.sim_url.clone(),
    ];
    urls.extend(herald.poller_admins.iter().cloned());
    let mut names = BTreeSet::new();
    for url in urls {
        let text = herald.metrics(&url).await;
        names.extend(
            text.lines()
                .filter_map(|line| line.strip_prefix("# TYPE "))
                .filter_map(|rest| rest.split_whitespace().next())
                .map(str::to_owned),
        );
    }
    assert!(names.len() > 20, "too few metrics exported: {names:?}");
    names
}

/// The first backticked name of every table row in docs/METRICS.md.
fn documented_metrics() -> BTreeSet<String> {
    let text = std::fs::read_to_string(repo_root().join("docs/METRICS.md")).expect("METRICS.md");
    text.lines()
        .filter(|line| line.starts_with('|'))
        .filter_map(|line| line.split('|').nth(1))
        .filter_map(|cell| {
            let name = cell.trim().strip_prefix('`')?.split('`').next()?;
            name.starts_with("herald_").then(|| name.to_owned())
        })
        .collect()
}

/// (file, panel title, expr) for every query of every panel of every dashboard, rows included.
fn dashboard_queries() -> Vec<(String, String, String)> {
    let mut queries = Vec::new();
    let dir = repo_root().join("dashboards");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("dashboards/")
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    for path in files {
        let file = path.file_name().unwrap().to_string_lossy().into_owned();
        let dashboard: Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).expect("valid JSON");
        let mut panels: Vec<Value> = dashboard["panels"].as_array().cloned().unwrap_or_default();
        while let Some(panel) = panels.pop() {
            panels.extend(panel["panels"].as_array().cloned().unwrap_or_default());
            let title = panel["title"].as_str().unwrap_or("?").to_owned();
            for target in panel["targets"].as_array().into_iter().flatten() {
                if let Some(expr) = target["expr"].as_str() {
                    queries.push((file.clone(), title.clone(), expr.to_owned()));
                }
            }
        }
    }
    queries
}

/// Grafana's variables as Prometheus can take them: interval variables become a window that
/// holds several 1 s scrapes, every other variable (used as `=~"$var"`) matches anything.
fn substitute_variables(expr: &str) -> String {
    let mut out = String::new();
    let mut rest = expr;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let (name, used) = if let Some(inner) = after.strip_prefix('{') {
            let end = inner.find('}').map_or(inner.len(), |e| e + 1);
            (
                inner[..end.saturating_sub(1)]
                    .split(':')
                    .next()
                    .unwrap_or(""),
                end + 1,
            )
        } else {
            let end = after
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(after.len());
            (&after[..end], end)
        };
        out.push_str(match name {
            "__rate_interval" | "__interval" | "__range" => "1m",
            _ => ".*",
        });
        rest = &after[used.min(after.len())..];
    }
    out.push_str(rest);
    out
}

/// `herald_*` metric names an expression reads, with histogram suffixes kept as written (the
/// stored names include them).
fn referenced_metrics(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let bytes = expr.as_bytes();
    let mut i = 0;
    while let Some(found) = expr[i..].find("herald_") {
        let start = i + found;
        let boundary = start == 0 || {
            let c = bytes[start - 1] as char;
            !(c.is_ascii_alphanumeric() || c == '_')
        };
        let end = expr[start..]
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .map_or(expr.len(), |e| start + e);
        if boundary {
            names.insert(expr[start..end].to_owned());
        }
        i = end;
    }
    names
}

#[test]
fn variables_become_windows_and_wildcards() {
    assert_eq!(
        substitute_variables(
            "rate(herald_jobs_total{job_type=~\"$job_type\"}[$__rate_interval]) + ${shard:regex}"
        ),
        "rate(herald_jobs_total{job_type=~\".*\"}[1m]) + .*"
    );
    assert_eq!(
        referenced_metrics("sum(rate(herald_a_bucket[1m])) / max(xherald_b) or herald_c"),
        ["herald_a_bucket", "herald_c"]
            .into_iter()
            .map(str::to_owned)
            .collect()
    );
}
