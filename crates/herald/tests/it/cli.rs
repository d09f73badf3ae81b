use std::process::Output;

use crate::deployment::HERALD;

fn herald(args: &[&str]) -> Output {
    std::process::Command::new(HERALD)
        .args(args)
        .env_remove("HERALD_DATABASE_URL")
        .output()
        .unwrap()
}

#[test]
fn help_names_every_role_and_its_environment_variables() {
    let out = herald(&["--help"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for role in [
        "migrate",
        "api",
        "poller",
        "worker",
        "provider-sim",
        "dev",
        "verify",
    ] {
        assert!(text.contains(role), "{role} missing from --help:\n{text}");
    }
    for (role, env) in [
        ("migrate", "HERALD_PARTITIONS"),
        ("api", "HERALD_API_KEYS"),
        ("poller", "HERALD_REDIS_SEND_URL"),
        ("worker", "HERALD_WORKER_CONCURRENCY"),
        ("provider-sim", "HERALD_SIM_ERROR_RATE"),
        ("dev", "HERALD_DEV_MESSAGES"),
        ("verify", "HERALD_PROVIDER_SIM_URL"),
    ] {
        let out = herald(&[role, "--help"]);
        assert!(out.status.success(), "{role} --help failed");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains(env),
            "{env} missing from {role} --help:\n{text}"
        );
    }
}

#[test]
fn bad_configuration_exits_64_with_the_reason() {
    let out = herald(&["api"]);
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--database-url"));

    let out = herald(&[
        "worker",
        "--job-type",
        "sms",
        "--database-url",
        "postgres://x/y",
    ]);
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("sms"));

    let out = herald(&[
        "migrate",
        "--database-url",
        "postgres://127.0.0.1:1/x",
        "--partitions",
        "0",
    ]);
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("partition count"));
}

#[test]
fn print_config_masks_passwords() {
    let out = herald(&[
        "api",
        "--database-url",
        "postgres://herald:s3cret@db/herald",
        "--api-keys",
        "k1,k2",
        "--print-config",
    ]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!text.contains("s3cret") && !text.contains("k1"), "{text}");
    assert!(text.contains("postgres://herald:***@db/herald"), "{text}");
}

#[tokio::test]
async fn migrate_refuses_another_partition_count() {
    let pg = herald_testkit::LocalPostgres::start().await.unwrap();
    let url = pg.create_database("herald").await.unwrap();
    let run = |partitions: &str| {
        std::process::Command::new(HERALD)
            .args([
                "migrate",
                "--database-url",
                &url,
                "--partitions",
                partitions,
            ])
            .output()
            .unwrap()
    };
    assert!(run("8").status.success());
    assert!(run("8").status.success());
    let out = run("16");
    assert_eq!(out.status.code(), Some(64));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("8 partitions") && stderr.contains("16"),
        "{stderr}"
    );
}
