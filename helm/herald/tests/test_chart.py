"""The Helm chart's checks: it lints strictly and renders for the default values and each
example, every manifest validates against the Kubernetes schemas, and the invariants that
keep messages safe hold in what is rendered. Run by scripts/check-helm."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path
from urllib.parse import urlsplit

import helm_python as helm
import kubernetes_validate.utils
import pytest
import yaml

from chart import (
    CHART,
    CRD_KINDS,
    NAMESPACE,
    REPO,
    VALUES_FILES,
    deep_merge,
    effective_env,
    find,
    full,
    notes,
    one,
    parse_duration_seconds,
    pod_spec,
    render,
    render_named,
    secret_values,
    values_of,
)

EXAMPLES = list(VALUES_FILES)
HERALD_ROLES = {
    "api": ["api"],
    "poller": ["poller"],
    "worker-send": ["worker"],
    "worker-status": ["worker"],
    "provider-sim": ["provider-sim"],
}


def kube_versions() -> tuple[str, str]:
    """The oldest Kubernetes the chart claims (Chart.yaml kubeVersion) and the newest
    kubernetes-validate has schemas for."""
    claim = yaml.safe_load((CHART / "Chart.yaml").read_text())["kubeVersion"]
    oldest = re.match(r"^>=\s*(\d+\.\d+)\.\d+", claim)
    assert oldest, f"kubeVersion {claim!r} names no lower bound"
    return oldest.group(1) + ".0", kubernetes_validate.utils.latest_version()


# --- lint, render, schemas -------------------------------------------------------------


@pytest.mark.parametrize("example", EXAMPLES)
@pytest.mark.parametrize("kube", kube_versions())
def test_chart_lints_strictly(example, kube):
    report = helm.lint(CHART, values_of(example), strict=True, kube_version="v" + kube)
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert not report["errors"] and not problems, json.dumps(report, indent=2)


@pytest.mark.parametrize("example", EXAMPLES)
def test_every_manifest_validates_against_the_kubernetes_schemas(example, tmp_path):
    objects = render_named(example)
    files = []
    crds = []
    for i, obj in enumerate(objects):
        if (obj["apiVersion"], obj["kind"]) in CRD_KINDS:
            crds.append(obj)
        obj = {k: v for k, v in obj.items() if k != "_template"}
        path = tmp_path / f"{i:03}-{obj['kind'].lower()}-{obj['metadata']['name']}.yaml"
        path.write_text(yaml.safe_dump(obj))
        files.append(str(path))
    versions = kube_versions()
    args = [sys.executable, "-m", "kubernetes_validate", "--strict"]
    for version in versions:
        args += ["-k", version]
    result = subprocess.run(args + files, capture_output=True, text=True)
    lines = result.stdout.splitlines()
    errors = [line for line in lines if line.startswith(("ERROR", "FATAL"))]
    assert result.returncode == 0 and not errors, result.stdout + result.stderr
    # Only the custom resources may lack a schema; anything else is a failure, not a skip.
    unknown = [line for line in lines if line.startswith("WARN")]
    crd_names = {f"kind {kind} with api version {api}" for api, kind in CRD_KINDS}
    assert all(any(n in line for n in crd_names) for line in unknown), "\n".join(unknown)
    assert len(unknown) == len(crds) * len(versions), "\n".join(unknown)
    passed = [line for line in lines if line.startswith("INFO") and " passed " in line]
    assert len(passed) == (len(objects) - len(crds)) * len(versions), result.stdout


def test_the_examples_exercise_both_autoscalers_and_both_kinds_of_store():
    small, large = render_named("small"), render_named("large")
    assert find(small, "HorizontalPodAutoscaler") and not find(small, "ScaledObject")
    assert find(large, "ScaledObject") and not find(large, "HorizontalPodAutoscaler")
    assert one(large, "StatefulSet", full("redis-send"))["spec"]["replicas"] == 4
    assert not find(large, "StatefulSet", full("redis-status"))  # external, 2 shards
    assert find(small, "Deployment", full("provider-sim"))


def test_custom_resources_have_the_fields_their_operators_need():
    objects = render_named("large")
    monitor = one(objects, "ServiceMonitor", "herald")
    assert monitor["spec"]["jobLabel"] == "herald/scrape-job"
    assert {e["port"] for e in monitor["spec"]["endpoints"]} == {"http", "admin"}
    scaled = find(objects, "ScaledObject")[0]
    assert scaled["spec"]["scaleTargetRef"]["name"] == full("poller")
    trigger = scaled["spec"]["triggers"][0]
    assert trigger["type"] == "prometheus"
    assert "herald_outbox_backlog_rows" in trigger["metadata"]["query"]
    assert float(trigger["metadata"]["threshold"]) > 0
    rule = find(objects, "PrometheusRule")[0]
    assert rule["spec"]["groups"] and all(g["rules"] for g in rule["spec"]["groups"])
    pods = render({"metrics": {"podMonitor": {"enabled": True}}})
    assert not find(pods, "ServiceMonitor")
    monitor = one(pods, "PodMonitor", "herald")
    assert monitor["spec"]["jobLabel"] == "herald/scrape-job"
    assert {e["port"] for e in monitor["spec"]["podMetricsEndpoints"]} == {"http", "admin"}
    scraped = [d for d in find(pods, "Deployment") if "herald/scrape-job" in d["spec"]["template"]["metadata"]["labels"]]
    assert len(scraped) == len(find(pods, "Deployment"))


def test_schema_rejects_typos_and_passwords_in_urls():
    with helm.Chart.load(CHART) as chart:
        chart.validate_schema({})
        for bad in (
            {"poller": {"replcas": 3}},
            {"partitions": 0},
            {"redis": {"send": {"external": {"urls": ["redis://:hunter2@redis:6379/"]}}}},
            {"poller": {"pollInterval": "half a second"}},
            {"workers": {"status": {"statusAliases": ["ACKD=MAYBE"]}}},
        ):
            with pytest.raises(helm.HelmValuesError):
                chart.validate_schema(bad)


@pytest.mark.parametrize(
    "values, reason",
    [
        ({"etcd": {"endpoints": []}, "poller": {"replicas": 2}}, "etcd.endpoints"),
        ({"poller": {"terminationGracePeriodSeconds": 12}}, "terminationGracePeriodSeconds"),
        ({"partitions": 2, "poller": {"replicas": 3}}, "must not exceed partitions"),
        (
            {"metrics": {"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True}}},
            "not both",
        ),
        ({"redis": {"send": {"auth": {"enabled": True}}}}, "existingSecret or password"),
        ({"postgresql": {"runtimeRole": {"name": "herald_runtime"}}}, "runtimeRole.existingSecret"),
        (
            {
                "postgresql": {
                    "existingSecret": "pg",
                    "existingSecretUrlKey": "url",
                    "runtimeRole": {"name": "herald_runtime", "existingSecret": "rt"},
                }
            },
            "not existingSecretUrlKey",
        ),
        (
            {"postgresql": {"runtimeRole": {"name": "herald", "existingSecret": "rt"}}},
            "must differ from postgresql.user",
        ),
    ],
)
def test_render_refuses_unsafe_values(values, reason):
    with pytest.raises(helm.HelmRenderError, match=re.escape(reason)):
        render(values)


def test_names_fit_kubernetes_limits_with_a_long_release_name():
    values = deep_merge(values_of("large"), {"fullnameOverride": "x" * 70})
    for obj in render(values):
        name = obj["metadata"]["name"]
        assert len(name) <= 63, name
        if obj["kind"] == "StatefulSet":
            # Pods get a controller-revision-hash label of the name plus 11 characters.
            assert len(name) + 11 <= 63, name


# --- the invariants that matter --------------------------------------------------------


@pytest.mark.parametrize("example", EXAMPLES)
def test_poller_grace_period_exceeds_the_drain_timeout(example):
    objects = render_named(example)
    poller = one(objects, "Deployment", full("poller"))
    drain = parse_duration_seconds(effective_env(objects, poller)["HERALD_DRAIN_TIMEOUT"])
    grace = pod_spec(poller)["terminationGracePeriodSeconds"]
    # Drain, then release the lease (one etcd round trip), then exit: leave 5 s for the rest.
    assert grace > drain + 5, f"grace {grace}s, drain {drain}s"


@pytest.mark.parametrize("example", EXAMPLES)
def test_pollers_roll_by_surging_one_and_keeping_the_rest(example):
    objects = render_named(example)
    poller = one(objects, "Deployment", full("poller"))
    assert poller["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    pdb = one(objects, "PodDisruptionBudget", full("poller"))
    assert pdb["spec"]["selector"]["matchLabels"] == poller["spec"]["selector"]["matchLabels"]
    env = effective_env(objects, poller)
    assert env["HERALD_POLLER_ID"] == {"from": {"fieldRef": {"fieldPath": "metadata.name"}}}
    assert env["HERALD_ETCD_ENDPOINTS"], "a fleet of pollers needs etcd"


def partitions_of(objects) -> int:
    migrate = one(objects, "Job", full("migrate"))
    return int(effective_env(objects, migrate)["HERALD_PARTITIONS"])


@pytest.mark.parametrize(
    "values",
    [
        values_of("small"),
        values_of("large"),
        {"partitions": 4, "poller": {"autoscaling": {"enabled": True, "maxReplicas": 16}}},
        {
            "partitions": 3,
            "poller": {
                "replicas": 2,
                "autoscaling": {"enabled": True, "minReplicas": 1, "maxReplicas": 9, "keda": {"enabled": True}},
            },
        },
    ],
    ids=["small", "large", "hpa-above-partitions", "keda-above-partitions"],
)
def test_autoscaler_max_replicas_at_most_partitions(values):
    objects = render(values)
    partitions = partitions_of(objects)
    hpas = find(objects, "HorizontalPodAutoscaler")
    scaled = find(objects, "ScaledObject")
    assert len(hpas) + len(scaled) == 1
    if hpas:
        spec = hpas[0]["spec"]
        assert spec["scaleTargetRef"]["name"] == full("poller")
        assert spec["maxReplicas"] <= partitions, (spec["maxReplicas"], partitions)
        metric = spec["metrics"][0]["external"]["metric"]
        assert metric["name"] == "herald_outbox_backlog_rows"
    else:
        spec = scaled[0]["spec"]
        assert spec["maxReplicaCount"] <= partitions, (spec["maxReplicaCount"], partitions)
    # The autoscaler owns the replica count; an upgrade must not reset it.
    assert "replicas" not in one(objects, "Deployment", full("poller"))["spec"]
    assert one(objects, "Deployment", full("poller"))["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0


SECRETS = {
    "postgresql": {
        "password": "pg-Very-s3cret-value",
        "runtimeRole": {"name": "herald_runtime", "existingSecret": "herald-runtime"},
    },
    "redis": {
        "send": {"auth": {"enabled": True, "password": "send-redis-s3cret"}},
        "status": {"auth": {"enabled": True, "password": "status-redis-s3cret"}},
    },
    "api": {"auth": {"existingSecret": "herald-api-auth"}},
    "providerSim": {"enabled": True},
}


@pytest.mark.parametrize("example", EXAMPLES + ["chart-created-secrets"])
def test_no_secret_value_appears_in_a_configmap(example):
    values = SECRETS if example == "chart-created-secrets" else values_of(example)
    objects = render(values)
    secrets = secret_values(objects)
    if example == "chart-created-secrets":
        assert {"pg-Very-s3cret-value", "send-redis-s3cret", "status-redis-s3cret"} <= set(secrets)
    configmaps = find(objects, "ConfigMap")
    assert configmaps
    for cm in configmaps:
        for key, value in (cm.get("data") or {}).items():
            for secret in secrets:
                assert secret not in value, f"ConfigMap {cm['metadata']['name']} {key} holds a Secret value"
            for url in re.findall(r"[a-z]+://[^\s\"',]+", value):
                assert urlsplit(url).password is None, f"{cm['metadata']['name']} {key}: {url}"
    # A password given in values is only ever in a Secret, never in any other object.
    for obj in objects:
        if obj["kind"] == "Secret":
            continue
        text = yaml.safe_dump(obj)
        for secret in secrets:
            assert secret not in text, f"{obj['kind']} {obj['metadata']['name']} holds a Secret value"


def containers_of(workload: dict) -> list[dict]:
    spec = pod_spec(workload)
    return spec.get("initContainers", []) + spec["containers"]


@pytest.mark.parametrize("example", EXAMPLES + ["chart-created-secrets"])
def test_no_secret_reaches_a_command_line(example):
    """Every process's command line is readable by every user of its node: a Secret reaches a
    container as a variable or a file, never in its command or args, not even as $(VAR)."""
    values = SECRETS if example == "chart-created-secrets" else values_of(example)
    objects = render(values)
    secrets = secret_values(objects)
    workloads = find(objects, "Deployment") + find(objects, "StatefulSet") + find(objects, "Job")
    for workload in workloads:
        for c in containers_of(workload):
            from_secrets = {
                e["name"] for e in c.get("env", []) if "secretKeyRef" in e.get("valueFrom", {})
            }
            # A variable whose value expands a Secret's variable carries the secret too.
            from_secrets |= {
                e["name"]
                for e in c.get("env", [])
                if any(f"$({name})" in e.get("value", "") for name in from_secrets)
            }
            line = " ".join(c.get("command", []) + c.get("args", []))
            name = f"{workload['metadata']['name']}/{c['name']}"
            for var in from_secrets:
                assert f"$({var})" not in line, f"{name} puts {var} on its command line: {line}"
            for secret in secrets:
                assert secret not in line, f"{name} has a Secret value on its command line"


def test_keys_and_receipt_secrets_come_from_one_secret_as_variables():
    objects = render(SECRETS)
    api = effective_env(objects, one(objects, "Deployment", full("api")))
    sim = effective_env(objects, one(objects, "Deployment", full("provider-sim")))
    ref = lambda env, var: env[var]["from"]["secretKeyRef"]
    assert ref(api, "HERALD_API_CLIENT_KEYS") == {"name": "herald-api-auth", "key": "client-keys", "optional": True}
    assert ref(api, "HERALD_API_OPERATOR_KEYS") == {"name": "herald-api-auth", "key": "operator-keys", "optional": True}
    assert ref(api, "HERALD_RECEIPT_SECRETS") == {"name": "herald-api-auth", "key": "receipt-secrets"}
    # The simulator signs with what the API verifies with.
    assert ref(sim, "HERALD_SIM_RECEIPT_SECRETS") == ref(api, "HERALD_RECEIPT_SECRETS")
    assert api["HERALD_RECEIPT_SIGNATURE_WINDOW"] == "5m"
    # Without the Secret the API has nothing to start with: NOTES say what to set.
    assert "api.auth.existingSecret" in notes({})


def test_roles_connect_as_the_runtime_role_that_the_migration_creates():
    objects = render(SECRETS)
    job = effective_env(objects, one(objects, "Job", full("migrate")))
    assert urlsplit(job["HERALD_DATABASE_URL"]).username == "herald"
    assert job["HERALD_RUNTIME_ROLE"] == "herald_runtime"
    assert job["HERALD_RUNTIME_ROLE_PASSWORD"]["from"]["secretKeyRef"] == {"name": "herald-runtime", "key": "password"}
    for component in ("api", "poller", "worker-send", "worker-status"):
        env = effective_env(objects, one(objects, "Deployment", full(component)))
        assert urlsplit(env["HERALD_DATABASE_URL"]).username == "herald_runtime", component
        assert env["PGPASSWORD"]["from"]["secretKeyRef"]["name"] == "herald-runtime", component
    # Without a runtime role every role connects as postgresql.user, as before.
    plain = render({})
    env = effective_env(plain, one(plain, "Deployment", full("api")))
    assert urlsplit(env["HERALD_DATABASE_URL"]).username == "herald"


def store_urls(objects, env_value) -> list[str]:
    if isinstance(env_value, dict):
        raise AssertionError(f"a Redis URL list must be a value, not {env_value}")
    return env_value.split(",")


def host_of(url: str) -> str:
    return urlsplit(url).hostname


@pytest.mark.parametrize("example", EXAMPLES + ["chart-created-secrets"])
def test_each_job_types_worker_points_at_its_own_redis(example):
    values = SECRETS if example == "chart-created-secrets" else values_of(example)
    objects = render(values)
    merged = deep_merge(yaml.safe_load((CHART / "values.yaml").read_text()), values)
    api = effective_env(objects, one(objects, "Deployment", full("api")))
    poller = effective_env(objects, one(objects, "Deployment", full("poller")))
    hosts = {}
    for job_type, poller_var in (("send", "HERALD_REDIS_SEND_URL"), ("status", "HERALD_REDIS_STATUS_URL")):
        worker = one(objects, "Deployment", full(f"worker-{job_type}"))
        env = effective_env(objects, worker)
        assert env["HERALD_JOB_TYPE"] == job_type
        urls = store_urls(objects, env["HERALD_REDIS_URL"])
        # The poller publishes where this job type's workers read; the API watches the same.
        assert urls == store_urls(objects, poller[poller_var]) == store_urls(objects, api[poller_var])
        store = merged["redis"][job_type]
        if store["external"]["urls"]:
            assert [host_of(u) for u in urls] == [host_of(u) for u in store["external"]["urls"]]
        else:
            sts = one(objects, "StatefulSet", full(f"redis-{job_type}"))
            assert sts["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"] == f"redis-{job_type}"
            assert len(urls) == sts["spec"]["replicas"] == store["shards"]
            svc = sts["spec"]["serviceName"]
            assert [host_of(u) for u in urls] == [
                f"{sts['metadata']['name']}-{i}.{svc}.{NAMESPACE}.svc" for i in range(len(urls))
            ]
        if store["auth"]["enabled"]:
            var = f"REDIS_{job_type.upper()}_PASSWORD"
            assert all(f"$({var})@" in u for u in urls), urls
            ref = env[var]["from"]["secretKeyRef"]
            assert ref["name"] in (store["auth"]["existingSecret"], full(f"redis-{job_type}"))
        hosts[job_type] = {host_of(u) for u in urls}
    assert not hosts["send"] & hosts["status"], f"send and status share a Redis: {hosts}"


@pytest.mark.parametrize("example", EXAMPLES)
def test_chart_run_redis_answers_only_its_own_job_types_pods(example):
    objects = render_named(example)
    for sts in find(objects, "StatefulSet"):
        job_type = sts["metadata"]["name"].rsplit("-", 1)[1]
        policy = one(objects, "NetworkPolicy", sts["metadata"]["name"])
        assert policy["spec"]["podSelector"]["matchLabels"] == sts["spec"]["selector"]["matchLabels"]
        allowed = set()
        for rule in policy["spec"]["ingress"]:
            for peer in rule["from"]:
                expression = peer["podSelector"]["matchExpressions"][0]
                assert expression["key"] == "app.kubernetes.io/component" and expression["operator"] == "In"
                allowed |= set(expression["values"])
        other = "status" if job_type == "send" else "send"
        assert allowed == {"api", "poller", f"worker-{job_type}"}, allowed
        assert f"worker-{other}" not in allowed


@pytest.mark.parametrize("example", EXAMPLES)
def test_chart_run_redis_has_maxmemory_and_noeviction(example):
    objects = render_named(example)
    merged = deep_merge(yaml.safe_load((CHART / "values.yaml").read_text()), values_of(example))
    for job_type in ("send", "status"):
        store = merged["redis"][job_type]
        if store["external"]["urls"]:
            continue
        conf = one(objects, "ConfigMap", full(f"redis-{job_type}"))["data"]["redis.conf"].splitlines()
        assert "maxmemory-policy noeviction" in conf
        assert f"maxmemory {store['maxmemoryMb']}mb" in conf
        sts = one(objects, "StatefulSet", full(f"redis-{job_type}"))
        container = pod_spec(sts)["containers"][0]
        assert container["args"][0] == "/etc/redis/redis.conf"
        limit = container["resources"]["limits"]["memory"]
        assert mebibytes(limit) > store["maxmemoryMb"], f"{job_type}: limit {limit} not above maxmemory"


def mebibytes(quantity: str) -> float:
    units = {"Ki": 1 / 1024, "Mi": 1, "Gi": 1024, "Ti": 1024 * 1024}
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti)", quantity)
    assert m, quantity
    return float(m.group(1)) * units[m.group(2)]


@pytest.mark.parametrize("example", EXAMPLES)
def test_every_workload_is_hardened_probed_and_labelled(example):
    objects = render_named(example)
    labels = {
        "app.kubernetes.io/name",
        "app.kubernetes.io/instance",
        "app.kubernetes.io/version",
        "app.kubernetes.io/component",
        "app.kubernetes.io/managed-by",
        "app.kubernetes.io/part-of",
        "helm.sh/chart",
    }
    for obj in objects:
        assert labels <= set(obj["metadata"].get("labels", {})), f"{obj['kind']} {obj['metadata']['name']}"
    workloads = find(objects, "Deployment") + find(objects, "StatefulSet") + find(objects, "Job")
    assert len(find(objects, "Deployment")) >= 4
    for w in workloads:
        spec = pod_spec(w)
        assert spec["securityContext"]["runAsNonRoot"] is True
        pod_labels = w["spec"]["template"]["metadata"]["labels"]
        for constraint in spec.get("topologySpreadConstraints", []):
            wanted = constraint["labelSelector"]["matchLabels"]
            assert wanted.items() <= pod_labels.items(), f"{w['metadata']['name']} spreads other pods"
        assert spec["automountServiceAccountToken"] is False
        for c in spec["containers"]:
            sc = c["securityContext"]
            name = f"{w['metadata']['name']}/{c['name']}"
            assert sc["readOnlyRootFilesystem"] is True, name
            assert sc["allowPrivilegeEscalation"] is False, name
            assert sc["capabilities"]["drop"] == ["ALL"], name
            assert c["resources"].get("requests") and c["resources"].get("limits"), name
            if w["kind"] != "Job":
                assert c.get("livenessProbe") and c.get("readinessProbe"), name
    for d in find(objects, "Deployment"):
        c = pod_spec(d)["containers"][0]
        # The probes go to the admin port where there is one (the API's), else the only port.
        port = c["ports"][-1]["name"]
        assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": port}
        assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": port}
        assert c["image"] == one(objects, "Job", full("migrate"))["spec"]["template"]["spec"]["containers"][0]["image"]


TLS_EVERYWHERE = {
    "postgresql": {
        "sslMode": "verify-full",
        "tls": {"existingSecret": "db-ca", "clientCertificate": True},
        "runtimeRole": {"name": "herald_runtime", "existingSecret": "rt"},
    },
    "redis": {
        "tls": {"existingSecret": "redis-tls", "clientCertificate": True},
        "send": {"external": {"urls": ["rediss://redis-send.example:6380/"]}},
        "status": {"external": {"urls": ["rediss://redis-status.example:6380/"]}},
    },
    "etcd": {
        "endpoints": ["https://etcd-0.etcd:2379"],
        "tls": {"existingSecret": "etcd-client", "clientCertificate": True},
        "auth": {"user": "herald", "existingSecret": "etcd-herald"},
    },
    "workers": {"send": {"providerTls": {"existingSecret": "gw-tls"}}},
}


def test_tls_files_are_mounted_where_each_role_reads_them():
    objects = render(TLS_EVERYWHERE)
    expected = {
        full("api"): {"postgresql", "redis"},
        full("poller"): {"postgresql", "redis", "etcd"},
        full("worker-send"): {"postgresql", "redis", "provider"},
        full("worker-status"): {"postgresql", "redis"},
        full("migrate"): {"postgresql"},
    }
    secrets = {"postgresql": "db-ca", "redis": "redis-tls", "etcd": "etcd-client", "provider": "gw-tls"}
    workloads = find(objects, "Deployment") + [one(objects, "Job", full("migrate"))]
    for workload in workloads:
        name = workload["metadata"]["name"]
        spec = pod_spec(workload)
        container = spec["containers"][0]
        volumes = {v["name"]: v for v in spec["volumes"]}
        files = {}
        mounted = set()
        for mount in container.get("volumeMounts", []):
            secret = volumes[mount["name"]].get("secret")
            if secret is None:
                continue
            assert mount["readOnly"], mount
            service = mount["mountPath"].removeprefix("/etc/herald/tls/")
            assert secret["secretName"] == secrets[service], (name, service)
            mounted.add(service)
            for item in secret["items"]:
                files[f"{mount['mountPath']}/{item['path']}"] = item["key"]
        assert mounted == expected[name], (name, mounted)
        env = effective_env(objects, workload)
        referenced = [v for k, v in env.items() if k.endswith("_FILE") and isinstance(v, str)]
        url = env.get("HERALD_DATABASE_URL", "")
        assert "sslmode=verify-full" in url, (name, url)
        referenced += re.findall(r"ssl(?:rootcert|cert|key)=([^&]+)", url)
        assert len(referenced) >= 3, (name, referenced)
        for path in referenced:
            assert path in files, f"{name}: {path} is not a mounted file ({sorted(files)})"
        # Client certificates only where asked for: the provider's Secret has a CA only.
        if "provider" in mounted:
            assert "HERALD_PROVIDER_CA_FILE" in env and "HERALD_PROVIDER_CERT_FILE" not in env
    poller_env = effective_env(objects, one(objects, "Deployment", full("poller")))
    assert poller_env["HERALD_ETCD_USER"] == "herald"
    assert poller_env["HERALD_ETCD_PASSWORD"]["from"]["secretKeyRef"]["name"] == "etcd-herald"
    # Without TLS Secrets nothing is mounted, and the URL still asks for encryption.
    plain = render()
    for workload in find(plain, "Deployment"):
        assert not [v for v in pod_spec(workload)["volumes"] if "secret" in v]
    api_env = effective_env(plain, one(plain, "Deployment", full("api")))
    assert "sslmode=require" in api_env["HERALD_DATABASE_URL"]
    with pytest.raises(helm.HelmRenderError, match="etcd.auth.user needs"):
        render({"etcd": {"auth": {"user": "herald"}}})


def images(objects: list[dict]) -> set[str]:
    return {
        c["image"]
        for o in objects
        if o["kind"] in ("Deployment", "StatefulSet", "Job")
        for c in pod_spec(o).get("initContainers", []) + pod_spec(o)["containers"]
    }


def test_a_valkey_image_runs_the_same_command_and_probes():
    valkey = {"image": {"repository": "valkey/valkey", "tag": "8.1-alpine"}}
    objects = render({"redis": {"send": valkey, "status": valkey}})
    default = render()
    for type_ in ("send", "status"):
        store = one(objects, "StatefulSet", full(f"redis-{type_}"))
        before = one(default, "StatefulSet", full(f"redis-{type_}"))
        container, was = pod_spec(store)["containers"][0], pod_spec(before)["containers"][0]
        assert container["image"] == "valkey/valkey:8.1-alpine"
        for key in ("command", "args", "readinessProbe", "livenessProbe"):
            assert container.get(key) == was.get(key), key


def test_image_references_take_a_registry_a_mirror_and_a_digest():
    app = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    assert images(render()) == {f"herald:{app}", "redis:7.4-alpine"}
    digest = "sha256:" + "ab" * 32
    mirrored = render({"global": {"imageRegistry": "mirror.example:5000/hub"}})
    assert images(mirrored) == {f"mirror.example:5000/hub/herald:{app}", "mirror.example:5000/hub/redis:7.4-alpine"}
    pinned = render(
        {
            "global": {"imageRegistry": "mirror.example"},
            "image": {"registry": "ghcr.io/acme", "tag": "1.2.3", "digest": digest},
        }
    )
    assert images(pinned) == {f"ghcr.io/acme/herald@{digest}", "mirror.example/redis:7.4-alpine"}
    with helm.Chart.load(CHART) as chart:
        for bad in ({"image": {"digest": "latest"}}, {"global": {"imageRegistry": "https://x/"}}):
            with pytest.raises(helm.HelmValuesError):
                chart.validate_schema(bad)


@pytest.mark.parametrize("example", EXAMPLES)
def test_migrations_run_as_a_pre_install_and_pre_upgrade_hook(example):
    objects = render_named(example)
    job = one(objects, "Job", full("migrate"))
    hooks = set(job["metadata"]["annotations"]["helm.sh/hook"].split(","))
    assert hooks == {"pre-install", "pre-upgrade"}
    assert pod_spec(job)["containers"][0]["args"] == ["migrate"]
    env = effective_env(objects, job)
    assert "HERALD_DATABASE_URL" in env


def test_each_role_listens_where_its_probes_and_service_look():
    objects = render_named("small")
    for component, var in (
        ("api", "HERALD_API_LISTEN"),
        ("poller", "HERALD_ADMIN_LISTEN"),
        ("worker-send", "HERALD_ADMIN_LISTEN"),
        ("worker-status", "HERALD_ADMIN_LISTEN"),
        ("provider-sim", "HERALD_SIM_LISTEN"),
    ):
        d = one(objects, "Deployment", full(component))
        container = pod_spec(d)["containers"][0]
        port = container["ports"][0]
        env = effective_env(objects, d)
        assert env[var] == f"0.0.0.0:{port['containerPort']}"
        svc = one(objects, "Service", full(component))
        assert svc["spec"]["ports"][0]["targetPort"] == port["name"]
        # The probes and /metrics are on the admin port wherever a role has one.
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        probed = container["readinessProbe"]["httpGet"]["port"]
        if "admin" in ports:
            assert env["HERALD_ADMIN_LISTEN"] == f"0.0.0.0:{ports['admin']}", component
            assert probed == "admin" and container["livenessProbe"]["httpGet"]["port"] == "admin"
            assert {p["name"] for p in svc["spec"]["ports"]} >= {"admin"}, component
        else:
            assert probed == port["name"], component
    api = one(objects, "Deployment", full("api"))
    assert [p["name"] for p in pod_spec(api)["containers"][0]["ports"]] == ["api", "admin"]
    # The ServiceMonitor scrapes ports named http and admin: the API's client port is neither.
    assert "http" not in {p["name"] for p in one(objects, "Service", full("api"))["spec"]["ports"]}


def test_the_api_drains_before_it_stops_and_the_chart_refuses_a_grace_too_short():
    objects = render()
    api = one(objects, "Deployment", full("api"))
    spec = pod_spec(api)
    env = effective_env(objects, api)
    assert env["HERALD_API_SHUTDOWN_DELAY"] == "5s"
    assert spec["containers"][0]["lifecycle"]["preStop"]["sleep"]["seconds"] == 3
    assert spec["terminationGracePeriodSeconds"] == 30
    with pytest.raises(helm.HelmRenderError, match="api.terminationGracePeriodSeconds"):
        render({"api": {"terminationGracePeriodSeconds": 8}})
    no_hook = pod_spec(one(render({"api": {"preStopSeconds": 0}}), "Deployment", full("api")))
    assert "lifecycle" not in no_hook["containers"][0]


# --- the chart's configuration is the CLI's --------------------------------------------


def herald_binary() -> Path:
    path = Path(os.environ.get("HERALD_BIN", REPO / "target" / "debug" / "herald"))
    assert path.exists(), f"{path} is missing: scripts/check-helm builds it (or set HERALD_BIN)"
    return path


def role_env_names(args: list[str]) -> set[str]:
    text = subprocess.run([herald_binary(), *args, "--help"], capture_output=True, text=True, check=True).stdout
    return set(re.findall(r"\[env: (HERALD_[A-Z0-9_]+)", text))


@pytest.mark.parametrize("example", EXAMPLES + ["chart-created-secrets"])
def test_every_variable_the_chart_sets_is_one_the_role_reads_and_accepts(example):
    values = SECRETS if example == "chart-created-secrets" else values_of(example)
    objects = render(values)
    workloads = [(d["metadata"]["name"], d) for d in find(objects, "Deployment")]
    workloads.append((full("migrate"), one(objects, "Job", full("migrate"))))
    checked = 0
    for name, workload in workloads:
        component = name.removeprefix(full(""))
        args = pod_spec(workload)["containers"][0]["args"]
        known = role_env_names(args)
        env = effective_env(objects, workload)
        herald_vars = {k for k in env if k.startswith("HERALD_")}
        assert herald_vars <= known, f"{component}: not flags of `herald {' '.join(args)}`: {herald_vars - known}"
        # The real binary parses the environment the pod gets (Secrets and the downward API
        # replaced by stand-ins) and prints what it understood.
        process_env = {"PATH": "/usr/bin:/bin"}
        for k, v in env.items():
            process_env[k] = "stand-in" if isinstance(v, dict) else re.sub(r"\$\([A-Z_]+\)", "pw", v)
        out = subprocess.run(
            [herald_binary(), *args, "--print-config"], env=process_env, capture_output=True, text=True
        )
        assert out.returncode == 0, f"{component}: {out.stderr}"
        printed = json.loads(out.stdout)
        if "HERALD_DRAIN_TIMEOUT" in env:
            assert printed["drain_timeout"] == env["HERALD_DRAIN_TIMEOUT"]
        if "HERALD_REDIS_URL" in env:
            assert len(printed["redis_url"]) == len(env["HERALD_REDIS_URL"].split(","))
        checked += 1
    assert checked >= 5


# Variables of a role's --help the chart deliberately leaves to the binary's default. The
# *_FILE forms of keys and secrets: the chart hands them over as variables from a Secret.
# HERALD_INSECURE_DEV: a release never runs an API open to anyone. HERALD_CONFIG: the chart's
# ConfigMaps are the configuration; a TOML file is for runs outside Kubernetes.
NOT_EXPOSED: dict[str, set[str]] = {
    role: names | {"HERALD_CONFIG"}
    for role, names in {
        "api": {
            "HERALD_API_CLIENT_KEYS_FILE",
            "HERALD_API_OPERATOR_KEYS_FILE",
            "HERALD_RECEIPT_SECRETS_FILE",
            "HERALD_INSECURE_DEV",
        },
        "poller": {"HERALD_ETCD_PASSWORD_FILE"},
        "worker": set(),
        "provider-sim": {"HERALD_SIM_RECEIPT_SECRETS_FILE"},
        "migrate": {"HERALD_RUNTIME_ROLE_PASSWORD_FILE"},
    }.items()
}


def test_the_retention_archive_is_a_claim_every_poller_mounts_where_it_writes():
    objects = render({"poller": {"retention": {"archive": {"existingClaim": "herald-archive"}}}})
    poller = one(objects, "Deployment", full("poller"))
    spec = pod_spec(poller)
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["archive"]["persistentVolumeClaim"]["claimName"] == "herald-archive"
    mounts = {m["name"]: m for m in spec["containers"][0]["volumeMounts"]}
    env = effective_env(objects, poller)
    assert mounts["archive"]["mountPath"] == env["HERALD_ARCHIVE_DIR"] == "/archive"
    assert env["HERALD_RETAIN_MESSAGES"] == "30d"
    # Without a claim nothing is mounted and nothing is archived.
    plain = render()
    poller = one(plain, "Deployment", full("poller"))
    assert "archive" not in {v["name"] for v in pod_spec(poller)["volumes"]}
    assert "HERALD_ARCHIVE_DIR" not in effective_env(plain, poller)


def test_every_flag_of_every_role_can_be_set_from_values():
    everything = deep_merge(
        SECRETS,
        {
            "workers": {
                "send": {"blockedRecipients": ["+15550199"]},
                "status": {"statusAliases": ["ACKD=DELIVRD"]},
            },
            "providerSim": {"enabled": True, "refuseStatus": 404},
            "api": {"rateLimit": {"perSecond": 100, "burst": 200}},
            "poller": {"retention": {"archive": {"existingClaim": "herald-archive"}}},
            "etcd": {
                "tls": {"existingSecret": "etcd-client", "clientCertificate": True},
                "auth": {"user": "herald", "existingSecret": "etcd-herald"},
            },
            "redis": {"tls": {"existingSecret": "redis-tls", "clientCertificate": True}},
        },
    )
    everything["workers"]["send"]["providerTls"] = {"existingSecret": "gw-tls", "clientCertificate": True}
    set_by_chart: dict[str, set[str]] = {}
    for values in (values_of("default"), values_of("small"), values_of("large"), everything):
        objects = render(values)
        workloads = find(objects, "Deployment") + [one(objects, "Job", full("migrate"))]
        for workload in workloads:
            role = pod_spec(workload)["containers"][0]["args"][0]
            set_by_chart.setdefault(role, set()).update(effective_env(objects, workload))
    assert set(set_by_chart) == set(NOT_EXPOSED)
    for role, names in set_by_chart.items():
        unset = role_env_names([role]) - names - NOT_EXPOSED[role]
        assert not unset, f"`herald {role}` reads {sorted(unset)}, which no value of the chart sets"


# --- dashboards, alert rules, documentation --------------------------------------------


def test_dashboards_and_rules_ship_from_the_repository_without_a_copy():
    # The files live in the chart, so an installer that takes the chart's folder from git gets
    # them without following a link; the repository's dashboards/ is the link.
    real = CHART / "files" / "dashboards"
    assert real.is_dir() and not real.is_symlink()
    link = REPO / "dashboards"
    assert link.is_symlink() and link.resolve() == real.resolve()
    values = {"metrics": {"prometheusRule": {"enabled": True}}}
    objects = render(values)
    shipped = {}
    for cm in find(objects, "ConfigMap"):
        if cm["metadata"]["labels"].get("grafana_dashboard") == "1":
            shipped.update(cm["data"])
    sources = {p.name: p.read_text() for p in sorted((REPO / "dashboards").glob("*.json"))}
    assert shipped.keys() == sources.keys()
    for name, text in sources.items():
        assert json.loads(shipped[name]) == json.loads(text), name
    rules = yaml.safe_load((REPO / "dashboards" / "herald-alerts.rules.yml").read_text())
    assert one(objects, "PrometheusRule", "herald")["spec"] == rules


def test_the_rules_take_the_runbook_address_and_the_queue_threshold_from_values():
    values = {
        "queueFullThreshold": 0.7,
        "metrics": {"prometheusRule": {"enabled": True, "runbookBaseUrl": "https://git.example.com/herald/blob/v1/docs/RUNBOOK.md/"}},
    }
    rules = [r for g in one(render(values), "PrometheusRule", "herald")["spec"]["groups"] for r in g["rules"]]
    assert len(rules) >= 15
    for rule in rules:
        anchor = rule["alert"].lower()
        assert rule["annotations"]["runbook_url"] == f"https://git.example.com/herald/blob/v1/docs/RUNBOOK.md#{anchor}"
        assert "for" in rule, f"{rule['alert']} has no for:"
        # Every release of a shared Prometheus alerts apart.
        assert "namespace" in rule["expr"] or rule["alert"] in ("HeraldNotReady", "HeraldTargetDown"), rule["alert"]
    memory = next(r for r in rules if r["alert"] == "HeraldQueueStoreMemoryHigh")
    assert memory["expr"].endswith("(herald_queue_memory_ratio) > 0.7"), memory["expr"]
    assert "above 70 %" in memory["annotations"]["description"]


def leaf_keys(tree: dict, prefix: str = "") -> list[str]:
    keys = []
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            keys.extend(leaf_keys(value, path + "."))
        else:
            keys.append(path)
    return keys


def test_the_packaged_chart_carries_the_dashboards_and_leaves_the_tests_out(tmp_path):
    archive = helm.package(CHART, destination=tmp_path)
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
    dashboards = {f"herald/files/dashboards/{p.name}" for p in (REPO / "dashboards").glob("*.json")}
    assert dashboards and dashboards <= names
    assert "herald/files/dashboards/herald-alerts.rules.yml" in names
    assert "herald/values.schema.json" in names and "herald/README.md" in names
    assert not [n for n in names if n.startswith(("herald/tests/", "herald/examples/", "herald/files/dashboards/tests/"))]


def test_readme_documents_every_value():
    readme = (CHART / "README.md").read_text()
    documented = set()
    for key in re.findall(r"^\| `([^`]+)` \|", readme, flags=re.M):
        documented |= {key.replace("<type>", t) for t in ("send", "status")}

    def is_documented(key: str) -> bool:
        parts = key.split(".")
        return any(".".join(parts[:n]) in documented for n in range(1, len(parts) + 1))

    keys = leaf_keys(yaml.safe_load((CHART / "values.yaml").read_text()))
    missing = [k for k in keys if not is_documented(k)]
    assert len(keys) > 100 and not missing, f"README.md does not document: {missing}"


def test_notes_say_how_to_reach_the_api_and_the_dashboards():
    text = notes(values_of("small"))
    assert "port-forward svc/herald-api" in text
    assert "grafana_dashboard=1" in text
