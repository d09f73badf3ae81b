//! The poller fleet on real etcd: sharing, joining, kill -9, SIGTERM handoff, SIGSTOP past the
//! TTL, an etcd outage and a rolling restart — each under load, each ending with the proof.
//!
//! Longer than 400 lines: one test per fleet story, each under load and ending with the proof,
//! sharing the ownership helpers at the top.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use herald_coord::{Coordinator, Ownership};
use herald_core::{assignment::assign, PartitionCount};
use tokio_util::sync::CancellationToken;

use crate::deployment::{args, Load};
use crate::wait::{accepted_more, metric_above, until, EXIT_GRACE, PATIENCE};
use crate::{Deployment, Options};

const P: u32 = 64;

async fn fleet(pollers: usize, lease_ttl: &str) -> Deployment {
    Deployment::start(Options {
        partitions: P,
        pollers,
        fleet: true,
        // A poller killed between a round's claim and its publish leaves that round's rows
        // PUBLISHED and in no stream; the stale re-drive returns them after --stale-after
        // (2 min by default), shortened here so the proof after a kill -9 fits its wait.
        poller_flags: args(&[
            "--lease-ttl",
            lease_ttl,
            "--drain-timeout",
            "5s",
            "--stale-after",
            "15s",
        ]),
        ..Options::default()
    })
    .await
}

async fn coordinator(herald: &Deployment) -> Coordinator {
    Coordinator::connect(&[herald.etcd.endpoint()], "/herald", Duration::from_secs(2))
        .await
        .unwrap()
}

/// The owners once every partition is owned exactly as the assignment of `members` says.
async fn wait_stable(coord: &Coordinator, members: &[&str]) -> BTreeMap<u32, Ownership> {
    let members: Vec<String> = members.iter().map(|m| m.to_string()).collect();
    let target = assign(&members, PartitionCount::new(P).unwrap());
    until(
        &format!("every partition owned as assigned to {members:?}"),
        PATIENCE,
        || async {
            let owners = coord.owners().await.map_err(|err| err.to_string())?;
            let settled = owners.len() == P as usize
                && owners
                    .iter()
                    .all(|(p, o)| o.owner == members[target[*p as usize]]);
            if settled {
                Ok(owners)
            } else {
                Err(format!("{owners:?}"))
            }
        },
    )
    .await
}

/// The partitions `member` owns.
fn share_of(owners: &BTreeMap<u32, Ownership>, member: &str) -> Vec<u32> {
    owners
        .iter()
        .filter(|(_, o)| o.owner == member)
        .map(|(p, _)| *p)
        .collect()
}

fn count_by_owner(owners: &BTreeMap<u32, Ownership>) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for o in owners.values() {
        *counts.entry(o.owner.clone()).or_insert(0) += 1;
    }
    counts
}

/// Watches the ownership keys from outside and records every handoff: a partition's key
/// deleted, then created again. The gap between the two is measured to be printed, not
/// asserted: how long a handoff takes is a benchmark's figure.
struct GapWatch {
    gaps: Arc<Mutex<Vec<Duration>>>,
    stop: CancellationToken,
}

impl GapWatch {
    async fn start(coord: &Coordinator) -> Self {
        let mut stream = coord.watch().await.unwrap();
        let gaps = Arc::new(Mutex::new(Vec::new()));
        let stop = CancellationToken::new();
        let (record, cancel, coord) = (gaps.clone(), stop.clone(), coord.clone());
        tokio::spawn(async move {
            let mut deleted: HashMap<u32, Instant> = HashMap::new();
            loop {
                let message = tokio::select! {
                    _ = cancel.cancelled() => return,
                    m = stream.message() => m,
                };
                let Ok(Some(response)) = message else { return };
                for event in response.events() {
                    let Some(p) = event.kv().and_then(|kv| coord.partition_of_key(kv.key())) else {
                        continue;
                    };
                    match event.event_type() {
                        etcd_client::EventType::Delete => {
                            deleted.insert(p, Instant::now());
                        }
                        etcd_client::EventType::Put => {
                            if let Some(at) = deleted.remove(&p) {
                                record.lock().unwrap().push(at.elapsed());
                            }
                        }
                    }
                }
            }
        });
        Self { gaps, stop }
    }

    fn largest(&self) -> (usize, Duration) {
        let gaps = self.gaps.lock().unwrap();
        (gaps.len(), gaps.iter().copied().max().unwrap_or_default())
    }

    /// Waits until the watch has recorded at least `handoffs` (its events may trail what
    /// `owners()` already shows); returns the count and the largest gap.
    async fn recorded(&self, handoffs: usize) -> (usize, Duration) {
        until(
            &format!("the watch records {handoffs} handoffs"),
            PATIENCE,
            || async {
                let (seen, largest) = self.largest();
                if seen >= handoffs {
                    Ok((seen, largest))
                } else {
                    Err(format!("{seen} handoffs"))
                }
            },
        )
        .await
    }
}

impl Drop for GapWatch {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// The fences (partition, epoch) PostgreSQL answered for the etcd ownerships taken at
/// `revisions`, once every one of them is recorded. Epochs count per partition.
async fn recorded_epochs(herald: &Deployment, revisions: &[i64]) -> Vec<(i32, i64)> {
    until(
        "the ownerships recorded in PostgreSQL",
        PATIENCE,
        || async {
            let epochs: Vec<(i32, i64)> = sqlx::query_as(
                "SELECT partition, epoch FROM partition_leases WHERE coord_revision = ANY($1)
                 ORDER BY partition",
            )
            .bind(revisions)
            .fetch_all(&herald.pool)
            .await
            .map_err(|err| err.to_string())?;
            if epochs.len() == revisions.len() {
                Ok(epochs)
            } else {
                Err(format!("{} of {} recorded", epochs.len(), revisions.len()))
            }
        },
    )
    .await
}

async fn owned_gauge(herald: &Deployment, poller: usize) -> f64 {
    let text = herald.metrics(&herald.poller_admins[poller]).await;
    text.lines()
        .find_map(|l| l.strip_prefix("herald_poller_owned_partitions "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(-1.0)
}

async fn prove(herald: &Deployment, accepted: usize) {
    herald
        .wait_delivered(accepted as i64, Duration::from_secs(120))
        .await;
    let (code, report) = herald.verify().await;
    assert_eq!(code, 0, "{report}");
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM messages")
        .fetch_one(&herald.pool)
        .await
        .unwrap();
    assert_eq!(count as usize, accepted);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_pollers_share_the_partitions_and_a_fourth_moves_only_its_share() {
    let mut herald = fleet(3, "10s").await;
    let coord = coordinator(&herald).await;
    let before = wait_stable(&coord, &["poller-0", "poller-1", "poller-2"]).await;
    let counts = count_by_owner(&before);
    assert!(counts.values().all(|&n| n == 21 || n == 22), "{counts:?}");
    // The pollers finish acquiring (epoch recorded, task started) just after etcd shows the
    // keys: wait for their gauges and PostgreSQL to catch up.
    until(
        "every poller's gauge and PostgreSQL's epochs agree with etcd",
        PATIENCE,
        || async {
            let mut gauges = Vec::new();
            for (i, name) in ["poller-0", "poller-1", "poller-2"].iter().enumerate() {
                gauges.push((owned_gauge(&herald, i).await, counts[*name] as f64));
            }
            let gauges_match = gauges.iter().all(|(gauge, etcd)| gauge == etcd);
            // PostgreSQL records each etcd ownership (its revision) with its own epoch.
            let recorded: Vec<(i32, String, i64)> = sqlx::query_as(
                "SELECT partition, owner, coord_revision FROM partition_leases ORDER BY partition",
            )
            .fetch_all(&herald.pool)
            .await
            .map_err(|err| err.to_string())?;
            let epochs_match = recorded.len() == P as usize
                && recorded.iter().all(|(p, owner, epoch)| {
                    let etcd = &before[&(*p as u32)];
                    (owner, *epoch) == (&etcd.owner, etcd.revision)
                });
            if gauges_match && epochs_match {
                Ok(())
            } else {
                Err(format!(
                    "(gauge, etcd) per poller {gauges:?}; epochs match {epochs_match}: {recorded:?}"
                ))
            }
        },
    )
    .await;

    let load = Load::start(&herald, 20, Duration::from_millis(50));
    let fourth = args(&[
        "poller",
        "--poller-id",
        "poller-3",
        "--redis-send-url",
        &herald.send_redis.url(),
        "--redis-status-url",
        &herald.status_redis.url(),
        "--etcd-endpoints",
        &herald.etcd.endpoint(),
        "--poll-interval",
        "100ms",
        "--idle-poll-interval",
        "400ms",
    ]);
    let admin = herald.spawn_with_admin("poller-3", fourth).await;
    herald.poller_admins.push(admin);
    let after = wait_stable(&coord, &["poller-0", "poller-1", "poller-2", "poller-3"]).await;
    let counts = count_by_owner(&after);
    assert!(counts.values().all(|&n| n == 16), "{counts:?}");

    // A partition whose owner stays the same keeps its ownership (same epoch: never released).
    let moved: Vec<u32> = (0..P)
        .filter(|p| before[p].owner != after[p].owner)
        .collect();
    for p in 0..P {
        if before[&p].owner == after[&p].owner {
            assert_eq!(
                before[&p].revision, after[&p].revision,
                "partition {p} was re-acquired needlessly"
            );
        } else {
            assert!(after[&p].revision > before[&p].revision);
        }
    }
    assert!(
        moved.len() >= 16 && moved.len() <= 33,
        "moved {}: {moved:?}",
        moved.len()
    );
    println!(
        "a fourth poller joined: {} partitions moved (minimum 16)",
        moved.len()
    );
    let accepted = load.finish().await;
    prove(&herald, accepted).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_poller_s_partitions_are_owned_again_by_the_survivors() {
    let mut herald = fleet(3, "3s").await;
    let coord = coordinator(&herald).await;
    let before = wait_stable(&coord, &["poller-0", "poller-1", "poller-2"]).await;
    let share = share_of(&before, "poller-1");
    let gaps = GapWatch::start(&coord).await;
    let load = Load::start(&herald, 20, Duration::from_millis(50));
    // The kill lands while messages flow.
    accepted_more(&herald, 200).await;

    // Measured to be printed: the failover time is a benchmark's figure, not a pass mark.
    let killed = Instant::now();
    herald.role("poller-1").kill9().await.unwrap();
    let after = wait_stable(&coord, &["poller-0", "poller-2"]).await;
    let failover = killed.elapsed();
    // Nothing released them: the keys went with the dead poller's lease, and a survivor
    // created each anew, under a newer epoch.
    let (handoffs, largest) = gaps.recorded(share.len()).await;
    for p in &share {
        assert!(
            after[p].revision > before[p].revision,
            "partition {p}: {:?}",
            after[p]
        );
    }
    println!(
        "kill -9: every partition owned again after {failover:?} (TTL 3s); \
         {handoffs} handoffs of {} partitions, largest gap {largest:?}",
        share.len()
    );

    // Load goes on through the survivors before the proof.
    accepted_more(&herald, 200).await;
    let accepted = load.finish().await;
    prove(&herald, accepted).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_hands_partitions_off_before_the_poller_exits() {
    let mut herald = fleet(3, "10s").await;
    let coord = coordinator(&herald).await;
    let before = wait_stable(&coord, &["poller-0", "poller-1", "poller-2"]).await;
    let share = share_of(&before, "poller-1");
    let gaps = GapWatch::start(&coord).await;
    let load = Load::start(&herald, 20, Duration::from_millis(50));
    // The SIGTERM lands while messages flow.
    accepted_more(&herald, 200).await;

    // Measured to be printed: the handoff time is a benchmark's figure, not a pass mark.
    let asked = Instant::now();
    let exited = herald.role("poller-1").terminate(EXIT_GRACE).await.unwrap();
    assert!(exited, "poller-1 exits by itself on SIGTERM");
    // A handoff, not an expiry: by the time the process is gone (the lease still had up to
    // 10 s to live) it has deleted every key it held, its ownerships and its membership.
    let owners = coord.owners().await.unwrap();
    assert!(
        share_of(&owners, "poller-1").is_empty(),
        "poller-1 exited still owning partitions: {owners:?}"
    );
    let members = coord.members().await.unwrap();
    assert!(
        !members.iter().any(|m| m == "poller-1"),
        "poller-1 exited still a member: {members:?}"
    );
    wait_stable(&coord, &["poller-0", "poller-2"]).await;
    let handoff = asked.elapsed();
    let (handoffs, largest) = gaps.recorded(share.len()).await;
    println!(
        "SIGTERM: all partitions owned again after {handoff:?}; \
         {handoffs} handoffs of {} partitions, largest gap {largest:?}",
        share.len()
    );

    let accepted = load.finish().await;
    prove(&herald, accepted).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_poller_writes_nothing_after_losing_its_partitions_and_rejoins() {
    let mut herald = fleet(2, "3s").await;
    let coord = coordinator(&herald).await;
    let before = wait_stable(&coord, &["poller-0", "poller-1"]).await;
    let old_revisions: Vec<i64> = before
        .values()
        .filter(|o| o.owner == "poller-1")
        .map(|o| o.revision)
        .collect();
    let old_epochs = recorded_epochs(&herald, &old_revisions).await;
    let load = Load::start(&herald, 20, Duration::from_millis(50));
    // The pause lands while messages flow.
    accepted_more(&herald, 200).await;

    herald.role("poller-1").pause().unwrap();
    let new_owners = wait_stable(&coord, &["poller-0"]).await;
    // The takeover is complete when PostgreSQL holds the new epochs (etcd comes first): until
    // then the old owner's fence is still the recorded one.
    let new_revisions: Vec<i64> = new_owners.values().map(|o| o.revision).collect();
    recorded_epochs(&herald, &new_revisions).await;
    let taken_over: chrono_free::Now = chrono_free::now(&herald.pool).await;
    herald.role("poller-1").resume().unwrap();
    // It rejoins: both members again, poller-1 with new epochs.
    let after = wait_stable(&coord, &["poller-0", "poller-1"]).await;
    let rejoined_revisions: Vec<i64> = after
        .values()
        .filter(|o| o.owner == "poller-1")
        .map(|o| o.revision)
        .collect();
    let rejoined = recorded_epochs(&herald, &rejoined_revisions).await;
    for fence in &rejoined {
        assert!(!old_epochs.contains(fence));
    }
    let pairs = |fences: &[(i32, i64)]| -> (Vec<i32>, Vec<i64>) { fences.iter().copied().unzip() };
    let (rejoined_partitions, rejoined_epochs) = pairs(&rejoined);
    let (old_partitions, old_epoch_values) = pairs(&old_epochs);
    // ... and claims again under them before the load stops.
    herald
        .wait_for(
            &format!(
                "SELECT count(*) FROM outbox o
                 JOIN UNNEST(ARRAY{rejoined_partitions:?}::int[], ARRAY{rejoined_epochs:?}::bigint[])
                   AS f(partition, epoch)
                   ON o.partition = f.partition AND o.claimed_epoch = f.epoch"
            ),
            1,
            PATIENCE,
        )
        .await;
    let accepted = load.finish().await;
    prove(&herald, accepted).await;

    let touched: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM outbox o
         JOIN UNNEST($1::int[], $2::bigint[]) AS f(partition, epoch)
           ON o.partition = f.partition AND o.claimed_epoch = f.epoch
         WHERE o.claimed_at > $3::timestamptz",
    )
    .bind(&old_partitions)
    .bind(&old_epoch_values)
    .bind(&taken_over.0)
    .fetch_one(&herald.pool)
    .await
    .unwrap();
    assert_eq!(
        touched, 0,
        "the deposed poller claimed rows after the takeover"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_outage_stops_claiming_and_the_fleet_resumes_after_it() {
    let mut herald = fleet(2, "4s").await;
    let coord = coordinator(&herald).await;
    wait_stable(&coord, &["poller-0", "poller-1"]).await;
    let load = Load::start(&herald, 20, Duration::from_millis(100));
    // The outage lands while messages flow.
    accepted_more(&herald, 100).await;

    herald.etcd.stop().await.unwrap();
    // Both pollers notice their leases are at risk and stop claiming.
    until("both pollers own no partition", PATIENCE, || async {
        let gauges = [owned_gauge(&herald, 0).await, owned_gauge(&herald, 1).await];
        if gauges == [0.0, 0.0] {
            Ok(())
        } else {
            Err(format!("owned partitions per poller {gauges:?}"))
        }
    })
    .await;
    for admin in &herald.poller_admins {
        metric_above(&herald, admin, "herald_lease_losses_total", 0.0).await;
    }
    let quiet_since = chrono_free::now(&herald.pool).await;
    // etcd stays down while 2,000 more messages are accepted (many lease TTLs at this load's
    // rate): the pollers keep failing to rejoin, and none of those rows may be claimed.
    accepted_more(&herald, 2_000).await;
    let claimed_while_down: i64 =
        sqlx::query_scalar("SELECT count(*) FROM outbox WHERE claimed_at > $1::timestamptz")
            .bind(&quiet_since.0)
            .fetch_one(&herald.pool)
            .await
            .unwrap();
    assert_eq!(claimed_while_down, 0, "rows were claimed without a lease");

    herald.etcd.restart().await.unwrap();
    let coord = coordinator(&herald).await;
    wait_stable(&coord, &["poller-0", "poller-1"]).await;
    // Load goes on through the rejoined fleet before the proof.
    accepted_more(&herald, 100).await;
    let accepted = load.finish().await;
    prove(&herald, accepted).await;
}

/// etcd loses its data (a wiped volume, a restore from an old snapshot): its revisions start
/// again below the ones recorded in PostgreSQL. The fleet rejoins and owns every partition
/// again, and delivery goes on; before, every acquisition was refused as older than the
/// recorded epoch and the partitions stayed without an owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_that_lost_its_data_is_rejoined_and_nothing_is_stranded() {
    let mut herald = fleet(2, "4s").await;
    let coord = coordinator(&herald).await;
    wait_stable(&coord, &["poller-0", "poller-1"]).await;
    let load = Load::start(&herald, 20, Duration::from_millis(100));
    accepted_more(&herald, 200).await;
    let before: i64 = sqlx::query_scalar("SELECT max(coord_revision) FROM partition_leases")
        .fetch_one(&herald.pool)
        .await
        .unwrap();

    herald.etcd.wipe_and_restart().await.unwrap();
    let coord = coordinator(&herald).await;
    assert!(
        coord.current_revision().await.unwrap() < before,
        "the new etcd's revisions start below the recorded ones"
    );
    wait_stable(&coord, &["poller-0", "poller-1"]).await;
    accepted_more(&herald, 200).await;
    let accepted = load.finish().await;
    prove(&herald, accepted).await;
    // A poller still running when the other rejoined is fenced (that is the fence at work);
    // what must not happen is an acquisition refused as older than what PostgreSQL recorded.
    let logs: String = ["poller-0", "poller-1"]
        .iter()
        .map(|name| herald.role(name).log_tail(200_000))
        .flat_map(|log| {
            log.lines()
                .filter(|l| l.contains("newer ownership"))
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        logs.is_empty(),
        "acquisitions after the wipe were refused: {logs}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_loses_nothing_and_reports_the_largest_gap() {
    let mut herald = fleet(3, "10s").await;
    let coord = coordinator(&herald).await;
    let all = ["poller-0", "poller-1", "poller-2"];
    wait_stable(&coord, &all).await;
    let gaps = GapWatch::start(&coord).await;
    let load = Load::start(&herald, 20, Duration::from_millis(50));
    for name in all {
        let poller = herald.role(name);
        assert!(
            poller.terminate(EXIT_GRACE).await.unwrap(),
            "{name} exits by itself on SIGTERM"
        );
        let rest: Vec<&str> = all.iter().copied().filter(|n| *n != name).collect();
        wait_stable(&coord, &rest).await;
        herald.role(name).restart().await.unwrap();
        wait_stable(&coord, &all).await;
    }
    let accepted = load.finish().await;
    // Every partition changed hands at least twice: away from its owner when that one stopped,
    // and back when it rejoined (the assignment of the same members is the same).
    let (handoffs, largest) = gaps.recorded(2 * P as usize).await;
    println!("rolling restart: {handoffs} handoffs, largest gap {largest:?}");
    prove(&herald, accepted).await;
}

/// The database's clock, so comparisons with `claimed_at` use one clock.
mod chrono_free {
    pub struct Now(pub String);

    pub async fn now(pool: &sqlx::PgPool) -> Now {
        Now(sqlx::query_scalar("SELECT now()::text")
            .fetch_one(pool)
            .await
            .unwrap())
    }
}

/// A partition key held under the poller's own name while no task of it drains the
/// partition (here: the key deleted and written again under a foreign, long lease while the
/// poller was paused, as a half-failed acquisition or release leaves it) is given back and
/// taken anew at once, not left undrained until that lease ends; every message is delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_held_without_a_task_is_released_and_its_partition_drained() {
    let mut herald = fleet(1, "10s").await;
    let coord = coordinator(&herald).await;
    let before = wait_stable(&coord, &["poller-0"]).await;
    let partition = 5;
    let key = format!("{}{partition:04}", coord.owners_prefix());
    let mut client = coord.client();
    // Far past the test's patience: only a release by the poller frees the partition.
    let foreign = client.lease_grant(3600, None).await.unwrap().id();

    herald.role("poller-0").pause().unwrap();
    client.delete(key.as_str(), None).await.unwrap();
    client
        .put(
            key.as_str(),
            "poller-0",
            Some(etcd_client::PutOptions::new().with_lease(foreign)),
        )
        .await
        .unwrap();
    herald.role("poller-0").resume().unwrap();

    let after = until(
        "the partition owned again under the poller's own lease",
        PATIENCE,
        || async {
            let owners = coord.owners().await.map_err(|err| err.to_string())?;
            match owners.get(&partition) {
                Some(o) if o.owner == "poller-0" && o.lease == before[&partition].lease => {
                    Ok(o.clone())
                }
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    assert!(after.revision > before[&partition].revision, "{after:?}");
    let load = Load::start(&herald, 20, Duration::from_millis(20));
    accepted_more(&herald, 300).await;
    let accepted = load.finish().await;
    prove(&herald, accepted).await;
    client.lease_revoke(foreign).await.unwrap();
}
