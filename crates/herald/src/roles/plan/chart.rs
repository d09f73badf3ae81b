//! The Helm chart's values (helm/herald/values.yaml and the files layered on it) as a plan.

use super::*;

/// The values budgets depend on; everything else in the files is the chart's business
/// (values.schema.json checks it). No field has a default here: the chart's values.yaml
/// holds the defaults, so it must be among the files.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Values {
    partitions: u64,
    queue_full_threshold: f64,
    postgresql: Postgresql,
    api: Api,
    poller: Poller,
    workers: Workers,
    redis: Stores,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Postgresql {
    max_connections: u64,
    reserved_connections: u64,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Api {
    replicas: u64,
    database_max_connections: u64,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Poller {
    replicas: u64,
    database_max_connections: u64,
    redis_max_connections: u64,
    autoscaling: Autoscaling,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Autoscaling {
    enabled: bool,
    max_replicas: u64,
}

#[derive(Debug, Deserialize)]
struct Workers {
    send: Worker,
    status: Worker,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Worker {
    replicas: u64,
    database_max_connections: u64,
    redis_max_connections: u64,
}

#[derive(Debug, Deserialize)]
struct Stores {
    send: ChartStore,
    status: ChartStore,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ChartStore {
    shards: u64,
    maxmemory_mb: u64,
    maxclients: u64,
    peak_backlog_jobs: u64,
    bytes_per_job: u64,
    external: External,
}

#[derive(Debug, Deserialize)]
struct External {
    urls: Vec<String>,
}

/// Connections the API holds to each queue store shard: it reads them for readiness only.
const API_REDIS_CONNECTIONS: u64 = 2;

pub struct Release {
    pub plan: Plan,
    pub queue_full_threshold: f64,
    pub sources: String,
}

pub fn load(paths: &[PathBuf]) -> anyhow::Result<Release> {
    let mut merged = serde_json::Value::Object(Default::default());
    for path in paths {
        let text = std::fs::read_to_string(path)
            .map_err(|err| ConfigError(format!("cannot read {}: {err}", path.display())))?;
        let layer: serde_json::Value = serde_yaml_ng::from_str(&text)
            .map_err(|err| ConfigError(format!("{}: {err}", path.display())))?;
        if !layer.is_null() {
            merge(&mut merged, layer);
        }
    }
    let sources = paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(" + ");
    let values: Values = serde_json::from_value(merged).map_err(|err| {
        ConfigError(format!(
            "{sources}: {err} (the chart's values.yaml holds every default: pass it first)"
        ))
    })?;
    Ok(Release {
        queue_full_threshold: values.queue_full_threshold,
        plan: plan_of(&values),
        sources,
    })
}

/// Helm's layering of values files: maps merge key by key, anything else is replaced.
fn merge(base: &mut serde_json::Value, layer: serde_json::Value) {
    match (base, layer) {
        (serde_json::Value::Object(base), serde_json::Value::Object(layer)) => {
            for (key, value) in layer {
                match base.get_mut(&key) {
                    Some(existing) if existing.is_object() && value.is_object() => {
                        merge(existing, value)
                    }
                    _ => {
                        base.insert(key, value);
                    }
                }
            }
        }
        (base, layer) => *base = layer,
    }
}

/// Pods of a Deployment at its peak: a rolling update surges one (`maxSurge: 1` on every
/// Deployment of the chart). The migration hook runs before the rollout, while the old
/// pods run at their steady count, so the surge is the higher of the two.
fn peak(replicas: u64) -> u64 {
    if replicas == 0 {
        0
    } else {
        replicas + 1
    }
}

fn plan_of(v: &Values) -> Plan {
    let pollers = if v.poller.autoscaling.enabled {
        v.poller.autoscaling.max_replicas.min(v.partitions)
    } else {
        v.poller.replicas
    };
    let both = || vec!["send".to_owned(), "status".to_owned()];
    let worker = |job_type: &str, w: &Worker| Role {
        name: format!("worker-{job_type}"),
        replicas: peak(w.replicas),
        database_max_connections: w.database_max_connections,
        redis_max_connections: w.redis_max_connections,
        uses: vec![job_type.to_owned()],
        listen_connections: 0,
    };
    let store = |job_type: &str, s: &ChartStore| Store {
        job_type: job_type.to_owned(),
        shards: if s.external.urls.is_empty() {
            s.shards
        } else {
            s.external.urls.len() as u64
        },
        maxmemory_bytes: s.maxmemory_mb << 20,
        maxclients: s.maxclients,
        peak_backlog_jobs: s.peak_backlog_jobs,
        bytes_per_job: s.bytes_per_job,
    };
    Plan {
        postgres: Postgres {
            max_connections: v.postgresql.max_connections,
            reserved_connections: v.postgresql.reserved_connections,
        },
        roles: vec![
            Role {
                name: "api".to_owned(),
                replicas: peak(v.api.replicas),
                database_max_connections: v.api.database_max_connections,
                redis_max_connections: API_REDIS_CONNECTIONS,
                uses: both(),
                // One more PostgreSQL connection per API replica: the session holding (or
                // asking for) the backlog exporter's lock.
                listen_connections: 1,
            },
            Role {
                name: "poller".to_owned(),
                replicas: peak(pollers),
                database_max_connections: v.poller.database_max_connections,
                redis_max_connections: v.poller.redis_max_connections,
                uses: both(),
                // One more PostgreSQL connection per poller for LISTEN.
                listen_connections: 1,
            },
            worker("send", &v.workers.send),
            worker("status", &v.workers.status),
        ],
        stores: vec![
            store("send", &v.redis.send),
            store("status", &v.redis.status),
        ],
    }
}
