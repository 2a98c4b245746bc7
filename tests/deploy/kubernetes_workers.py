"""Policy for what issue 24 added to the manifests, called by kubernetes_test.py for each
rendered overlay:

- worker pools: a StatefulSet per pool whose pods each request N GPUs, named by the pod
  (--name=$(POD_NAME)), covered by a PodDisruptionBudget of maxUnavailable 1, with a
  priorityClassName that exists; a preStop that waits for the drain container, which runs
  `stemma drain` with an admin token only it holds; a grace period covering the drain and
  --kill-grace-ms;
- identity: the worker's --token-file is a projected service-account token for audience
  stemma (rotated, a directory of its own); the coordinator reviews tokens
  (--k8s-token-review) and maps the workers' service account to the worker role; only the
  coordinator (system:auth-delegator) and the backup job (exec into the coordinator, nothing
  else) hold API tokens;
- network policies: every Stemma pod is selected; the coordinator admits gRPC from workers
  (and an ipBlock with the external-access component) and /metrics from a namespace; no rule
  admits everyone;
- backups: a CronJob that runs SQLite's online backup of the coordinator's --data database
  into a volume the coordinator mounts;
- scaling: a KEDA ScaledObject per pool targeting its StatefulSet (which leaves replicas to
  it), whose PromQL passes promtool, reads stemma_scheduler_queued_gpus for the GPU sizes the
  pool's pods can hold (pools disjoint, every size up to the largest pod covered) and whose
  threshold is the pod's GPU count;
- runbooks: every alert's runbook_url under the overlay's runbooks.yaml base;
- cert-manager: the component's Certificate writes the Secret the coordinator mounts, names
  the coordinator's Service, and is issued by an Issuer of the render.
"""
from __future__ import annotations

import pathlib
import re

import yaml

import deploylib as lib
from k8slib import flags_of, matches, name_of, pod_labels, pod_spec, workers_of

GPU_SIZES = ["1", "2", "4", "8", "16", "32", "more"]  # coordinator/demand_gauges.h


def projected_tokens(pod: dict) -> dict[str, dict]:
    """volume name -> its serviceAccountToken source, for projected token volumes."""
    out = {}
    for v in pod.get("volumes", []):
        for src in v.get("projected", {}).get("sources", []):
            if "serviceAccountToken" in src:
                out[v["name"]] = src["serviceAccountToken"]
    return out


def mount_of(c: dict, path: str) -> dict | None:
    return next((m for m in c.get("volumeMounts", []) if path.startswith(m["mountPath"] + "/")), None)


def check_pools(ov: str, objs: list[dict], want: dict, f: lib.Failures) -> None:
    pdbs = [o for o in objs if o["kind"] == "PodDisruptionBudget"]
    classes = {o["metadata"]["name"] for o in objs if o["kind"] == "PriorityClass"}
    generated = {o["metadata"]["name"] for o in objs if o["kind"] == "Secret"}
    for o in workers_of(objs):
        n = f"{ov}: {name_of(o)}"
        pod = pod_spec(o)
        covering = [p for p in pdbs if matches(p["spec"]["selector"].get("matchLabels", {}), pod_labels(o))]
        f.check(len(covering) == 1 and covering[0]["spec"].get("maxUnavailable") == 1,
                f"{n}: wants exactly one PodDisruptionBudget with maxUnavailable 1, has {[name_of(p) for p in covering]}")
        f.check(pod.get("priorityClassName") in classes, f"{n}: priorityClassName {pod.get('priorityClassName')} is no PriorityClass here")
        containers = {c["name"]: c for c in pod["containers"]}
        worker, drain = containers.get("worker"), containers.get("drain")
        if not f.check(worker is not None and drain is not None, f"{n}: wants containers worker and drain"):
            continue
        flags = flags_of(worker)
        f.check(flags.get("--name") == "$(POD_NAME)" and any(
            e["name"] == "POD_NAME" and e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "metadata.name"
            for e in worker.get("env", [])), f"{n}: the worker is not named after its pod")
        grace_ms = int(flags.get("--kill-grace-ms", "10000"))
        f.check(pod.get("terminationGracePeriodSeconds", 30) >= grace_ms / 1000 + 30,
                f"{n}: terminationGracePeriodSeconds {pod.get('terminationGracePeriodSeconds')} does not cover the drain "
                f"(30 s) and --kill-grace-ms {grace_ms}")
        # The drain: its preStop drains and leaves a file in a shared volume; the worker's
        # preStop waits for that file.
        drain_cmd = " ".join(drain.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", []))
        worker_cmd = " ".join(worker.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", []))
        m = re.search(r"touch (\S+)", drain_cmd)
        f.check('stemma drain "$POD_NAME"' in drain_cmd and m is not None, f"{n}: the drain container's preStop does not drain: {drain_cmd!r}")
        if m:
            flag = m.group(1)
            f.check(flag in worker_cmd, f"{n}: the worker's preStop does not wait for {flag}: {worker_cmd!r}")
            wm, dm = mount_of(worker, flag), mount_of(drain, flag)
            f.check(wm is not None and dm is not None and wm["name"] == dm["name"],
                    f"{n}: {flag} is not on a volume both containers mount")
        token_env = [e for e in drain.get("env", []) if e["name"] == "STEMMA_TOKEN"]
        f.check(not any(e["name"] == "STEMMA_TOKEN" for e in worker.get("env", [])),
                f"{n}: the worker container holds the drain token (its jobs could read it)")
        if want["secure"]:
            ref = token_env[0].get("valueFrom", {}).get("secretKeyRef", {}) if token_env else {}
            f.check(ref.get("name") in generated, f"{n}: the drain container's STEMMA_TOKEN is not from a generated Secret")


def check_identity(ov: str, objs: list[dict], want: dict, f: lib.Failures) -> None:
    coordinators = [o for o in objs if pod_spec(o) is not None and
                    pod_labels(o).get("app.kubernetes.io/component") == "coordinator"]
    worker_accounts = set()
    for o in workers_of(objs):
        n = f"{ov}: {name_of(o)}"
        pod = pod_spec(o)
        worker_accounts.add(pod.get("serviceAccountName"))
        tokens = projected_tokens(pod)
        f.check(all(t.get("audience") == "stemma" for t in tokens.values()),
                f"{n}: a projected token not for audience stemma (an API token): {tokens}")
        if not want["secure"]:
            continue
        # The kubelet makes a projected token 0640 under an fsGroup, 0600 for the pod's one
        # user without (kubernetes#89193); the worker refuses a token its group may read.
        psc = pod.get("securityContext", {})
        f.check("fsGroup" not in psc and all("runAsUser" not in c.get("securityContext", {})
                                             for c in pod["containers"] + pod.get("initContainers", [])),
                f"{n}: an fsGroup, or containers running as different users, make the token group-readable")
        c = pod["containers"][0]
        path = flags_of(c).get("--token-file", "")
        m = mount_of(c, path)
        if f.check(m is not None and m["name"] in tokens, f"{n}: --token-file {path} is not a projected service-account token"):
            f.check(m.get("readOnly") is True and path == m["mountPath"] + "/" + tokens[m["name"]]["path"],
                    f"{n}: the token's directory must hold only the token, read-only")
            f.check(1 <= tokens[m["name"]].get("expirationSeconds", 3600) <= 86400, f"{n}: token lifetime out of range")
    f.check(len(worker_accounts) == 1, f"{ov}: workers run as {sorted(map(str, worker_accounts))}, expected one account")
    for o in coordinators:
        n = f"{ov}: {name_of(o)}"
        flags = flags_of(pod_spec(o)["containers"][0])
        if not want["secure"]:
            f.check("--k8s-token-review" not in flags, f"{n}: reviews tokens without authentication")
            continue
        f.check(flags.get("--k8s-token-review", "").startswith("https://"), f"{n}: no --k8s-token-review https URL")
        roles = [a.split("=", 1)[1] for a in pod_spec(o)["containers"][0]["args"] if a.startswith("--k8s-role=")]
        f.check([r.split("/", 1)[1] for r in roles] == [f"{a}=worker" for a in worker_accounts],
                f"{n}: --k8s-role {roles} does not give the workers' account {worker_accounts} the worker role")
    # Who holds API tokens: the coordinator (TokenReview) and the backup job (exec).
    for o in objs:
        pod = pod_spec(o)
        if pod is None:
            continue
        api = [v for v, t in projected_tokens(pod).items() if "audience" not in t]
        component = pod_labels(o).get("app.kubernetes.io/component")
        f.check(not api or component in ("coordinator", "backup"), f"{ov}: {name_of(o)} holds an API token")
    for b in [o for o in objs if o["kind"] in ("ClusterRoleBinding", "RoleBinding")]:
        subjects = [s["name"] for s in b.get("subjects", [])]
        role = b["roleRef"]["name"]
        f.check((role, subjects) in [("system:auth-delegator", ["stemma-coordinator"]), ("stemma-backup", ["stemma-backup"])],
                f"{ov}: {name_of(b)} binds {role} to {subjects}")
    for r in [o for o in objs if o["kind"] in ("Role", "ClusterRole")]:
        rules = [(tuple(x["resources"]), tuple(x.get("resourceNames", [])), tuple(x["verbs"])) for x in r["rules"]]
        f.check(rules == [(("pods",), ("stemma-coordinator-0",), ("get",)),
                          (("pods/exec",), ("stemma-coordinator-0",), ("create",))],
                f"{ov}: {name_of(r)} grants more than exec into the coordinator: {rules}")


def check_network(ov: str, objs: list[dict], f: lib.Failures) -> None:
    policies = [o for o in objs if o["kind"] == "NetworkPolicy"]
    pods = [o for o in objs if pod_spec(o) is not None and
            pod_labels(o).get("app.kubernetes.io/component") in ("coordinator", "worker")]
    for o in pods:
        f.check(any(matches(p["spec"]["podSelector"].get("matchLabels", {}), pod_labels(o)) for p in policies),
                f"{ov}: no NetworkPolicy selects {name_of(o)}")
    for p in policies:
        n = f"{ov}: {name_of(p)}"
        f.check(p["spec"].get("policyTypes") == ["Ingress"], f"{n}: policyTypes is not [Ingress]")
        selected = [o for o in pods if matches(p["spec"]["podSelector"].get("matchLabels", {}), pod_labels(o))]
        f.check(bool(selected), f"{n}: selects no Stemma pod")
        component = pod_labels(selected[0]).get("app.kubernetes.io/component") if selected else None
        for rule in p["spec"].get("ingress", []):
            f.check(bool(rule.get("from")), f"{n}: a rule admits every source")
            ports = {q["port"] for q in rule.get("ports", [])}
            for src in rule.get("from", []):
                if "podSelector" in src:
                    peer = src["podSelector"].get("matchLabels", {}).get("app.kubernetes.io/component")
                    ok = peer == "worker" and (component == "worker" or ports == {"grpc"})
                    f.check(ok, f"{n}: admits pods {src['podSelector']} on {sorted(ports) or 'every port'}")
                elif "namespaceSelector" in src:
                    f.check(ports == {"metrics"}, f"{n}: admits a namespace on {sorted(ports) or 'every port'}")
                elif "ipBlock" in src:
                    f.check(component == "coordinator" and ports == {"grpc"} and src["ipBlock"]["cidr"] != "0.0.0.0/0",
                            f"{n}: admits {src['ipBlock']} on {sorted(ports) or 'every port'}")
                else:
                    f.check(False, f"{n}: unknown source {src}")


def check_backup(ov: str, objs: list[dict], f: lib.Failures) -> None:
    jobs = [o for o in objs if o["kind"] == "CronJob"]
    coordinator = next((o for o in objs if o["kind"] == "StatefulSet" and
                        pod_labels(o).get("app.kubernetes.io/component") == "coordinator"), None)
    if not f.check(len(jobs) == 1 and coordinator is not None, f"{ov}: wants one backup CronJob, has {len(jobs)}"):
        return
    job, cpod = jobs[0], pod_spec(coordinator)
    f.check(job["spec"].get("concurrencyPolicy") == "Forbid", f"{ov}: backups may overlap")
    c = pod_spec(job)["containers"][0]
    script = " ".join(c.get("args", []))
    data = flags_of(cpod["containers"][0]).get("--data", "")
    f.check(c.get("command") == ["kubectl"] and "exec stemma-coordinator-0 --container=coordinator" in script,
            f"{ov}: the backup does not run in the coordinator's container")
    f.check(f"sqlite3 {data}/stemma.db \".backup" in script and "PRAGMA integrity_check" in script,
            f"{ov}: the backup is not SQLite's online backup of {data}/stemma.db, checked: {script}")
    d = re.search(r"dir=(\S+?);", script)
    mounts = {m["mountPath"]: m["name"] for m in cpod["containers"][0]["volumeMounts"]}
    vols = {v["name"]: v for v in cpod["volumes"]}
    if f.check(d is not None and d.group(1) in mounts, f"{ov}: the backup directory is not a coordinator mount"):
        vol = vols[mounts[d.group(1)]]
        claim = vol.get("persistentVolumeClaim", {}).get("claimName")
        f.check(claim is not None and claim != "stemma-checkpoints", f"{ov}: backups are not on a volume of their own")


def check_runbooks(ov: str, objs: list[dict], f: lib.Failures) -> None:
    local = lib.KUBERNETES / "overlays" / ov.split("/", 1)[-1] / "runbooks.yaml"
    base = yaml.safe_load(local.read_text())["data"]["baseUrl"] if local.exists() else "https://stemma.example.com/docs"
    for rule in [o for o in objs if o["kind"] == "PrometheusRule"]:
        for g in rule["spec"]["groups"]:
            for r in g["rules"]:
                if "alert" in r:
                    url = r["annotations"]["runbook_url"]
                    f.check(url == f"{base}/runbooks/{r['alert']}.md", f"{ov}: {r['alert']} runbook_url {url}, not under {base}")


def policy(ov: str, objs: list[dict], want: dict, f: lib.Failures) -> None:
    check_pools(ov, objs, want, f)
    check_identity(ov, objs, want, f)
    check_network(ov, objs, f)
    check_backup(ov, objs, f)
    check_runbooks(ov, objs, f)


def check_scaling(ov: str, tmp: pathlib.Path, objs: list[dict], want: dict, f: lib.Failures) -> None:
    scaled = [o for o in objs if o["kind"] == "ScaledObject"]
    workers = {o["metadata"]["name"]: o for o in workers_of(objs)}
    f.check(len(scaled) == (len(workers) if want["gpu_pools"] else 0),
            f"{ov}: {len(scaled)} ScaledObjects for {len(workers)} pools")
    served: dict[str, str] = {}
    largest = 0
    for s in scaled:
        n = f"{ov}: {name_of(s)}"
        spec = s["spec"]
        f.check(set(spec) <= {"scaleTargetRef", "minReplicaCount", "maxReplicaCount", "pollingInterval",
                              "cooldownPeriod", "advanced", "triggers", "fallback"}, f"{n}: unknown fields {sorted(spec)}")
        target = workers.get(spec["scaleTargetRef"].get("name"))
        if not f.check(target is not None and spec["scaleTargetRef"].get("kind") == "StatefulSet",
                       f"{n}: scaleTargetRef {spec['scaleTargetRef']} is no worker StatefulSet"):
            continue
        f.check("replicas" not in target["spec"], f"{n}: {name_of(target)} sets replicas, which an apply would reset")
        f.check(0 <= spec.get("minReplicaCount", 0) <= spec.get("maxReplicaCount", 100),
                f"{n}: minReplicaCount above maxReplicaCount")
        gpus = pod_spec(target)["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]
        largest = max(largest, gpus)
        for t in spec["triggers"]:
            md = t["metadata"]
            f.check(t["type"] == "prometheus" and t.get("metricType") == "AverageValue" and md["threshold"] == str(gpus),
                    f"{n}: wants a prometheus trigger with AverageValue threshold {gpus} (GPUs per pod): {t}")
            query = md["query"]
            rules = tmp / f"{ov.replace('/', '-')}-{s['metadata']['name']}-query.yaml"
            rules.write_text(yaml.safe_dump({"groups": [{"name": "q", "rules": [{"record": "stemma:q", "expr": query}]}]}))
            r = lib.run([lib.tool("promtool"), "check", "rules", str(rules)])
            f.check(r.returncode == 0, f"{n}: promtool does not accept its query:\n{r.stdout}{r.stderr}")
            sizes = re.search(r'stemma_scheduler_queued_gpus\{[^}]*per_node=~"([^"]+)"', query)
            if f.check(sizes is not None, f"{n}: the query does not read stemma_scheduler_queued_gpus{{per_node=~...}}"):
                for size in sizes.group(1).split("|"):
                    f.check(size in GPU_SIZES and size != "more" and int(size) <= gpus,
                            f"{n}: serves jobs of {size} GPUs per node with pods of {gpus}")
                    f.check(size not in served, f"{n}: size {size} also served by {served.get(size)}")
                    served[size] = s["metadata"]["name"]
            f.check(f'pod=~"{target["metadata"]["name"]}-[0-9]+"' in query, f"{n}: does not count the GPUs its own pods use")
    if scaled:
        wanted = [s for s in GPU_SIZES if s != "more" and int(s) <= largest]
        f.check(sorted(served, key=int) == wanted, f"{ov}: sizes served {sorted(served)}, want {wanted}")


def check_cert_manager(ov: str, objs: list[dict], f: lib.Failures) -> None:
    certs = {o["metadata"]["name"]: o for o in objs if o["kind"] == "Certificate"}
    issuers = {o["metadata"]["name"] for o in objs if o["kind"] == "Issuer"}
    coordinator = next(o for o in objs if o["kind"] == "StatefulSet" and
                       pod_labels(o).get("app.kubernetes.io/component") == "coordinator")
    pod = pod_spec(coordinator)
    cert_path = flags_of(pod["containers"][0]).get("--tls-cert", "")
    m = mount_of(pod["containers"][0], cert_path)
    secret = next((v["secret"]["secretName"] for v in pod["volumes"] if m and v["name"] == m["name"] and "secret" in v), None)
    serving = [c for c in certs.values() if c["spec"]["secretName"] == secret]
    if not f.check(len(serving) == 1, f"{ov}: no Certificate writes the coordinator's TLS Secret {secret}"):
        return
    spec = serving[0]["spec"]
    ns = coordinator["metadata"].get("namespace", "default")
    for name in ("stemma-coordinator", f"stemma-coordinator.{ns}.svc"):
        f.check(name in spec.get("dnsNames", []), f"{ov}: the coordinator's certificate does not name {name}")
    f.check("server auth" in spec.get("usages", ["server auth"]), f"{ov}: the certificate is not for server auth")
    for c in certs.values():
        f.check(c["spec"]["issuerRef"]["name"] in issuers, f"{ov}: {name_of(c)} names an Issuer that is not here")
    f.check(set(cert_path.rsplit("/", 1)[-1:]) == {"tls.crt"}, f"{ov}: --tls-cert is not the Secret's tls.crt")


def planted(ov: str, objs: list[dict], want: dict, f: lib.Failures) -> None:
    """The checks above can fail: a worker whose preStop no longer waits for the drain, a
    network rule open to everyone, and a worker pod given an API token are each caught."""
    import copy

    def no_wait(o):
        for w in workers_of(o)[:1]:
            pod_spec(w)["containers"][0].pop("lifecycle", None)

    def open_rule(o):
        for p in [x for x in o if x["kind"] == "NetworkPolicy"][:1]:
            p["spec"]["ingress"].append({"ports": [{"port": "grpc"}]})

    def api_token(o):
        for w in workers_of(o)[:1]:
            pod_spec(w)["volumes"].append({"name": "api", "projected": {"sources": [
                {"serviceAccountToken": {"path": "token"}}]}})

    for plant, expect in [(no_wait, "preStop does not wait"), (open_rule, "admits every source"),
                          (api_token, "an API token")]:
        copied = copy.deepcopy(objs)
        plant(copied)
        caught = lib.Failures(quiet=True)
        policy(ov, copied, want, caught)
        f.check(any(expect in item for item in caught.items),
                f"{ov}: the policy missed a planted violation ({expect}): {caught.items}")
