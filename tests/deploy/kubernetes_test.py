#!/usr/bin/env python3
"""Renders every kustomize overlay and checks what a cluster would be given:

- `kubectl kustomize` succeeds; `kubernetes-validate --strict` accepts every object (and
  rejects a misspelt field, so the check can fail); the CRD objects it cannot know
  (ServiceMonitor, PrometheusRule) are checked here instead: the rules with promtool, the
  ServiceMonitor against the Services it selects;
- policy: one coordinator replica in a StatefulSet, no PodDisruptionBudget on it, its
  database claim ReadWriteOncePod (ReadWriteOnce in dev), a shared ReadWriteMany checkpoint
  claim in clusters; KubeRay's securityContext on every container; probes on the health
  port; every Service selects pods and its ports exist in them; every image pinned; every
  ConfigMap/Secret a pod uses is generated (hash suffix, so a change rolls it); every flag in
  a container's args is one the binary accepts (--help);
- worker pools, scaling, identity, drain, network policies, backups, priorities and the
  runbook URL: kubernetes_workers.py (pods of N GPUs in a StatefulSet per pool sized by a
  KEDA ScaledObject on the coordinator's queue metric, projected tokens verified by
  TokenReview, preStop drain, a disruption budget per pool, ...);
- hadolint on the container files and yamllint on the YAML under deploy/.

    kubernetes_test.py --coordinator BIN --worker BIN [--cli BIN]
"""
from __future__ import annotations

import argparse
import copy
import re
import shutil
import tempfile
import pathlib

import yaml

import deploylib as lib
import kubernetes_workers
from k8slib import flags_of, is_crd, matches, name_of, pod_labels, pod_spec, workers_of

# The overlays and what differs between them.
OVERLAYS = {
    "dev": {"db_access": ["ReadWriteOnce"], "checkpoints": ["ReadWriteOnce"], "gpu_pools": 0, "secure": False},
    "gpu-cluster": {"db_access": ["ReadWriteOncePod"], "checkpoints": ["ReadWriteMany"], "gpu_pools": 2,
                    "secure": True},
}
# Files the gpu-cluster overlay reads from secrets/ (the operator makes them).
SECRET_FILES = {"drain-token": "stm_test-drain-token\n", "tokens": "test-digests\n", "tls.crt": "test-cert\n", "tls.key": "test-key\n",
                "ca.crt": "test-ca\n"}
# Which binary each image runs.
IMAGE_BINARY = {"stemma/coordinator": "coordinator", "stemma/worker": "worker",
                "stemma/worker-cuda": "worker"}


def is_daemon(c: dict) -> bool:
    """A container that runs stemma-coordinator or stemma-worker (not a helper with a command)."""
    image = c["image"].split("@")[0].rsplit(":", 1)[0]
    return not c.get("command") and any(image.endswith(suffix) for suffix in IMAGE_BINARY)


def render(overlay: str, tmp: pathlib.Path, f: lib.Failures, edit=None) -> list[dict]:
    # A copy, so that the secrets the gpu-cluster overlay reads can be written beside it.
    tree = pathlib.Path(tempfile.mkdtemp(dir=tmp, prefix=f"{overlay}-")) / "kubernetes"
    shutil.copytree(lib.KUBERNETES, tree)
    if edit:
        edit(tree)
    secrets = tree / "overlays" / overlay / "secrets"
    if secrets.is_dir():
        for name, text in SECRET_FILES.items():
            (secrets / name).write_text(text)
    r = lib.run([lib.tool("kubectl"), "kustomize", str(tree / "overlays" / overlay)])
    if not f.check(r.returncode == 0, f"kubectl kustomize overlays/{overlay}:\n{r.stderr}"):
        return []
    (tmp / f"{overlay}.yaml").write_text(r.stdout)
    return [d for d in yaml.safe_load_all(r.stdout) if d]


def validate(overlay: str, tmp: pathlib.Path, objs: list[dict], f: lib.Failures) -> None:
    validator = lib.tool("kubernetes-validate")
    core = [o for o in objs if not is_crd(o)]
    path = tmp / f"{overlay}-core.yaml"
    path.write_text(yaml.safe_dump_all(core))
    r = lib.run([validator, "--strict", "--quiet", str(path)])
    f.check(r.returncode == 0 and "ERROR" not in r.stdout + r.stderr,
            f"kubernetes-validate --strict overlays/{overlay}:\n{r.stdout}{r.stderr}")
    # The validator must be able to fail: a field misspelt in the StatefulSet.
    bad = yaml.safe_load(yaml.safe_dump(core))
    for o in bad:
        if o["kind"] == "StatefulSet" and "replicas" in o["spec"]:
            o["spec"]["replica"] = o["spec"].pop("replicas")
    path.write_text(yaml.safe_dump_all(bad))
    r = lib.run([validator, "--strict", "--quiet", str(path)])
    f.check(r.returncode != 0, "kubernetes-validate accepted spec.replica: it checks nothing")


def check_crds(overlay: str, tmp: pathlib.Path, objs: list[dict], f: lib.Failures) -> None:
    crds = [o for o in objs if o["apiVersion"] == "monitoring.coreos.com/v1"]
    if not crds:
        return
    # With the monitoring component come the dashboards, for Grafana's sidecar.
    maps = [o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "stemma-dashboards"]
    if f.check(len(maps) == 1, f"overlays/{overlay}: no stemma-dashboards ConfigMap"):
        m = maps[0]
        f.check(m["metadata"].get("labels", {}).get("grafana_dashboard") == "1",
                f"overlays/{overlay}: stemma-dashboards lacks the grafana_dashboard label")
        want = {p.name: p.read_text() for p in lib.dashboard_files()}
        f.check(m.get("data") == want, f"overlays/{overlay}: stemma-dashboards differs from deploy/grafana/dashboards")
    services = [o for o in objs if o["kind"] == "Service"]
    for o in crds:
        n = f"overlays/{overlay} {name_of(o)}"
        f.check(o["kind"] in ("ServiceMonitor", "PrometheusRule"), f"{n}: unexpected kind")
        f.check(o["metadata"].get("labels", {}).get("release") == "kube-prometheus-stack",
                f"{n}: no release label: kube-prometheus-stack would not select it")
        if o["kind"] == "PrometheusRule":
            path = tmp / f"{overlay}-prometheusrule.yaml"
            path.write_text(yaml.safe_dump(o["spec"]))
            r = lib.run([lib.tool("promtool"), "check", "rules", str(path)])
            f.check(r.returncode == 0, f"{n}: promtool check rules:\n{r.stdout}{r.stderr}")
            f.check(set(o["spec"]) == {"groups"}, f"{n}: spec has fields besides groups")
        if o["kind"] == "ServiceMonitor":
            spec = o["spec"]
            f.check(set(spec) <= {"jobLabel", "selector", "endpoints", "namespaceSelector"},
                    f"{n}: unknown spec fields {sorted(set(spec))}")
            sel = spec.get("selector", {}).get("matchLabels", {})
            selected = [s for s in services if matches(sel, s["metadata"].get("labels", {}))]
            names = sorted(s["metadata"]["name"] for s in selected)
            f.check(names == ["stemma-coordinator", "stemma-worker"],
                    f"{n}: selects {names}, expected the coordinator and worker Services once each")
            for s in selected:
                jl = s["metadata"]["labels"].get(spec.get("jobLabel", ""))
                f.check(jl == s["metadata"]["name"],
                        f"{n}: jobLabel gives job={jl!r} for {name_of(s)}; the rules expect {s['metadata']['name']}")
                ports = {p.get("name") for p in s["spec"]["ports"]}
                for e in spec.get("endpoints", []):
                    f.check(e.get("port") in ports, f"{n}: endpoint port {e.get('port')} not on {name_of(s)}")
                    f.check(re.fullmatch(r"\d+s", e.get("interval", "")) is not None, f"{n}: no scrape interval")


def check_security(where: str, pod: dict, c: dict, f: lib.Failures) -> None:
    psc = pod.get("securityContext", {})
    sc = c.get("securityContext", {})
    f.check(sc.get("allowPrivilegeEscalation") is False, f"{where}: allowPrivilegeEscalation is not false")
    f.check(sc.get("readOnlyRootFilesystem") is True, f"{where}: readOnlyRootFilesystem is not true")
    f.check(sc.get("runAsNonRoot", psc.get("runAsNonRoot")) is True, f"{where}: runAsNonRoot is not true")
    uid = sc.get("runAsUser", psc.get("runAsUser"))
    f.check(isinstance(uid, int) and uid > 0, f"{where}: no non-zero runAsUser")
    f.check("ALL" in sc.get("capabilities", {}).get("drop", []), f"{where}: capabilities not dropped (ALL)")
    f.check(not sc.get("capabilities", {}).get("add"), f"{where}: adds capabilities")
    f.check(not sc.get("privileged", False), f"{where}: privileged")
    seccomp = sc.get("seccompProfile", psc.get("seccompProfile", {}))
    f.check(seccomp.get("type") == "RuntimeDefault", f"{where}: seccompProfile is not RuntimeDefault")


def check_image(where: str, image: str, f: lib.Failures) -> None:
    digest = "@sha256:" in image
    tag = image.rsplit("/", 1)[-1].partition(":")[2]
    f.check(digest or (tag and tag != "latest"), f"{where}: image {image} is not pinned to a tag or digest")


def probe_port(probe: dict, ports: dict[str, int]) -> int | None:
    for kind in ("httpGet", "tcpSocket", "grpc"):
        if kind in probe:
            p = probe[kind]["port"]
            return ports.get(p) if isinstance(p, str) else p
    return None


def check_flags(where: str, c: dict, helps: dict[str, str], f: lib.Failures) -> None:
    image = c["image"].split("@")[0].rsplit(":", 1)[0]
    binary = next((b for suffix, b in IMAGE_BINARY.items() if image.endswith(suffix)), None)
    if c.get("command"):
        return  # not the daemon (an init step)
    if not f.check(binary is not None, f"{where}: image {c['image']} runs no known binary"):
        return
    known = set(re.findall(r"(--[a-z][a-z0-9-]*)", helps[binary]))
    for arg in c.get("args", []):
        flag = arg.split("=", 1)[0]
        if flag.startswith("--"):
            f.check(flag in known, f"{where}: stemma-{binary} has no flag {flag} (see its --help)")


def policy(overlay: str, objs: list[dict], helps: dict[str, str], f: lib.Failures) -> None:
    want = OVERLAYS[overlay]
    by_kind: dict[str, list[dict]] = {}
    for o in objs:
        by_kind.setdefault(o["kind"], []).append(o)
    ov = f"overlays/{overlay}"

    # The coordinator: one StatefulSet with one replica, nothing else running it.
    coordinators = [o for o in objs if pod_spec(o) is not None and
                    pod_labels(o).get("app.kubernetes.io/component") == "coordinator"]
    f.check([o["kind"] for o in coordinators] == ["StatefulSet"],
            f"{ov}: the coordinator must be exactly one StatefulSet, found {[name_of(o) for o in coordinators]}")
    for o in coordinators:
        f.check(o["spec"].get("replicas") == 1, f"{ov}: {name_of(o)} replicas is not 1")
        f.check(o["spec"].get("updateStrategy", {}).get("type", "RollingUpdate") == "RollingUpdate"
                and o["spec"].get("podManagementPolicy", "OrderedReady") == "OrderedReady",
                f"{ov}: {name_of(o)} could run two coordinators during an update")
        claims = o["spec"].get("volumeClaimTemplates", [])
        f.check(len(claims) == 1 and claims[0]["spec"]["accessModes"] == want["db_access"],
                f"{ov}: database claim access modes {[c['spec']['accessModes'] for c in claims]}, want {want['db_access']}")
        mounts = {m["name"]: m["mountPath"] for m in pod_spec(o)["containers"][0]["volumeMounts"]}
        args = pod_spec(o)["containers"][0]["args"]
        f.check(claims and f"--data={mounts.get(claims[0]['metadata']['name'])}" in args,
                f"{ov}: the coordinator's --data is not on its volume claim")
        f.check(pod_spec(o).get("terminationGracePeriodSeconds", 30) >= 30,
                f"{ov}: the coordinator's termination grace is under 30 s")
        for pdb in by_kind.get("PodDisruptionBudget", []):
            f.check(not matches(pdb["spec"].get("selector", {}).get("matchLabels", {}), pod_labels(o)),
                    f"{ov}: {name_of(pdb)} covers the single coordinator and would block node drains")
    for pvc in by_kind.get("PersistentVolumeClaim", []):
        if pvc["metadata"]["name"] == "stemma-checkpoints":
            f.check(pvc["spec"]["accessModes"] == want["checkpoints"],
                    f"{ov}: checkpoint claim access modes {pvc['spec']['accessModes']}, want {want['checkpoints']}")

    generated = {(o["kind"], o["metadata"]["name"]) for o in objs if o["kind"] in ("ConfigMap", "Secret")}
    services = by_kind.get("Service", [])
    workloads = [o for o in objs if pod_spec(o) is not None]
    for o in workloads:
        pod = pod_spec(o)
        f.check(pod.get("automountServiceAccountToken") is False, f"{ov}: {name_of(o)} mounts an API token")
        f.check(not pod.get("hostNetwork") and not pod.get("hostPID") and not pod.get("hostIPC"),
                f"{ov}: {name_of(o)} shares a host namespace")
        for v in pod.get("volumes", []):
            f.check("hostPath" not in v, f"{ov}: {name_of(o)} mounts a hostPath")
            ref = (("ConfigMap", v["configMap"]["name"]) if "configMap" in v else
                   ("Secret", v["secret"]["secretName"]) if "secret" in v else None)
            if ref:
                f.check(ref in generated and re.search(r"-[a-z0-9]{10}$", ref[1]) is not None,
                        f"{ov}: {name_of(o)} uses {ref[0]} {ref[1]}, not a generated one")
        for c in pod.get("initContainers", []) + pod["containers"]:
            where = f"{ov}: {name_of(o)} container {c['name']}"
            check_security(where, pod, c, f)
            check_image(where, c["image"], f)
            check_flags(where, c, helps, f)
            f.check("memory" in c.get("resources", {}).get("requests", {}), f"{where}: no memory request")
            for src in c.get("envFrom", []):
                ref = ("ConfigMap", src["configMapRef"]["name"]) if "configMapRef" in src else ("Secret", src["secretRef"]["name"])
                f.check(ref in generated, f"{where}: envFrom {ref} is not generated")
            for e in c.get("env", []):
                k = e.get("valueFrom", {}).get("secretKeyRef")
                if k:
                    f.check(("Secret", k["name"]) in generated, f"{where}: env {e['name']} from a Secret not generated")
        for c in [c for c in pod["containers"] if is_daemon(c)]:
            where = f"{ov}: {name_of(o)} container {c['name']}"
            ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
            health = ports.get("health")
            f.check(health is not None, f"{where}: no container port named health")
            # The port the Services call `health` for this pod.
            for s in services:
                if matches(s["spec"].get("selector", {}), pod_labels(o)):
                    for p in s["spec"]["ports"]:
                        if p["name"] == "health":
                            t = p["targetPort"]
                            health = ports.get(t) if isinstance(t, str) else t
            for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
                probe = c.get(kind)
                if f.check(probe is not None, f"{where}: no {kind}"):
                    # The health port speaks grpc.health.v1 only: an httpGet or a bare TCP
                    # connect there would not check what the daemon says of itself.
                    f.check("grpc" in probe and health is not None and probe_port(probe, ports) == health,
                            f"{where}: {kind} is not a grpc probe on the health port ({health}): {probe}")
            f.check(health is not None and any(a.startswith("--health-listen=") and a.endswith(f":{health}")
                                               for a in c.get("args", [])),
                    f"{where}: the daemon does not serve health (--health-listen) on its 'health' port {health}")

    # Services: each selects pods, and each port's target is a port of those pods.
    for s in services:
        n = f"{ov}: {name_of(s)}"
        pods = [o for o in workloads if matches(s["spec"].get("selector", {}), pod_labels(o))]
        if not f.check(bool(pods), f"{n}: selects no pods"):
            continue
        for p in s["spec"]["ports"]:
            f.check(p.get("name") in ("grpc", "metrics", "health"), f"{n}: port {p.get('name')} is not grpc/metrics/health")
            t = p.get("targetPort", p["port"])
            for o in pods:
                cports = [cp for c in pod_spec(o)["containers"] for cp in c.get("ports", [])]
                f.check(any(cp["name"] == t or cp["containerPort"] == t for cp in cports),
                        f"{n}: port {p['name']} targets {t}, which {name_of(o)} does not declare")
    svc_ports = {s["metadata"]["name"]: sorted(p["name"] for p in s["spec"]["ports"]) for s in services}
    f.check(svc_ports.get("stemma-coordinator") == ["grpc", "health", "metrics"],
            f"{ov}: the coordinator Service's ports are {svc_ports.get('stemma-coordinator')}")
    f.check(svc_ports.get("stemma-worker") == ["health", "metrics"],
            f"{ov}: the worker Service's ports are {svc_ports.get('stemma-worker')}")
    for o in by_kind.get("StatefulSet", []):
        f.check(o["spec"]["serviceName"] in svc_ports, f"{ov}: {name_of(o)} serviceName names no Service")

    # TLS and tokens in clusters, --insecure only in dev; secret files reach the daemons
    # with mode 0600 through an init container and an in-memory volume.
    required = {"coordinator": ["--tls-cert", "--tls-key", "--tokens"], "worker": ["--ca", "--token-file"]}
    workers = workers_of(objs)
    for o in coordinators + workers:
        pod = pod_spec(o)
        c = pod["containers"][0]
        role = "coordinator" if o in coordinators else "worker"
        flags = flags_of(c)
        n = f"{ov}: {name_of(o)}"
        if not want["secure"]:
            f.check("--insecure" in flags and not any(k in flags for k in required[role]),
                    f"{n}: dev runs without TLS and tokens, and says so with --insecure")
            continue
        f.check("--insecure" not in flags, f"{n}: runs with --insecure")
        for k in required[role]:
            f.check(k in flags, f"{n}: no {k}")
        if role == "worker":
            continue  # a projected service-account token (kubernetes_workers.check_identity)
        secret_file = flags.get("--tokens" if role == "coordinator" else "--token-file", "")
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        mount = next((m for m in c["volumeMounts"] if secret_file.startswith(m["mountPath"] + "/")), None)
        if f.check(mount is not None, f"{n}: {secret_file} is on no volume"):
            vol = volumes[mount["name"]]
            f.check(vol.get("emptyDir", {}).get("medium") == "Memory", f"{n}: {secret_file} is not on an in-memory volume")
            copiers = [i for i in pod.get("initContainers", [])
                       if any(m["name"] == mount["name"] for m in i.get("volumeMounts", []))]
            f.check(len(copiers) == 1 and copiers[0]["command"][:3] == ["install", "-m", "0600"]
                    and copiers[0]["command"][-1] == secret_file,
                    f"{n}: no init container copies {secret_file} with mode 0600")
            if copiers:
                src_mount = next((m for m in copiers[0]["volumeMounts"]
                                  if copiers[0]["command"][-2].startswith(m["mountPath"] + "/")), None)
                f.check(src_mount is not None and "secret" in volumes.get(src_mount["name"], {}),
                        f"{n}: the init container does not copy from a Secret")

    # Workers: one StatefulSet per GPU pool, with distinct pod selectors.
    f.check([o["kind"] for o in workers] == ["StatefulSet"] * max(1, want["gpu_pools"]),
            f"{ov}: workers are {[name_of(o) for o in workers]}, expected one StatefulSet per pool")
    for a in workers:
        for b in workers:
            if a is not b:
                f.check(not matches(a["spec"]["selector"]["matchLabels"], pod_labels(b)),
                        f"{ov}: {name_of(a)}'s selector also matches {name_of(b)}'s pods")
    gpu_counts = []
    for o in workers:
        n = f"{ov}: {name_of(o)}"
        pod = pod_spec(o)
        f.check(matches(o["spec"]["selector"]["matchLabels"], pod_labels(o)), f"{n}: selector does not match its pods")
        c = pod["containers"][0]
        gpus = c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu")
        mounts = {m["mountPath"] for m in c.get("volumeMounts", [])}
        f.check("/checkpoints" in mounts and "--storage-root=/checkpoints" in c["args"],
                f"{n}: the shared checkpoint volume is not the worker's storage root")
        claims = [v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"] if "persistentVolumeClaim" in v]
        f.check(claims == ["stemma-checkpoints"], f"{n}: checkpoint volume claims {claims}")
        limit = c.get("resources", {}).get("limits", {}).get("memory")
        if limit is not None:
            units = {"Ki": 1 / 1024, "Mi": 1, "Gi": 1024, "Ti": 1024 * 1024}
            m = re.fullmatch(r"(\d+)(Ki|Mi|Gi|Ti)", str(limit))
            limit_mb = int(m.group(1)) * units[m.group(2)] if m else None
            offered = [int(a.split("=", 1)[1]) for a in c["args"] if a.startswith("--memory-mb=")]
            f.check(limit_mb is not None and len(offered) == 1 and 0 < offered[0] < limit_mb,
                    f"{n}: offers {offered} MiB with a memory limit of {limit}: jobs could OOM-kill the pod")
        if want["gpu_pools"]:
            if f.check(isinstance(gpus, int) and gpus > 0, f"{n}: no nvidia.com/gpu limit"):
                gpu_counts.append(gpus)
            f.check(c["resources"].get("requests", {}).get("nvidia.com/gpu") in (None, gpus),
                    f"{n}: GPU request differs from its limit")
            f.check({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod.get("tolerations", []),
                    f"{n}: no toleration for the device plugin's nvidia.com/gpu taint")
            ns = pod.get("nodeSelector", {})
            f.check(ns.get("nvidia.com/gpu.present") == "true", f"{n}: does not select GPU nodes")
            pool = pod_labels(o).get("stemma.dev/gpu-pool")
            f.check(pool is not None and o["spec"]["selector"]["matchLabels"].get("stemma.dev/gpu-pool") == pool,
                    f"{n}: pool label missing from pod labels or selector")
            f.check("--gpus" not in " ".join(c["args"]), f"{n}: declares fake GPUs on a GPU node")
        else:
            f.check(gpus is None and not pod.get("tolerations"), f"{n}: GPU resources in an overlay without GPUs")
    if want["gpu_pools"] > 1:
        f.check(len(set(gpu_counts)) == len(gpu_counts), f"{ov}: GPU pools do not differ in GPU count: {gpu_counts}")

    for ns in by_kind.get("Namespace", []):
        f.check(ns["metadata"].get("labels", {}).get("pod-security.kubernetes.io/enforce") == "restricted",
                f"{ov}: namespace {ns['metadata']['name']} does not enforce the restricted Pod Security Standard")
    kubernetes_workers.policy(ov, objs, want, f)


def planted_probe(overlay: str, objs: list[dict], helps: dict[str, str], f: lib.Failures) -> None:
    """The probe policy catches a worker probed on /metrics (what it was before it had a
    health port) and a worker without --health-listen."""
    for plant, want in [("http", "livenessProbe is not a grpc probe on the health port"),
                        ("flag", "does not serve health (--health-listen)")]:
        planted = copy.deepcopy(objs)
        worker = workers_of(planted)[0]
        c = pod_spec(worker)["containers"][0]
        if plant == "http":
            c["livenessProbe"] = {"httpGet": {"path": "/metrics", "port": "metrics"}}
        else:
            c["args"] = [a for a in c["args"] if not a.startswith("--health-listen=")]
        caught = lib.Failures(quiet=True)
        policy(overlay, planted, helps, caught)
        f.check(any(want in item for item in caught.items),
                f"overlays/{overlay}: the policy missed a planted {plant} violation ({want}): {caught.items}")


def lint(f: lib.Failures) -> None:
    dockerfiles = sorted((lib.DEPLOY / "images").glob("*Dockerfile"))
    f.check(len(dockerfiles) == 3, f"expected three container files, found {[p.name for p in dockerfiles]}")
    for p in dockerfiles:
        r = lib.run([lib.tool("hadolint"), "--failure-threshold", "warning", str(p)])
        f.check(r.returncode == 0, f"hadolint {p.name}:\n{r.stdout}{r.stderr}")
        for line in p.read_text().splitlines():
            m = re.match(r"FROM\s+(\S+)", line)
            if m and not m.group(1).startswith("$"):
                check_image(p.name, m.group(1), f)
    config = "{extends: default, rules: {line-length: disable, document-start: disable, truthy: {check-keys: false}, comments: {min-spaces-from-content: 1}, indentation: {indent-sequences: consistent}}}"
    files = [str(p) for p in sorted(lib.DEPLOY.rglob("*.yaml"))]
    r = lib.run([lib.tool("yamllint"), "-d", config, *files])
    f.check(r.returncode == 0, f"yamllint:\n{r.stdout}{r.stderr}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--coordinator", required=True)
    parser.add_argument("--worker", required=True)
    args = parser.parse_args()
    helps = {}
    for name, path in (("coordinator", args.coordinator), ("worker", args.worker)):
        r = lib.run([path, "--help"])
        if r.returncode != 0:
            raise SystemExit(f"{path} --help failed: {r.stderr}")
        helps[name] = r.stdout

    f = lib.Failures()
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = pathlib.Path(tmpdir)
        for overlay in OVERLAYS:
            objs = render(overlay, tmp, f)
            if not objs:
                continue
            print(f"overlays/{overlay}: {len(objs)} objects: "
                  + ", ".join(name_of(o) for o in objs), flush=True)
            validate(overlay, tmp, objs, f)
            # A changed setting must roll the pods: the generated ConfigMap's name, which the
            # pod templates reference, changes with its content.
            def edit(tree):
                env = tree / "components" / "config" / "stemma.env"
                env.write_text(env.read_text().replace("STEMMA_LOG_LEVEL=info", "STEMMA_LOG_LEVEL=debug"))
            def config_refs(objects):
                return sorted({src["configMapRef"]["name"] for o in objects if pod_spec(o) is not None
                               for c in pod_spec(o)["containers"] for src in c.get("envFrom", [])
                               if "configMapRef" in src})
            edited = render(overlay, tmp, f, edit)
            before, after = config_refs(objs), config_refs(edited)
            f.check(len(before) == 1 and len(after) == 1 and before != after,
                    f"overlays/{overlay}: a config change does not change what the pods reference ({before} -> {after})")
            check_crds(overlay, tmp, objs, f)
            policy(overlay, objs, helps, f)
            planted_probe(overlay, objs, helps, f)
            kubernetes_workers.check_scaling(f"overlays/{overlay}", tmp, objs, OVERLAYS[overlay], f)
            kubernetes_workers.planted(f"overlays/{overlay}", objs, OVERLAYS[overlay], f)
        # The cert-manager component in place of the certificate files.
        def with_cert_manager(tree):
            k = tree / "overlays" / "gpu-cluster" / "kustomization.yaml"
            doc = yaml.safe_load(k.read_text())
            doc["components"].append("../../components/cert-manager")
            doc["secretGenerator"] = [g for g in doc["secretGenerator"] if g["name"] != "stemma-coordinator-tls"]
            k.write_text(yaml.safe_dump(doc))
        objs = render("gpu-cluster", tmp, f, with_cert_manager)
        if objs:
            validate("gpu-cluster-cert-manager", tmp, objs, f)
            kubernetes_workers.check_cert_manager("overlays/gpu-cluster + cert-manager", objs, f)
        # The restore pod of the operator guide: valid, and as locked down as the rest.
        tools = sorted((lib.KUBERNETES / "tools").glob("*.yaml"))
        for path in tools:
            r = lib.run([lib.tool("kubernetes-validate"), "--strict", "--quiet", str(path)])
            f.check(r.returncode == 0, f"kubernetes-validate {path.name}:\n{r.stdout}{r.stderr}")
            for o in yaml.safe_load_all(path.read_text()):
                pod = pod_spec(o)
                if pod is None:
                    continue
                f.check(pod.get("automountServiceAccountToken") is False, f"{path.name}: mounts an API token")
                for c in pod["containers"]:
                    check_security(f"{path.name} container {c['name']}", pod, c, f)
                    check_image(path.name, c["image"], f)
                claims = [v["persistentVolumeClaim"]["claimName"] for v in pod.get("volumes", []) if "persistentVolumeClaim" in v]
                f.check(claims == ["data-stemma-coordinator-0"], f"{path.name}: claims {claims}, not the coordinator's database")
    lint(f)
    f.exit("kubernetes_test")


if __name__ == "__main__":
    main()
