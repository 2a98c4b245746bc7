#!/usr/bin/env python3
"""A real Prometheus (Debian's) on loopback scraping a real coordinator and two workers:

- `promtool check metrics` passes on each daemon's /metrics;
- both daemons run as the gpu-cluster overlay runs them: TLS and tokens (a CA, certificate
  and tokens made as docs/operator-guide.md says), a token per worker;
- the coordinator's and each worker's health port answers grpc.health.v1 SERVING and nothing
  else;
- every target is up and every rule (a test copy of the alert rules with `for` cut to a few
  seconds) evaluates without error;
- the series the dashboards and alerts were missing are there after a small run: RPC codes
  (a NOT_FOUND and a refused token counted from their first call), store commit errors (0),
  checkpoints registered (an exec job that publishes one), certificate expiry equal to each
  file's notAfter and following a renewed file, and, with stemma-engine (beside the binaries
  or --engine), the eval scores of a small study (init, tokenize, train, eval) as they land;
- after a few waves of noop jobs (one of which fails), every query of every dashboard,
  with its variables filled in as Grafana would ("All", one coordinator, one worker), runs
  through /api/v1/query_range without error, and every panel that should have data has
  some (the generator's `needs` names the panels that cannot yet);
- each dashboard is drawn to a PNG from the same query results (OUT/<uid>.png), for a
  person to look at: Grafana itself cannot be installed here;
- a worker killed with SIGKILL makes StemmaWorkerDown go pending, then firing, for that
  worker only.

    prometheus_live_test.py --bin-dir DIR --out DIR [--engine PATH]
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import math
import re
import pathlib
import shutil
import signal
import sys
import tempfile
import time

import yaml

import deploylib as lib

sys.path.insert(0, str(lib.DEPLOY))
import generate  # noqa: E402  (the dashboards' source: which panels need what)

SCRAPE_S = 1
RATE_INTERVAL = f"{4 * SCRAPE_S}s"  # Grafana: max(4 x scrape interval, interval + scrape)
TEST_FOR = "3s"


def needs_by_panel() -> dict[tuple[str, str], str | None]:
    return {(d.uid, p.title): p.needs for d in generate.DASHBOARDS for r in d.rows for p in r.panels}


def has_data(result: list[dict]) -> bool:
    return any(not math.isnan(float(v)) for s in result for _, v in s.get("values", []))


def legend(fmt: str, labels: dict) -> str:
    out = fmt
    for k, v in labels.items():
        out = out.replace("{{" + k + "}}", v)
    return out or json.dumps(labels)


def render(dashboard: dict, results: dict[int, list[tuple[dict, list[dict]]]], needs, path: pathlib.Path,
           title_suffix: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    rows = [p for p in dashboard["panels"] if p["type"] == "row"]
    height = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in dashboard["panels"])
    fig = plt.figure(figsize=(24, height * 0.42))
    fig.suptitle(f"{dashboard['title']} ({title_suffix})", fontsize=16, y=0.995)
    unit_scale = {"percentunit": 100}

    def box(g):  # gridPos -> figure coordinates, with a margin (in grid units: tall dashboards too)
        return [g["x"] / 24 + 0.012, 1 - (g["y"] + g["h"] - 1.2) / height,
                g["w"] / 24 - 0.024, (g["h"] - 2.7) / height]

    for r in rows:
        g = r["gridPos"]
        fig.text(0.005, 1 - (g["y"] + 0.6) / height, r["title"], fontsize=13, weight="bold")
    for p in panels:
        ax = fig.add_axes(box(p["gridPos"]))
        ax.set_title(p["title"], fontsize=10, loc="left")
        series = results.get(p["id"], [])
        unit = p["fieldConfig"]["defaults"].get("unit", "short")
        scale = unit_scale.get(unit, 1)
        if not any(has_data(res) for _, res in series):
            ax.set_xticks([]); ax.set_yticks([])
            why = needs.get((dashboard["uid"], p["title"]))
            ax.text(0.5, 0.5, "No data" + (f"\n(until {why})" if why else ""), ha="center", va="center",
                    fontsize=8, wrap=True, color="gray", transform=ax.transAxes)
            continue
        if p["type"] == "stat":
            ax.set_xticks([]); ax.set_yticks([])
            texts = []
            for target, res in series:
                for s in res:
                    vals = [float(v) for _, v in s["values"] if not math.isnan(float(v))]
                    if vals:
                        v = vals[-1] * scale
                        texts.append(f"{legend(target['legendFormat'], s['metric'])}: "
                                     + (f"{v:.1f}%" if unit == "percentunit" else f"{v:g}"))
            ax.text(0.5, 0.5, "\n".join(texts), ha="center", va="center", fontsize=14, transform=ax.transAxes)
            continue
        t0 = None
        for target, res in series:
            for s in res:
                xs = [float(t) for t, _ in s["values"]]
                t0 = xs[0] if t0 is None else min(t0, xs[0])
        for target, res in series:
            for s in res:
                xs = [float(t) - t0 for t, _ in s["values"]]
                ys = [float(v) * scale for _, v in s["values"]]
                ax.plot(xs, ys, label=legend(target["legendFormat"], s["metric"]), linewidth=1)
        ax.tick_params(labelsize=7)
        ax.set_xlabel("seconds", fontsize=7)
        ax.set_ylabel({"s": "seconds", "percentunit": "%", "ops": "per second", "reqps": "requests/s"}.get(unit, ""),
                      fontsize=7)
        handles, labels = ax.get_legend_handles_labels()
        if labels:
            ax.legend(fontsize=6, loc="upper left", ncol=2 if len(labels) > 4 else 1)
    fig.savefig(path, dpi=60)
    plt.close(fig)


def check_health(address: str, f: lib.Failures) -> None:
    """What kubelet's grpc probe asks (grpc.health.v1 Check, service ""), and that the health
    port serves nothing else (it is plaintext and unauthenticated)."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        status = None
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=2).status
                break
            except grpc.RpcError as e:
                status = e.code()
                time.sleep(0.2)
        f.check(status == health_pb2.HealthCheckResponse.SERVING, f"health Check on {address}: {status}")
        try:
            channel.unary_unary("/stemma.v1.UserService/ListJobs")(b"", timeout=2)
            code = grpc.StatusCode.OK
        except grpc.RpcError as e:
            code = e.code()
        f.check(code == grpc.StatusCode.UNIMPLEMENTED, f"the health port answers UserService.ListJobs with {code}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin-dir", required=True)
    parser.add_argument("--out", required=True, help="where the dashboard PNGs go")
    parser.add_argument("--engine", default="", help="stemma-engine (default: beside the binaries; "
                                                     "without one the eval part is skipped)")
    args = parser.parse_args()
    bin_dir = pathlib.Path(args.bin_dir)
    engine = pathlib.Path(args.engine) if args.engine else bin_dir / "stemma-engine"
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    f = lib.Failures()
    procs = lib.Processes()
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="stemma-prometheus-"))
    # Everything it starts, the CLI included, has the test's own HOME and none of the
    # developer's STEMMA_* settings: no ~/.config/stemma of theirs reaches it, none is written.
    os.environ["HOME"] = str(tmp)
    for name in ("STEMMA_CONFIG", "STEMMA_COORDINATOR", "STEMMA_CA", "STEMMA_TOKEN", "STEMMA_TOKEN_FILE"):
        os.environ.pop(name, None)
    try:
        run(bin_dir, engine if engine.exists() else None, out, tmp, procs, f)
    finally:
        procs.stop_all()
    if f.items:
        print(f"kept {tmp} (daemon and Prometheus logs)", flush=True)
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    f.exit("prometheus_live_test")


def credentials(bin_dir: pathlib.Path, tmp: pathlib.Path, workers: list[str]) -> dict[str, pathlib.Path]:
    """A CA, the coordinator's certificate and tokens, made as docs/operator-guide.md says."""
    d = tmp / "secrets"
    d.mkdir()
    openssl = ["openssl"]
    steps = [
        ["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "30",
         "-subj", "/CN=stemma-ca", "-keyout", "ca.key", "-out", "ca.crt"],
        ["req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj", "/CN=stemma-coordinator",
         "-keyout", "tls.key", "-out", "tls.csr"],
        ["x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-days", "30",
         "-extfile", "san.ext", "-out", "tls.crt"],
    ]
    (d / "san.ext").write_text("subjectAltName=DNS:stemma-coordinator,DNS:localhost,IP:127.0.0.1\n")
    for step in steps:
        r = lib.run(openssl + step, cwd=d)
        if r.returncode != 0:
            raise SystemExit(f"openssl {step[0]}: {r.stderr}")
    files = {"ca": d / "ca.crt", "cert": d / "tls.crt", "key": d / "tls.key", "tokens": d / "tokens"}
    for role, subject in [("admin", "operator")] + [("worker", w) for w in workers]:
        r = lib.run([str(bin_dir / "stemma"), "token", "create", "--role", role, "--subject", subject,
                     "--file", str(files["tokens"])])
        if r.returncode != 0:
            raise SystemExit(f"stemma token create: {r.stderr}")
        path = d / f"{subject}.token"
        path.write_text(r.stdout.strip() + "\n")
        path.chmod(0o600)
        files[subject] = path
    bad = d / "bad.token"
    bad.write_text("stm_not-a-token\n")
    bad.chmod(0o600)
    files["bad"] = bad
    return files


def not_after(cert: pathlib.Path) -> float:
    """The certificate's notAfter as Unix seconds, as openssl reads it."""
    r = lib.run(["openssl", "x509", "-noout", "-enddate", "-in", str(cert)])
    when = datetime.datetime.strptime(r.stdout.strip().split("=", 1)[1], "%b %d %H:%M:%S %Y %Z")
    return when.replace(tzinfo=datetime.timezone.utc).timestamp()


def instant(base: str, query: str) -> list[dict]:
    a = lib.prom_api(base, "query", query=query)
    return a.get("data", {}).get("result", []) if a.get("status") == "success" else []


def values(base: str, query: str) -> list[float]:
    return [float(s["value"][1]) for s in instant(base, query)]


# A small study on the real engine: a random tiny model, a tokenized text, two training steps,
# a perplexity eval (tests/integration/experiments_test.cc runs the same).
STUDY = """name: live-study
stages:
  base:
    init: {arch: llama, preset: tiny, seed: 3}
  tok:
    needs: [base]
    tokenize: {tokenizer: "${{ needs.base.outputs.model }}", input: [en.txt], format: text, line_docs: true, language: en}
  cpt:
    needs: [base, tok]
    train:
      model: "${{ needs.base.outputs.model }}"
      data: {datasets: [{path: "${{ needs.tok.outputs.dataset }}"}], seq_len: 16, heldout_fraction: 0.2}
      batch_size: 2
      steps: 2
  eval:
    needs: [cpt, tok]
    eval:
      model: "${{ needs.cpt.outputs.model }}"
      tasks: [{type: perplexity, language: en, data: "${{ needs.tok.outputs.dataset }}", heldout_fraction: 0.2, limit: 4}]
"""
STUDY_JOBS = 4


def run(bin_dir: pathlib.Path, engine: pathlib.Path | None, out: pathlib.Path, tmp: pathlib.Path,
        procs: lib.Processes, f: lib.Failures) -> None:
    grpc, cmetrics, chealth, prom = (lib.free_port() for _ in range(4))
    wmetrics = [lib.free_port() for _ in range(2)]
    whealth = [lib.free_port() for _ in range(2)]
    store = tmp / "store"  # the workers' storage root (the study's files, the checkpoint job's)
    store.mkdir()
    # As the gpu-cluster overlay runs them: TLS and tokens, a token per worker.
    secure = "--tokens" in lib.run([str(bin_dir / "stemma-coordinator"), "--help"]).stdout
    cred = credentials(bin_dir, tmp, ["w0", "w1"]) if secure else {}
    coordinator_cmd = [str(bin_dir / "stemma-coordinator"), f"--data={tmp}/coordinator",
                       f"--listen=127.0.0.1:{grpc}", f"--metrics-listen=127.0.0.1:{cmetrics}",
                       "--lease-ms=3000", "--heartbeat-ms=500"]
    if secure:
        coordinator_cmd += [f"--tls-cert={cred['cert']}", f"--tls-key={cred['key']}", f"--tokens={cred['tokens']}"]
    health = "--health-listen" in lib.run([coordinator_cmd[0], "--help"]).stdout
    if health:
        coordinator_cmd.append(f"--health-listen=127.0.0.1:{chealth}")
    coordinator = procs.start(coordinator_cmd, tmp / "coordinator.log")
    lib.wait_http(f"http://127.0.0.1:{cmetrics}/metrics", 20, coordinator)
    if health:
        check_health(f"127.0.0.1:{chealth}", f)
    workers = []
    worker_health = "--health-listen" in lib.run([str(bin_dir / "stemma-worker"), "--help"]).stdout
    f.check(worker_health, "stemma-worker has no --health-listen")
    # The workers find stemma-engine beside themselves, else on PATH.
    env = dict(os.environ)
    if engine is not None and engine.parent != bin_dir:
        env["PATH"] = f"{engine.parent}:{env.get('PATH', '/usr/bin:/bin')}"
    for i, port in enumerate(wmetrics):
        w = procs.start([str(bin_dir / "stemma-worker"), f"--coordinator=127.0.0.1:{grpc}",
                         f"--data={tmp}/w{i}", f"--name=w{i}", "--gpus=2", "--cpus=4", "--memory-mb=8192",
                         "--allow-exec", f"--storage-root={store}",
                         f"--metrics-listen=127.0.0.1:{port}"]
                        + ([f"--health-listen=127.0.0.1:{whealth[i]}"] if worker_health else [])
                        + ([f"--ca={cred['ca']}", f"--token-file={cred[f'w{i}']}"] if secure else []),
                        tmp / f"w{i}.log", env=env)
        lib.wait_http(f"http://127.0.0.1:{port}/metrics", 20, w)
        if worker_health:
            check_health(f"127.0.0.1:{whealth[i]}", f)
        workers.append(w)

    # The test's copy of the rules: the same expressions, `for` cut to seconds.
    rules = yaml.safe_load(lib.RULES.read_text())
    for g in rules["groups"]:
        for rule in g["rules"]:
            if "for" in rule:
                rule["for"] = TEST_FOR
    (tmp / "rules.yaml").write_text(yaml.safe_dump(rules))
    config = {
        "global": {"scrape_interval": f"{SCRAPE_S}s", "scrape_timeout": f"{SCRAPE_S}s",
                   "evaluation_interval": f"{SCRAPE_S}s"},
        "rule_files": [str(tmp / "rules.yaml")],
        "scrape_configs": [
            {"job_name": "stemma-coordinator", "static_configs": [{"targets": [f"127.0.0.1:{cmetrics}"]}]},
            {"job_name": "stemma-worker", "static_configs": [{"targets": [f"127.0.0.1:{p}" for p in wmetrics]}]},
        ],
    }
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    r = lib.run([lib.tool("promtool"), "check", "config", str(tmp / "prometheus.yml")])
    f.check(r.returncode == 0, f"promtool check config:\n{r.stdout}{r.stderr}")
    prometheus = procs.start([lib.tool("prometheus"), f"--config.file={tmp}/prometheus.yml",
                              f"--storage.tsdb.path={tmp}/tsdb", f"--web.listen-address=127.0.0.1:{prom}",
                              "--storage.tsdb.retention.time=1h"], tmp / "prometheus.log")
    base = f"http://127.0.0.1:{prom}"
    lib.wait_http(f"{base}/-/ready", 30, prometheus)
    t_start = time.time()
    # Ready is not scraping: static targets reach the scrape loop through service
    # discovery, which batches updates for a few seconds. Work starts once all are up.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        targets = lib.prom_api(base, "targets").get("data", {}).get("activeTargets", [])
        if len(targets) == 3 and all(t["health"] == "up" for t in targets):
            break
        time.sleep(0.25)
    time.sleep(2 * SCRAPE_S)

    # Work: three waves of noop jobs, some holding a GPU, one failing twice.
    cli = [str(bin_dir / "stemma"), f"--coordinator=127.0.0.1:{grpc}"]
    if secure:
        # A call with a bad token is refused and counted (the auth failures panel).
        r = lib.run(cli + [f"--ca={cred['ca']}", f"--token-file={cred['bad']}", "ls"])
        f.check(r.returncode != 0, f"a bad token was accepted: {r.stdout}")
        cli += [f"--ca={cred['ca']}", f"--token-file={cred['operator']}"]
    # A job that reports training steps as stemma-engine does (docs/engine-events.md): the
    # live training gauges of the experiments dashboard.
    (tmp / "train.sh").write_text(
        "i=0; while [ $i -lt 30 ]; do i=$((i+1));"
        " echo \"{\\\"event\\\":\\\"step\\\",\\\"step\\\":$i,\\\"loss\\\":$((40-i)).25,\\\"tokens_per_s\\\":$((1000+10*i)),\\\"total_steps\\\":30}\";"
        " sleep 0.4; done\n")
    (tmp / "train.yaml").write_text(f"name: train-like\nexperiment: live\nlabels: {{stage: cpt}}\n"
                                    f"exec: {{argv: [/bin/sh, {tmp / 'train.sh'}]}}\n")
    r = lib.run(cli + ["submit", "-f", str(tmp / "train.yaml")])
    f.check(r.returncode == 0, f"stemma submit train.yaml: {r.stdout}{r.stderr}")
    total = 1
    # A job that publishes a checkpoint as the engine does (an output event) below its owner's
    # prefix of the storage root (docs/tenancy.md): the registry registers it when the job succeeds.
    (tmp / "ckpt.sh").write_text(
        f"mkdir -p {store}/operator/ckpt/one && echo '{{}}' > {store}/operator/ckpt/one/stemma.json &&"
        f" echo '{{\"event\":\"output\",\"name\":\"model\",\"path\":\"{store}/operator/ckpt/one\","
        "\"type\":\"checkpoint\",\"operation\":\"cpt\"}'\n")
    (tmp / "ckpt.yaml").write_text(f"name: publishes\nexperiment: live\nexec: {{argv: [/bin/sh, {tmp / 'ckpt.sh'}]}}\n")
    r = lib.run(cli + ["submit", "-f", str(tmp / "ckpt.yaml")])
    f.check(r.returncode == 0, f"stemma submit ckpt.yaml: {r.stdout}{r.stderr}")
    total += 1
    # A call for a job that does not exist: NOT_FOUND, counted from the first one.
    r = lib.run(cli + ["get", "no-such-job"])
    f.check(r.returncode != 0, f"stemma get no-such-job succeeded: {r.stdout}")
    if engine is not None:
        with open(store / "en.txt", "w") as text:
            for i in range(200):
                text.write(f"the quick brown fox {i} jumps over the lazy dog\n")
        (tmp / "study.yaml").write_text(STUDY)
        r = lib.run(cli + ["sweep", "-f", str(tmp / "study.yaml")])
        f.check(r.returncode == 0, f"stemma sweep study.yaml: {r.stdout}{r.stderr}")
        total += STUDY_JOBS
    else:
        print(f"no stemma-engine ({engine}): the eval scores are not checked", flush=True)
    for wave in range(4):
        docs = []
        for i in range(8):
            gpus = "resources: {gpus: 1}\n" if i % 3 == 0 else ""
            docs.append(f"name: wave{wave}-{i}\nexperiment: live\n{gpus}noop: {{duration_ms: {300 + 150 * i}}}\n")
        if wave in (1, 2):
            # Two failing jobs: the coordinator creates a result's series at its first
            # attempt, and Prometheus counts no increase for a series' first sample.
            docs.append(f"name: fails{wave}\nexperiment: live\nmax_attempts: 2\nbackoff: {{initial_ms: 200}}\n"
                        "noop: {duration_ms: 100, exit_code: 3}\n")
        (tmp / f"wave{wave}.yaml").write_text("---\n".join(docs))
        r = lib.run(cli + ["submit", "-f", str(tmp / f"wave{wave}.yaml")])
        f.check(r.returncode == 0, f"stemma submit: {r.stdout}{r.stderr}")
        total += len(docs)
        time.sleep(3)
    if engine is not None:
        r = lib.run(cli + ["exp", "wait", "live-study", "--timeout", "200"])
        f.check(r.returncode == 0, f"stemma exp wait live-study: {r.stdout}{r.stderr}")
    states: list[str] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        r = lib.run(cli + ["-o", "json", "ls", "--all"])
        if r.returncode == 0:
            states = [j["state"] for j in json.loads(r.stdout)]
            if len(states) == total and all(s in ("SUCCEEDED", "FAILED") for s in states):
                break
        time.sleep(0.5)
    f.check(sorted(states) == ["FAILED"] * 2 + ["SUCCEEDED"] * (total - 2),
            f"jobs ended {sorted(states)}; want two FAILED and {total - 2} SUCCEEDED")
    time.sleep(3 * SCRAPE_S)

    # promtool's linter on each daemon's exposition; every Stemma metric family is on a
    # dashboard or in a rule (a new metric nobody can see is a gap to close).
    shown = lib.RULES.read_text() + "".join(p.read_text() for p in lib.dashboard_files())
    for name, port in [("coordinator", cmetrics)] + [(f"w{i}", p) for i, p in enumerate(wmetrics)]:
        text = lib.http_get(f"http://127.0.0.1:{port}/metrics")
        for family in sorted(set(re.findall(r"^# TYPE (stemma_\w+)", text, re.M))):
            f.check(family in shown, f"{family} ({name}) is on no dashboard and in no rule")
        r = lib.run([lib.tool("promtool"), "check", "metrics"], input=text)
        f.check(r.returncode == 0, f"promtool check metrics on {name}'s /metrics:\n{r.stdout}{r.stderr}")

    targets = lib.prom_api(base, "targets")["data"]["activeTargets"]
    f.check(len(targets) == 3 and all(t["health"] == "up" for t in targets),
            f"targets: {[(t['labels'].get('job'), t['scrapeUrl'], t['health'], t.get('lastError')) for t in targets]}")
    groups = lib.prom_api(base, "rules")["data"]["groups"]
    bad = [(r["name"], r.get("lastError")) for g in groups for r in g["rules"] if r.get("health") != "ok"]
    n_rules = sum(len(g["rules"]) for g in groups)
    f.check(n_rules > 0 and not bad, f"rules not healthy: {bad} of {n_rules}")
    active = [(a["labels"]["alertname"], a["state"]) for a in lib.prom_api(base, "alerts")["data"]["alerts"]]
    f.check(not active, f"alerts active on a healthy cluster: {active}")

    check_new_series(base, tmp, cred, secure, engine is not None, f)

    # Every dashboard query, with variables filled in as Grafana would.
    t_end = time.time()
    span = f"{int(t_end - t_start) + 1}s"
    instance_c = f"127.0.0.1:{cmetrics}"
    instance_w = f"127.0.0.1:{wmetrics[0]}"
    choices = {
        "all": {"job": "stemma-.*", "instance": ".+", "experiment": ".*", "stage": ".*"},
        "coordinator": {"job": "stemma-coordinator", "instance": instance_c, "experiment": ".*", "stage": ".*"},
        "worker w0": {"job": "stemma-worker", "instance": instance_w, "experiment": ".*", "stage": ".*"},
    }
    needs = needs_by_panel()
    # failing jobs, the step-reporting job, a bad token
    caused = ({generate.FAILURES, generate.TRAINING, generate.REGISTRY, generate.RPC_ERRORS}
              | ({generate.AUTH, generate.TLS} if secure else set())
              | ({generate.EVAL_METRICS} if engine is not None else set()))
    queries = empty_expected = 0
    for path in lib.dashboard_files():
        d = json.loads(path.read_text())
        for v in d["templating"]["list"]:
            if v["type"] != "query":
                continue
            sel, label = v["query"]["query"][len("label_values("):-1].rsplit(",", 1)
            for choice, values in choices.items():
                match = lib.substitute(sel, values)
                a = lib.prom_api(base, f"label/{label.strip()}/values", **{"match[]": match})
                f.check(a.get("status") == "success", f"{path.name} variable {v['name']} ({choice}): {a.get('error')}")
                if choice == "all" and v["name"] == "job":
                    f.check(sorted(a.get("data", [])) == ["stemma-coordinator", "stemma-worker"],
                            f"{path.name}: $job offers {a.get('data')}")
                if choice == "all" and v["name"] == "instance":
                    f.check(len(a.get("data", [])) == 3, f"{path.name}: $instance offers {a.get('data')}")
        for choice, values in choices.items():
            values = dict(values, __rate_interval=RATE_INTERVAL, __interval=f"{SCRAPE_S}s", __range=span)
            results: dict[int, list] = {}
            for panel, target in lib.dashboard_targets(d):
                expr = lib.substitute(target["expr"], values)
                a = lib.prom_api(base, "query_range", query=expr, start=t_start, end=t_end, step=SCRAPE_S)
                queries += 1
                where = f"{path.name} '{panel['title']}' {target['refId']} ({choice})"
                if f.check(a.get("status") == "success", f"{where}: {a.get('error')}: {expr}"):
                    results.setdefault(panel["id"], []).append((target, a["data"]["result"]))
            for panel in d["panels"]:
                if panel["type"] == "row" or choice != "all":
                    continue
                why = needs[(d["uid"], panel["title"])]
                data = any(has_data(res) for _, res in results.get(panel["id"], []))
                if why is None or why in caused:
                    f.check(data, f"{path.name} '{panel['title']}': no data after {total} jobs")
                else:
                    empty_expected += 1
                    print(f"{path.name} '{panel['title']}': {'has data' if data else 'no data'} (needs {why})", flush=True)
                if panel["title"] == "Attempt failure share":
                    last = [float(s["values"][-1][1]) for _, res in results.get(panel["id"], []) for s in res
                            if s["values"]]
                    f.check(bool(last) and 0 < last[0] < 0.5,
                            f"attempt failure share {last}: want the share of the failed attempts above")
            if choice == "all":
                png = out / f"{d['uid']}.png"
                render(d, results, needs, png, f"{total} jobs, 2 workers, {span}")
                print(f"drew {png}", flush=True)
    print(f"{queries} dashboard queries run; {empty_expected} panels wait for metrics not exported yet", flush=True)

    if secure:
        check_certificate_renewal(base, cli, cred, f)

    # A worker killed: its alert goes pending, then firing; the other worker's stays quiet.
    victim = f"127.0.0.1:{wmetrics[1]}"
    procs.stop(workers[1], signal.SIGKILL)
    seen: list[str] = []
    others: set = set()
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline and "firing" not in seen:
        for a in lib.prom_api(base, "alerts")["data"]["alerts"]:
            if a["labels"]["alertname"] == "StemmaWorkerDown":
                if a["labels"].get("instance") == victim:
                    if not seen or seen[-1] != a["state"]:
                        seen.append(a["state"])
                else:
                    others.add(a["labels"].get("instance"))
        time.sleep(0.25)
    f.check(seen == ["pending", "firing"], f"StemmaWorkerDown for the killed worker went {seen}, want pending then firing")
    f.check(not others, f"StemmaWorkerDown also for {others}")
    alerts = lib.prom_api(base, "alerts")["data"]["alerts"]
    fired = [a for a in alerts if a["labels"]["alertname"] == "StemmaWorkerDown" and a["state"] == "firing"]
    if fired:
        ann = fired[0]["annotations"]
        f.check(victim in ann.get("description", "") and ann.get("runbook_url", "").endswith("StemmaWorkerDown.md"),
                f"firing alert's annotations: {ann}")
        f.check(fired[0]["labels"].get("severity") == "warning", f"severity {fired[0]['labels']}")
    print(f"StemmaWorkerDown for {victim}: {' -> '.join(seen)}", flush=True)


def check_new_series(base: str, tmp: pathlib.Path, cred: dict, secure: bool, engine: bool,
                     f: lib.Failures) -> None:
    """The series added for the dashboards and alerts, after the run above."""
    c = 'job="stemma-coordinator"'
    got = values(base, f'stemma_rpc_requests_total{{{c}, method="GetJob", code="NOT_FOUND"}}')
    f.check(got and got[0] >= 1, f"stemma_rpc_requests_total GetJob NOT_FOUND: {got}")
    # Created at 0 before the first call: the first error shows as an increase.
    got = values(base, f'increase(stemma_rpc_requests_total{{{c}, method="GetJob", code="NOT_FOUND"}}[10m])')
    f.check(got and got[0] > 0, f"increase of GetJob NOT_FOUND: {got} (was the series created at its first error?)")
    got = values(base, f'sum(stemma_rpc_requests_total{{{c}, method="Submit", code="OK"}})')
    f.check(got and got[0] >= 1, f"stemma_rpc_requests_total Submit OK: {got}")
    if secure:
        got = values(base, f'stemma_rpc_requests_total{{{c}, method="ListJobs", code="UNAUTHENTICATED"}}')
        f.check(got and got[0] >= 1, f"stemma_rpc_requests_total ListJobs UNAUTHENTICATED (a bad token): {got}")
    got = values(base, f"stemma_store_commit_errors_total{{{c}}}")
    f.check(got == [0.0], f"stemma_store_commit_errors_total: {got}, want one series at 0")
    got = values(base, f'stemma_registry_checkpoints_registered_total{{{c}, operation="cpt"}}')
    f.check(got and got[0] >= (2 if engine else 1), f"checkpoints registered by cpt: {got}")
    got = values(base, f'sum(stemma_registry_checkpoints_registered_total{{{c}, operation=~"init|other"}})')
    f.check(got and got[0] == (1 if engine else 0), f"checkpoints registered by init (the study's base): {got}")
    if engine:
        scores = instant(base, f'stemma_eval_score{{{c}, experiment="live-study", stage="eval"}}')
        names = sorted(s["metric"].get("metric", "") for s in scores)
        f.check("ppl/en" in names, f"stemma_eval_score of the study's eval: {names}")
        for s in scores:
            v = float(s["value"][1])
            f.check(math.isfinite(v) and v > 0, f"stemma_eval_score {s['metric']}: {v}")
            f.check(s["metric"].get("cell") == "eval", f"stemma_eval_score's cell label: {s['metric']}")
        f.check(not instant(base, f'stemma_eval_score{{{c}, stage!="eval"}}'),
                "stemma_eval_score has series of jobs that are not evals")
    if secure:
        for job, cert, path in [("stemma-coordinator", "server", cred["cert"]), ("stemma-worker", "ca", cred["ca"])]:
            got = values(base, f'stemma_tls_certificate_expiry_timestamp_seconds{{job="{job}", certificate="{cert}"}}')
            want = not_after(path)
            f.check(bool(got) and all(abs(g - want) < 1 for g in got),
                    f"{job} certificate expiry ({cert}): {got}, want notAfter of {path.name} = {want}")


def check_certificate_renewal(base: str, cli: list[str], cred: dict, f: lib.Failures) -> None:
    """A renewed server certificate (replaced by rename, as cert-manager and the operator
    guide do): the coordinator serves it and its expiry gauge follows at the next scrape."""
    d = cred["cert"].parent
    r = lib.run(["openssl", "x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                 "-days", "90", "-extfile", "san.ext", "-out", "tls.crt.new"], cwd=d)
    if not f.check(r.returncode == 0, f"openssl x509 (renewal): {r.stderr}"):
        return
    want = not_after(d / "tls.crt.new")
    f.check(abs(want - not_after(cred["cert"])) > 86400, "the renewed certificate has the old expiry")
    os.replace(d / "tls.crt.new", cred["cert"])
    got: list[float] = []
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        got = values(base, 'stemma_tls_certificate_expiry_timestamp_seconds{job="stemma-coordinator", certificate="server"}')
        if got and abs(got[0] - want) < 1:
            break
        time.sleep(0.5)
    f.check(bool(got) and abs(got[0] - want) < 1, f"after renewal the server certificate expiry is {got}, want {want}")
    time.sleep(6)  # the TLS credentials re-read their files every 5 s
    r = lib.run(cli + ["ls"])
    f.check(r.returncode == 0, f"stemma ls after the certificate was renewed: {r.stdout}{r.stderr}")
    print(f"certificate renewed: expiry gauge {got}", flush=True)


if __name__ == "__main__":
    main()
