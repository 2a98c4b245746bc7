#!/usr/bin/env python3
"""The alert rules: promtool check rules and promtool test rules pass; every alert has `for`,
a severity, a summary, a description and a runbook page that exists; every alert has a
firing and a quiet case in the unit tests; the PrometheusRule that kustomize renders holds
exactly the same rules.

    rules_test.py
"""
from __future__ import annotations

import re
import sys
import tempfile
import pathlib

import yaml

import deploylib as lib

SEVERITIES = {"critical", "warning", "info"}


def main() -> None:
    f = lib.Failures()
    promtool = lib.tool("promtool")
    r = lib.run([promtool, "check", "rules", str(lib.RULES)])
    f.check(r.returncode == 0, f"promtool check rules:\n{r.stdout}{r.stderr}")
    r = lib.run([promtool, "test", "rules", str(lib.RULE_TESTS)])
    f.check(r.returncode == 0, f"promtool test rules:\n{r.stdout}{r.stderr}")

    rules = yaml.safe_load(lib.RULES.read_text())
    alerts = [rule for g in rules["groups"] for rule in g["rules"] if "alert" in rule]
    names = [a["alert"] for a in alerts]
    f.check(len(names) == len(set(names)), f"duplicate alert names: {names}")
    for a in alerts:
        n = a["alert"]
        f.check(re.fullmatch(r"Stemma[A-Z][A-Za-z]+", n) is not None, f"{n}: not CamelCase with the Stemma prefix")
        f.check("for" in a, f"{n}: no `for`")
        f.check(a.get("labels", {}).get("severity") in SEVERITIES, f"{n}: severity not one of {SEVERITIES}")
        ann = a.get("annotations", {})
        for key in ("summary", "description", "runbook_url"):
            f.check(bool(ann.get(key)), f"{n}: no {key} annotation")
        url = ann.get("runbook_url", "")
        page = lib.RUNBOOKS / url.rsplit("/", 1)[-1]
        if f.check(url.endswith(f"/{n}.md") and page.exists(), f"{n}: runbook_url {url} does not name docs/runbooks/{n}.md"):
            text = page.read_text()
            f.check(text.startswith(f"# {n}"), f"{page.name}: does not start with '# {n}'")
            for section in ("## Meaning", "## Impact", "## Diagnosis", "## Mitigation"):
                f.check(section in text, f"{page.name}: no '{section}' section")

    # A firing and a quiet case per alert.
    tests = yaml.safe_load(lib.RULE_TESTS.read_text())
    firing, quiet = set(), set()
    for t in tests["tests"]:
        for case in t.get("alert_rule_test", []):
            (firing if case.get("exp_alerts") else quiet).add(case["alertname"])
    for n in names:
        f.check(n in firing, f"{n}: no promtool test where it fires")
        f.check(n in quiet, f"{n}: no promtool test where it stays quiet")

    # The Kubernetes copy holds the same rules (deploy/generate.py makes it; dashboards_test
    # checks that it is fresh; kubernetes_test runs promtool on it as kustomize renders it).
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = pathlib.Path(tmpdir)
        component = lib.KUBERNETES / "components" / "monitoring" / "prometheusrule.yaml"
        doc = yaml.safe_load(component.read_text())
        f.check(doc["kind"] == "PrometheusRule", "prometheusrule.yaml is not a PrometheusRule")
        f.check(doc["spec"] == rules, "the PrometheusRule's spec differs from deploy/prometheus/stemma-rules.yaml")
        rendered = tmp / "from-crd.yaml"
        rendered.write_text(yaml.safe_dump(doc["spec"]))
        r = lib.run([promtool, "check", "rules", str(rendered)])
        f.check(r.returncode == 0, f"promtool check rules on the PrometheusRule's spec:\n{r.stdout}{r.stderr}")
        # generate.py --runbook-base-url: the same rules, every runbook under the new base.
        out = tmp / "custom-base.yaml"
        r = lib.run([sys.executable, str(lib.DEPLOY / "generate.py"), "--runbook-base-url",
                     "https://wiki.example.org/ml/stemma", "--rule-out", str(out)])
        if f.check(r.returncode == 0, f"generate.py --runbook-base-url:\n{r.stdout}{r.stderr}"):
            custom = yaml.safe_load(out.read_text())["spec"]
            urls = [a["annotations"]["runbook_url"] for g in custom["groups"] for a in g["rules"] if "alert" in a]
            f.check(urls == [f"https://wiki.example.org/ml/stemma/runbooks/{n}.md" for n in names],
                    f"generate.py --runbook-base-url wrote {urls}")
    print(f"{len(names)} alerts: {', '.join(names)}", flush=True)
    f.exit("rules_test")


if __name__ == "__main__":
    main()
