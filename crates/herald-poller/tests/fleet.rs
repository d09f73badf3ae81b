//! The fleet's own logic — assignment, handoff, release, fencing — against the coordination
//! protocol in memory (`herald_coord::MemoryCoordination`) and a real PostgreSQL, which
//! answers the fencing epochs. Each test takes a second or a few, where the same story on
//! etcd with the roles as processes takes tens (`crates/herald/tests/it/fleet.rs` keeps those,
//! under load, with the proof).

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use herald_coord::{Coordination, MemoryCoordination, Ownership};
use herald_core::{assignment::assign, PartitionCount};
use herald_poller::fleet::{Fleet, FleetSettings};
use herald_poller::{Poller, PollerSettings};
use herald_testkit::TestDatabase;
use sqlx::PgPool;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const P: u32 = 12;
const TTL: Duration = Duration::from_secs(2);
const PATIENCE: Duration = Duration::from_secs(20);

/// One poller of the fleet, on a handle of its own on the shared coordinator.
struct Member {
    coord: MemoryCoordination,
    cancel: CancellationToken,
    task: JoinHandle<()>,
}

impl Member {
    fn start(coord: &MemoryCoordination, pool: &PgPool, name: &str) -> Self {
        let coord = coord.handle();
        let fleet = Fleet {
            // No queue store: the outbox stays empty, so nothing is ever published.
            poller: Poller::new(pool.clone(), HashMap::new(), PollerSettings::default()),
            coord: coord.clone(),
            pool: pool.clone(),
            partitions: PartitionCount::new(P).unwrap(),
            settings: FleetSettings {
                member: name.to_owned(),
                lease_ttl: TTL,
                drain_timeout: Duration::from_secs(2),
            },
        };
        let cancel = CancellationToken::new();
        let stop = cancel.clone();
        let task = tokio::spawn(async move { fleet.run(stop).await.expect("fleet") });
        Self {
            coord,
            cancel,
            task,
        }
    }

    async fn stop(self) {
        self.cancel.cancel();
        tokio::time::timeout(PATIENCE, self.task)
            .await
            .expect("the member stops")
            .expect("the member's task");
    }
}

async fn database() -> (TestDatabase, PgPool) {
    let db = TestDatabase::migrated(P).await.expect("database");
    let pool = db.pool(16).await.expect("pool");
    (db, pool)
}

/// Waits until every partition is owned exactly as the assignment of `members` says, and
/// PostgreSQL records each ownership; answers the keys and the epochs.
async fn stable(
    coord: &MemoryCoordination,
    pool: &PgPool,
    members: &[&str],
) -> (BTreeMap<u32, Ownership>, BTreeMap<u32, i64>) {
    let members: Vec<String> = members.iter().map(|m| m.to_string()).collect();
    let target = assign(&members, PartitionCount::new(P).unwrap());
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let owners = coord.owners().await.expect("owners");
        let recorded = epochs(pool).await;
        let settled = owners.len() == P as usize
            && owners.iter().all(|(p, o)| {
                o.owner == members[target[*p as usize]]
                    && recorded.get(p).is_some_and(|(owner, _)| *owner == o.owner)
            });
        if settled {
            let epochs = recorded.into_iter().map(|(p, (_, e))| (p, e)).collect();
            return (owners, epochs);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not owned as assigned to {members:?} after {PATIENCE:?}: {owners:?} {recorded:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// PostgreSQL's record of each partition's owner and fencing epoch.
async fn epochs(pool: &PgPool) -> BTreeMap<u32, (String, i64)> {
    let rows: Vec<(i32, String, i64)> =
        sqlx::query_as("SELECT partition, owner, epoch FROM partition_leases")
            .fetch_all(pool)
            .await
            .expect("partition_leases");
    rows.into_iter()
        .map(|(p, owner, epoch)| (p as u32, (owner, epoch)))
        .collect()
}

fn share(owners: &BTreeMap<u32, Ownership>, member: &str) -> Vec<u32> {
    owners
        .iter()
        .filter(|(_, o)| o.owner == member)
        .map(|(p, _)| *p)
        .collect()
}

#[tokio::test]
async fn members_share_every_partition_as_assigned_each_fenced_once() {
    let (_db, pool) = database().await;
    let coord = MemoryCoordination::new();
    let members: Vec<Member> = ["a", "b", "c"]
        .iter()
        .map(|m| Member::start(&coord, &pool, m))
        .collect();
    let (owners, _) = stable(&coord, &pool, &["a", "b", "c"]).await;
    for m in ["a", "b", "c"] {
        assert_eq!(share(&owners, m).len(), 4, "{m}: {owners:?}");
    }
    // PostgreSQL recorded each partition's current key: its generation and create revision.
    let generation = coord.generation().await.unwrap();
    let recorded: Vec<(i32, String, i64)> = sqlx::query_as(
        "SELECT partition, coord_generation, coord_revision FROM partition_leases ORDER BY 1",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(recorded.len(), P as usize);
    for (p, gen, revision) in recorded {
        assert_eq!(gen, generation);
        assert_eq!(revision, owners[&(p as u32)].revision, "partition {p}");
    }
    for member in members {
        member.stop().await;
    }
    assert!(
        coord.owners().await.unwrap().is_empty(),
        "stopping releases every key"
    );
}

#[tokio::test]
async fn a_joining_member_is_handed_its_share_under_newer_epochs_and_nothing_else_moves() {
    let (_db, pool) = database().await;
    let coord = MemoryCoordination::new();
    let a = Member::start(&coord, &pool, "a");
    let (_, before) = stable(&coord, &pool, &["a"]).await;
    let b = Member::start(&coord, &pool, "b");
    let (owners, after) = stable(&coord, &pool, &["a", "b"]).await;
    let moved = share(&owners, "b");
    assert_eq!(moved.len(), P as usize / 2);
    for p in 0..P {
        if moved.contains(&p) {
            assert!(after[&p] > before[&p], "partition {p} moved: a newer epoch");
        } else {
            assert_eq!(after[&p], before[&p], "partition {p} stayed with a");
        }
    }
    // b leaves: a takes everything back, again under newer epochs.
    b.stop().await;
    let (_, last) = stable(&coord, &pool, &["a"]).await;
    for p in moved {
        assert!(last[&p] > after[&p]);
    }
    a.stop().await;
}

#[tokio::test]
async fn a_member_cut_off_from_the_coordinator_is_replaced_after_its_lease_and_comes_back() {
    let (_db, pool) = database().await;
    let coord = MemoryCoordination::new();
    let a = Member::start(&coord, &pool, "a");
    let b = Member::start(&coord, &pool, "b");
    let (owners, before) = stable(&coord, &pool, &["a", "b"]).await;
    let a_lease = coord.lease_of("a").expect("a is a member");
    let cut_at = tokio::time::Instant::now();
    a.coord.set_reachable(false);
    // b takes a's partitions once a's lease ended, not before: the keys are a's until then.
    let (during, taken) = stable(&coord, &pool, &["b"]).await;
    // a renewed at most a quarter of the TTL before the cut, so its keys lasted at least
    // three quarters of it more.
    assert!(
        cut_at.elapsed() >= TTL / 2,
        "a's partitions were taken {:?} after the cut, before its lease could end",
        cut_at.elapsed()
    );
    assert!(coord.lease_of("a").is_none());
    for p in share(&owners, "a") {
        assert!(taken[&p] > before[&p], "partition {p}: b's epoch fences a");
        assert_ne!(during[&p].lease, a_lease);
    }
    // a is back: it joins with a new lease and gets its share again.
    a.coord.set_reachable(true);
    let (_, back) = stable(&coord, &pool, &["a", "b"]).await;
    for p in share(&owners, "a") {
        assert!(back[&p] > taken[&p]);
    }
    a.stop().await;
    b.stop().await;
}

#[tokio::test]
async fn a_key_held_under_a_members_name_without_a_task_is_released_and_taken_again() {
    let (_db, pool) = database().await;
    let coord = MemoryCoordination::new();
    let a = Member::start(&coord, &pool, "a");
    let (owners, before) = stable(&coord, &pool, &["a"]).await;
    // Partition 5's key is replaced behind a's back by another key under its name and
    // lease, as an acquisition that failed half way would leave it: no task drains it.
    let lease = coord.lease_of("a").unwrap();
    assert!(coord.release(5, "a", owners[&5].revision).await.unwrap());
    let stray = coord.try_acquire(5, "a", lease).await.unwrap().unwrap();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let now = coord.owners().await.unwrap();
        let recorded = epochs(&pool).await;
        if now.get(&5).is_some_and(|o| o.revision != stray) && recorded[&5].1 > before[&5] {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the stray key was not released: {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stable(&coord, &pool, &["a"]).await;
    a.stop().await;
}

#[tokio::test]
async fn a_coordinator_that_lost_its_data_strands_no_partition() {
    let (_db, pool) = database().await;
    let coord = MemoryCoordination::new();
    let a = Member::start(&coord, &pool, "a");
    let b = Member::start(&coord, &pool, "b");
    let (_, before) = stable(&coord, &pool, &["a", "b"]).await;
    // Restored empty: a new generation, revisions from the start, every lease gone. The
    // members find their leases lost, join again, and PostgreSQL supersedes the ownerships
    // of the old generation instead of refusing the lower revisions.
    coord.lose_data();
    let (_, after) = stable(&coord, &pool, &["a", "b"]).await;
    for p in 0..P {
        assert!(
            after[&p] > before[&p],
            "partition {p}: {after:?} {before:?}"
        );
    }
    a.stop().await;
    b.stop().await;
}
