//! The coordination primitives against a real etcd: one ownership key per partition, released
//! only by the member and revision that created it; keys that go with their lease; a
//! generation that changes only when etcd loses its data; prefixes that keep clusters apart.

use std::time::Duration;

use herald_coord::membership::Membership;
use herald_coord::{CoordError, Coordinator, EtcdAccess};
use herald_testkit::LocalEtcd;

async fn coordinator(etcd: &LocalEtcd, prefix: &str) -> Coordinator {
    Coordinator::connect(&[etcd.endpoint()], prefix, Duration::from_secs(2))
        .await
        .expect("connect")
}

async fn lease(coord: &Coordinator, ttl: i64) -> i64 {
    coord
        .client()
        .lease_grant(ttl, None)
        .await
        .expect("lease")
        .id()
}

#[tokio::test]
async fn the_first_acquirer_owns_a_partition_and_only_its_revision_releases_it() {
    let etcd = LocalEtcd::start().await.expect("etcd");
    let coord = coordinator(&etcd, "/herald").await;
    let (a, b) = (lease(&coord, 60).await, lease(&coord, 60).await);

    let revision = coord.try_acquire(3, "a", a).await.unwrap().expect("free");
    assert_eq!(
        coord.try_acquire(3, "b", b).await.unwrap(),
        None,
        "held by a"
    );
    let owners = coord.owners().await.unwrap();
    assert_eq!(owners.len(), 1);
    assert_eq!(
        (
            owners[&3].owner.as_str(),
            owners[&3].revision,
            owners[&3].lease
        ),
        ("a", revision, a)
    );

    // Another member, or the same member with another revision, releases nothing.
    assert!(!coord.release(3, "b", revision).await.unwrap());
    assert!(!coord.release(3, "a", revision + 1).await.unwrap());
    assert!(coord.release(3, "a", revision).await.unwrap());
    assert!(coord.owners().await.unwrap().is_empty());
    assert!(
        !coord.release(3, "a", revision).await.unwrap(),
        "released once"
    );

    // The next ownership is a new key, with a higher create revision.
    let next = coord
        .try_acquire(3, "b", b)
        .await
        .unwrap()
        .expect("free again");
    assert!(next > revision);
    assert!(next <= coord.current_revision().await.unwrap());
}

#[tokio::test]
async fn a_member_s_keys_go_with_its_lease() {
    let etcd = LocalEtcd::start().await.expect("etcd");
    let coord = coordinator(&etcd, "/herald").await;
    let membership = Membership::join(&coord, "poller-a", Duration::from_secs(10))
        .await
        .expect("join");
    coord
        .try_acquire(1, "poller-a", membership.lease)
        .await
        .unwrap();
    coord
        .try_acquire(2, "poller-a", membership.lease)
        .await
        .unwrap();
    assert_eq!(coord.members().await.unwrap(), ["poller-a"]);
    assert_eq!(coord.owners().await.unwrap().len(), 2);

    // Leaving revokes the lease: the member key and every ownership key are gone at once.
    membership.leave(&coord).await;
    assert!(coord.members().await.unwrap().is_empty());
    assert!(coord.owners().await.unwrap().is_empty());
}

#[tokio::test]
async fn the_generation_changes_only_when_etcd_loses_its_data() {
    let mut etcd = LocalEtcd::start().await.expect("etcd");
    let coord = coordinator(&etcd, "/herald").await;
    let first = coord.generation().await.unwrap();
    assert_eq!(
        coord.generation().await.unwrap(),
        first,
        "read, not replaced"
    );
    let lease = lease(&coord, 60).await;
    for partition in 0..20 {
        coord.try_acquire(partition, "a", lease).await.unwrap();
    }
    let before = coord.current_revision().await.unwrap();

    etcd.wipe_and_restart().await.expect("wipe");
    let coord = coordinator(&etcd, "/herald").await;
    let after = coord.generation().await.unwrap();
    assert_ne!(after, first, "a new life of etcd has a new generation");
    assert!(
        coord.current_revision().await.unwrap() < before,
        "the revisions started again"
    );
    assert!(coord.owners().await.unwrap().is_empty());
}

#[tokio::test]
async fn two_prefixes_are_two_clusters() {
    let etcd = LocalEtcd::start().await.expect("etcd");
    let (one, two) = (
        coordinator(&etcd, "/one").await,
        coordinator(&etcd, "/two/").await,
    );
    let lease = lease(&one, 60).await;
    one.try_acquire(7, "a", lease).await.unwrap().expect("free");
    two.try_acquire(7, "b", lease)
        .await
        .unwrap()
        .expect("another cluster's partition 7");
    assert_eq!(one.owners().await.unwrap()[&7].owner, "a");
    assert_eq!(two.owners().await.unwrap()[&7].owner, "b");
    assert_ne!(
        one.generation().await.unwrap(),
        two.generation().await.unwrap()
    );

    let key = format!("{}0007", one.owners_prefix());
    assert_eq!(one.partition_of_key(key.as_bytes()), Some(7));
    assert_eq!(two.partition_of_key(key.as_bytes()), None, "not its prefix");
    assert_eq!(one.partition_of_key(b"/one/members/a"), None);
}

#[tokio::test]
async fn endpoints_that_mix_schemes_or_tls_without_https_are_refused_before_connecting() {
    let mixed = [
        "http://127.0.0.1:1".to_owned(),
        "https://127.0.0.1:2".to_owned(),
    ];
    let err = Coordinator::connect(&mixed, "/herald", Duration::from_secs(1))
        .await
        .err()
        .expect("refused");
    assert!(matches!(err, CoordError::Config(_)), "{err}");

    let access = EtcdAccess {
        tls: herald_core::ClientTls {
            ca: Some(b"-----BEGIN CERTIFICATE-----".to_vec()),
            identity: None,
        },
        user: None,
    };
    let plain = ["http://127.0.0.1:1".to_owned()];
    let err = Coordinator::connect_with(&plain, "/herald", Duration::from_secs(1), &access)
        .await
        .err()
        .expect("refused");
    assert!(err.to_string().contains("not https://"), "{err}");
}
