//! Every dependency over TLS with certificates made at test time: PostgreSQL with
//! `sslmode=verify-full`, Redis over `rediss://` only, etcd over `https://` with client
//! certificates required, and the provider over https (the simulator behind a TLS front).
//! Messages go through the whole pipeline; a wrong CA is refused, by name, for the three
//! servers.

use std::sync::Arc;
use std::time::Duration;

use herald_testkit::TestCerts;
use tokio::net::{TcpListener, TcpStream};

use crate::deployment::{args, HERALD};
use crate::{Deployment, Options};

/// An HTTPS front of the provider simulator: TLS with the test server certificate, then the
/// bytes as they are to the simulator's HTTP port. Returns its port.
async fn https_front(certs: &TestCerts, target: &str) -> u16 {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let _ = rustls::crypto::ring::default_provider().install_default();
    let chain = CertificateDer::pem_file_iter(&certs.server_cert)
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_file(&certs.server_key).unwrap();
    let config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let target = target.trim_start_matches("http://").to_owned();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, target) = (acceptor.clone(), target.clone());
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                if let Ok(mut plain) = TcpStream::connect(&target).await {
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
                }
            });
        }
    });
    port
}

#[tokio::test]
async fn every_dependency_over_verified_tls_delivers_and_a_wrong_ca_is_refused_by_name() {
    let mut herald = Deployment::start(Options {
        tls: true,
        fleet: true,
        ..Options::default()
    })
    .await;
    let ids = herald.send(30, 10, 2).await;
    assert_eq!(ids.len(), 30);
    herald.wait_delivered(30, Duration::from_secs(90)).await;
    let (code, report) = herald.verify().await;
    assert_eq!(code, 0, "{report}");

    // The roles' PostgreSQL sessions are encrypted (the test's own, as the owner, are not).
    let (encrypted, plain): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE s.ssl), count(*) FILTER (WHERE NOT s.ssl)
         FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid)
         WHERE a.usename = 'herald_runtime'",
    )
    .fetch_one(&herald.pool)
    .await
    .unwrap();
    assert!(
        encrypted > 0 && plain == 0,
        "encrypted {encrypted}, plain {plain}"
    );

    let certs = herald.certs().cloned().unwrap();
    let wrong_ca = certs.other_ca.display().to_string();

    // PostgreSQL: the migration trusts another CA and stops, saying why.
    let url = format!(
        "{}?sslmode=verify-full&sslrootcert={wrong_ca}",
        herald.database_url
    );
    let out = tokio::process::Command::new(HERALD)
        .args(["migrate", "--database-url", &url])
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("certificate") && stderr.contains("UnknownIssuer"),
        "no word of the certificate's issuer: {stderr}"
    );
    println!("the migration said: {stderr}");

    // Redis: a poller trusting another CA is not ready, and says the store is unreachable
    // because of its certificate.
    let mut poller = args(&[
        "poller",
        "--poller-id",
        "wrong-redis-ca",
        "--redis-send-url",
        &herald.send_redis.url(),
        "--redis-status-url",
        &herald.status_redis.url(),
        "--redis-ca-file",
        &wrong_ca,
    ]);
    let admin = herald
        .spawn_with_admin("poller-wrong-redis-ca", poller.clone())
        .await;
    let client = reqwest::Client::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let reason = loop {
        let response = client.get(format!("{admin}/readyz")).send().await.unwrap();
        let status = response.status();
        let body = response.text().await.unwrap();
        if status == 503 && body.contains("certificate") && body.contains("UnknownIssuer") {
            break body;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "readyz {status}: {body}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(
        reason.contains("Redis") || reason.contains("redis"),
        "{reason}"
    );
    println!("the poller's readiness said: {reason}");
    herald.role("poller-wrong-redis-ca").kill9().await.unwrap();

    // etcd: a fleet poller trusting another CA owns nothing, and its log says why.
    poller.truncate(1);
    poller.extend(args(&[
        "--poller-id",
        "wrong-etcd-ca",
        "--redis-send-url",
        &herald.send_redis.url(),
        "--redis-status-url",
        &herald.status_redis.url(),
        "--etcd-endpoints",
        &herald.etcd.endpoint(),
        "--etcd-ca-file",
        &wrong_ca,
        "--admin-listen",
        "127.0.0.1:0",
    ]));
    let log_path = herald.logs().join("poller-wrong-etcd-ca.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let mut child = tokio::process::Command::new(HERALD)
        .args(&poller)
        .env("HERALD_DATABASE_URL", &herald.runtime_database_url)
        .env("HERALD_REDIS_CA_FILE", &certs.ca)
        .env("HERALD_REDIS_CERT_FILE", &certs.client_cert)
        .env("HERALD_REDIS_KEY_FILE", &certs.client_key)
        .env("HERALD_ETCD_CERT_FILE", &certs.client_cert)
        .env("HERALD_ETCD_KEY_FILE", &certs.client_key)
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let text = std::fs::read_to_string(&log_path).unwrap_or_default();
        if let Some(line) = text.lines().find(|line| {
            line.contains("etcd") && line.contains("certificate") && line.contains("UnknownIssuer")
        }) {
            println!("the poller said: {line}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no word of etcd's certificate in the poller's log: {text}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let _ = child.kill().await;
    // The provider over https: a send worker trusting the test CA delivers through the HTTPS
    // front (the first worker stops, so every new message goes this way).
    let port = https_front(&certs, &herald.sim_url).await;
    assert!(herald
        .role("send-worker")
        .terminate(Duration::from_secs(20))
        .await
        .unwrap());
    let worker = args(&[
        "worker",
        "--job-type",
        "send",
        "--redis-url",
        &herald.send_redis.url(),
        "--provider-url",
        &format!("https://localhost:{port}"),
        "--provider-ca-file",
        certs.ca.to_str().unwrap(),
    ]);
    herald.spawn_with_admin("worker-https", worker).await;
    let more = herald.send(10, 10, 1).await;
    assert_eq!(more.len(), 10);
    herald.wait_delivered(40, Duration::from_secs(90)).await;
    let (code, report) = herald.verify().await;
    assert_eq!(code, 0, "{report}");

    let owned: i64 =
        sqlx::query_scalar("SELECT count(*) FROM partition_leases WHERE owner = 'wrong-etcd-ca'")
            .fetch_one(&herald.pool)
            .await
            .unwrap();
    assert_eq!(
        owned, 0,
        "a poller that cannot reach etcd owns no partition"
    );
}
