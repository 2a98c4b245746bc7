"""Kubernetes object helpers shared by kubernetes_test.py and kubernetes_workers.py."""
from __future__ import annotations

# Custom resources: checked here and in kubernetes_workers.py, not by kubernetes-validate.
CRD_GROUPS = ("monitoring.coreos.com/", "keda.sh/", "cert-manager.io/")


def is_crd(obj: dict) -> bool:
    return obj["apiVersion"].startswith(CRD_GROUPS)


def pod_spec(obj: dict) -> dict | None:
    if obj["kind"] in ("StatefulSet", "DaemonSet", "Deployment", "Job", "ReplicaSet"):
        return obj["spec"]["template"]["spec"]
    if obj["kind"] == "CronJob":
        return obj["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    if obj["kind"] == "Pod":
        return obj["spec"]
    return None


def pod_labels(obj: dict) -> dict:
    if obj["kind"] == "CronJob":
        return obj["spec"]["jobTemplate"]["spec"]["template"]["metadata"].get("labels", {})
    return obj["spec"]["template"]["metadata"].get("labels", {})




def matches(selector: dict, labels: dict) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def name_of(obj: dict) -> str:
    return f"{obj['kind']}/{obj['metadata']['name']}"


def flags_of(c: dict) -> dict[str, str]:
    """--flag=value arguments of a container ("" for a bare --flag)."""
    return {a.split("=", 1)[0]: a.split("=", 1)[1] if "=" in a else "" for a in c.get("args", [])}


def workers_of(objs: list[dict]) -> list[dict]:
    """The worker workloads (pods labelled app.kubernetes.io/component=worker)."""
    return [o for o in objs if pod_spec(o) is not None and
            pod_labels(o).get("app.kubernetes.io/component") == "worker"]
