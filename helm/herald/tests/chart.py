"""Rendering the chart offline (the Helm library of helm-python-sdk, no helm binary, no cluster)."""

from __future__ import annotations

import base64
import copy
import functools
import re
from pathlib import Path
from typing import Any

import helm_python as helm
import yaml

CHART = Path(__file__).resolve().parent.parent
REPO = CHART.parent.parent
RELEASE = "herald"
NAMESPACE = "herald"

# The values files every check runs on: the defaults and each example.
VALUES_FILES = {
    "default": None,
    "small": CHART / "examples" / "small.yaml",
    "large": CHART / "examples" / "large.yaml",
}

# Custom resources: not in the Kubernetes schemas, checked by the tests below instead.
CRD_KINDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PodMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
    ("keda.sh/v1alpha1", "ScaledObject"),
}

helm.disable_logging()


def deep_merge(base: dict, override: dict) -> dict:
    """Helm's coalescing of values files: maps merge, anything else is replaced."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def values_of(name: str) -> dict:
    path = VALUES_FILES[name]
    return {} if path is None else (yaml.safe_load(path.read_text()) or {})


def render(values: dict | None = None) -> list[dict]:
    """Every rendered object, each with `_template` (its template file) added."""
    key = yaml.safe_dump(values or {}, sort_keys=True)
    return copy.deepcopy(_render(key))


@functools.lru_cache(maxsize=None)
def _render(key: str) -> list[dict]:
    values = yaml.safe_load(key) or {}
    with helm.Chart.load(CHART) as chart:
        chart.validate_schema(values)
        manifests = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    objects = []
    for template, text in sorted(manifests.items()):
        if template.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                doc["_template"] = template
                objects.append(doc)
    return objects


def render_named(name: str) -> list[dict]:
    return render(values_of(name))


def notes(values: dict | None = None) -> str:
    with helm.Chart.load(CHART) as chart:
        manifests = chart.render(values or {}, name=RELEASE, namespace=NAMESPACE, is_install=True)
    return next(text for template, text in manifests.items() if template.endswith("NOTES.txt"))


def find(objects: list[dict], kind: str, name: str | None = None) -> list[dict]:
    return [
        o
        for o in objects
        if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)
    ]


def one(objects: list[dict], kind: str, name: str) -> dict:
    found = find(objects, kind, name)
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def full(component: str) -> str:
    return f"{RELEASE}-{component}"


def pod_spec(obj: dict) -> dict:
    return obj["spec"]["template"]["spec"]


def effective_env(objects: list[dict], workload: dict, container: str | None = None) -> dict:
    """A container's environment as Kubernetes builds it: envFrom ConfigMaps, then env on top.
    A value from a Secret or the downward API is shown as {'from': …}."""
    spec = pod_spec(workload)
    containers = spec["containers"]
    c = containers[0] if container is None else next(x for x in containers if x["name"] == container)
    env: dict[str, Any] = {}
    for source in c.get("envFrom", []):
        ref = source["configMapRef"]["name"]
        env.update(one(objects, "ConfigMap", ref)["data"])
    for item in c.get("env", []):
        if "value" in item:
            env[item["name"]] = item["value"]
        else:
            env[item["name"]] = {"from": item["valueFrom"]}
    return env


def secret_values(objects: list[dict]) -> list[str]:
    values = []
    for secret in find(objects, "Secret"):
        for v in (secret.get("data") or {}).values():
            values.append(base64.b64decode(v).decode())
        values.extend((secret.get("stringData") or {}).values())
    return values


def parse_duration_seconds(text: str) -> float:
    """humantime's units, as the CLI parses them (e.g. 10s, 500ms, 2m, 1h30m)."""
    units = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1, "m": 60, "h": 3600, "d": 86400}
    parts = re.findall(r"(\d+)(ns|us|ms|s|m|h|d)", text)
    assert parts and "".join(n + u for n, u in parts) == text.replace(" ", ""), text
    return sum(int(n) * units[u] for n, u in parts)
