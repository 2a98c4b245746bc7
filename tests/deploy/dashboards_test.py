#!/usr/bin/env python3
"""The Grafana dashboards: regenerating them gives the checked-in JSON, and each follows the
dashboard-linter rules (datasource variable, job/instance variables, $__rate_interval in every
rate) with PromQL that Prometheus's own parser accepts (promtool check rules); the GPU panels'
join of DCGM exporter series to Stemma's worker pods is checked with a promtool unit test.

    dashboards_test.py
"""
from __future__ import annotations

import json
import re
import sys
import tempfile
import pathlib

import yaml

import deploylib as lib

RANGE = re.compile(r"\[([^\]]+)\]")
RATE_FUNCS = re.compile(r"\b(rate|irate|increase|delta|deriv)\s*\(")

# What the variables look like to Prometheus when a person picks "All".
ALL = {"job": "stemma-.*", "instance": ".+", "experiment": ".*", "stage": ".*",
       "__rate_interval": "1m", "__range": "1h", "__interval": "15s"}


def promtool_accepts(exprs: dict[str, str], tmp: pathlib.Path) -> tuple[bool, str]:
    """Runs promtool check rules on a file with one recording rule per expression."""
    rules = [{"record": f"check:{i}", "expr": e} for i, e in enumerate(exprs.values())]
    path = tmp / "exprs.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard-queries", "rules": rules}]}))
    r = lib.run([lib.tool("promtool"), "check", "rules", str(path)])
    return r.returncode == 0, r.stdout + r.stderr


def overlaps(a: dict, b: dict) -> bool:
    return (a["x"] < b["x"] + b["w"] and b["x"] < a["x"] + a["w"] and
            a["y"] < b["y"] + b["h"] and b["y"] < a["y"] + a["h"])


def check_dcgm_panels(dashboards: list[dict], tmp: pathlib.Path, f: lib.Failures) -> None:
    """The GPU panels join DCGM exporter series to Stemma's worker pods: a promtool unit test
    with the panels' queries as recording rules keeps the GPUs of a Stemma worker pod (named
    by DCGM's `pod`, or `exported_pod` when Prometheus kept its own `pod`) and drops another
    workload's GPU on the same node."""
    exprs = {panel["title"]: lib.substitute(t["expr"], ALL) for d in dashboards
             for panel, t in lib.dashboard_targets(d) if "DCGM_FI_DEV" in t["expr"]}
    if not f.check(set(exprs) == {"GPU utilisation", "GPU memory used", "GPU memory used share"},
                   f"DCGM panels: {sorted(exprs)}"):
        return
    names = {"GPU utilisation": "gpu:util", "GPU memory used": "gpu:used", "GPU memory used share": "gpu:share"}
    (tmp / "dcgm-rules.yaml").write_text(yaml.safe_dump({"groups": [{"name": "dcgm", "rules": [
        {"record": names[t], "expr": e} for t, e in exprs.items()]}]}))
    dcgm = 'job="dcgm-exporter", instance="node1:9400", pod="dcgm-exporter-x", Hostname="node1"'
    series = [
        # A Stemma worker's GPU (DCGM's own pod label renamed by Prometheus) and another pod's.
        (f'DCGM_FI_DEV_GPU_UTIL{{{dcgm}, gpu="0", exported_pod="stemma-worker-gpu8-0"}}', "87x10"),
        (f'DCGM_FI_DEV_GPU_UTIL{{{dcgm}, gpu="1", exported_pod="someone-elses-pod"}}', "50x10"),
        (f'DCGM_FI_DEV_FB_USED{{{dcgm}, gpu="0", exported_pod="stemma-worker-gpu8-0"}}', "30000x10"),
        (f'DCGM_FI_DEV_FB_FREE{{{dcgm}, gpu="0", exported_pod="stemma-worker-gpu8-0"}}', "10000x10"),
        (f'DCGM_FI_DEV_FB_USED{{{dcgm}, gpu="1", exported_pod="someone-elses-pod"}}', "100x10"),
        (f'DCGM_FI_DEV_FB_FREE{{{dcgm}, gpu="1", exported_pod="someone-elses-pod"}}', "100x10"),
        ('stemma_worker_connected{job="stemma-worker", instance="10.0.0.5:9464", pod="stemma-worker-gpu8-0"}', "1x10"),
    ]
    want = {"gpu:util": 87, "gpu:used": 30000, "gpu:share": 0.75}
    test = {"rule_files": ["dcgm-rules.yaml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [{"series": s_, "values": v} for s_, v in series],
        "promql_expr_test": [{"expr": name, "eval_time": "5m", "exp_samples": [
            {"labels": f'{name}{{gpu="0", pod="stemma-worker-gpu8-0"}}', "value": value}]}
            for name, value in want.items()]}]}
    (tmp / "dcgm-test.yaml").write_text(yaml.safe_dump(test))
    r = lib.run([lib.tool("promtool"), "test", "rules", str(tmp / "dcgm-test.yaml")])
    f.check(r.returncode == 0, f"the DCGM panels' join:\n{r.stdout}{r.stderr}")


def main() -> None:
    f = lib.Failures()
    r = lib.run([sys.executable, str(lib.DEPLOY / "generate.py"), "--check"])
    f.check(r.returncode == 0, f"deploy/generate.py --check: generated files are stale:\n{r.stderr}")

    files = lib.dashboard_files()
    f.check(len(files) >= 2, f"expected the cluster and experiments dashboards, found {files}")
    uids = set()
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = pathlib.Path(tmpdir)
        # The parser check itself must be able to fail.
        ok, _ = promtool_accepts({"broken": "sum(rate(x[5m])"}, tmp)
        f.check(not ok, "promtool accepted a broken expression: the PromQL check checks nothing")

        exprs: dict[str, str] = {}
        for path in files:
            d = json.loads(path.read_text())
            name = path.name
            f.check(d.get("uid") and d["uid"] not in uids, f"{name}: missing or duplicate uid")
            uids.add(d.get("uid"))
            variables = {v["name"]: v for v in d["templating"]["list"]}
            ds = variables.get("datasource", {})
            f.check(ds.get("type") == "datasource" and ds.get("query") == "prometheus",
                    f"{name}: no Prometheus datasource variable")
            for var in ("job", "instance"):
                f.check(variables.get(var, {}).get("type") == "query", f"{name}: no '{var}' query variable")
            for v in variables.values():
                if v["type"] == "query":
                    f.check(v["datasource"] == {"type": "prometheus", "uid": "${datasource}"},
                            f"{name}: variable {v['name']} does not use $datasource")
                    m = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", v["query"]["query"])
                    if f.check(m is not None, f"{name}: variable {v['name']} is not label_values(selector, label)"):
                        exprs[f"{name} variable {v['name']}"] = lib.substitute(m.group(1), ALL)
            ids = set()
            boxes = []
            for panel in d["panels"]:
                title = f"{name} panel '{panel.get('title')}'"
                f.check(panel["id"] not in ids, f"{title}: duplicate id {panel['id']}")
                ids.add(panel["id"])
                g = panel["gridPos"]
                f.check(0 <= g["x"] and g["x"] + g["w"] <= 24, f"{title}: outside the 24-column grid")
                for other_title, other in boxes:
                    f.check(not overlaps(g, other), f"{title}: overlaps '{other_title}'")
                boxes.append((panel.get("title"), g))
                if panel["type"] == "row":
                    continue
                f.check(panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"},
                        f"{title}: datasource is not $datasource")
                f.check(bool(panel.get("targets")), f"{title}: no query")
                f.check("unit" in panel["fieldConfig"]["defaults"], f"{title}: no unit")
                for target in panel.get("targets", []):
                    expr = target["expr"]
                    where = f"{title} target {target['refId']}"
                    f.check(target["datasource"]["uid"] == "${datasource}", f"{where}: datasource not $datasource")
                    f.check('job=~"$job"' in expr and 'instance=~"$instance"' in expr,
                            f"{where}: does not select on $job and $instance: {expr}")
                    if RATE_FUNCS.search(expr):
                        for rng in RANGE.findall(expr):
                            f.check(rng in ("$__rate_interval", "$__range"),
                                    f"{where}: range [{rng}] instead of $__rate_interval: {expr}")
                    exprs[where] = lib.substitute(expr, ALL)
        check_dcgm_panels([json.loads(p.read_text()) for p in files], tmp, f)
        ok, out = promtool_accepts(exprs, tmp)
        f.check(ok, f"promtool rejects a dashboard query:\n{out}")
        print(f"{len(exprs)} dashboard and variable queries parsed by promtool", flush=True)
    f.exit("dashboards_test")


if __name__ == "__main__":
    main()
