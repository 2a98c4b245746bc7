"""Helpers shared by the deploy tests (tests/deploy/*_test.py): paths, tools, processes."""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

SOURCE = pathlib.Path(__file__).resolve().parents[2]
DEPLOY = SOURCE / "deploy"
KUBERNETES = DEPLOY / "kubernetes"
DASHBOARDS = DEPLOY / "grafana" / "dashboards"
RULES = DEPLOY / "prometheus" / "stemma-rules.yaml"
RULE_TESTS = DEPLOY / "prometheus" / "tests" / "stemma-rules-test.yaml"
RUNBOOKS = SOURCE / "docs" / "runbooks"


class Failures:
    """Collects failed checks so that one run reports all of them."""

    def __init__(self, quiet: bool = False) -> None:
        self.items: list[str] = []
        self.checks = 0
        self.quiet = quiet  # a check of the checks (a planted violation): failures are expected

    def check(self, ok: bool, what: str) -> bool:
        self.checks += 1
        if not ok:
            self.items.append(what)
            if not self.quiet:
                print(f"FAIL: {what}", flush=True)
        return ok

    def exit(self, name: str) -> None:
        if self.items:
            print(f"{name}: {len(self.items)} of {self.checks} checks failed", flush=True)
            sys.exit(1)
        print(f"{name}: all {self.checks} checks passed", flush=True)
        sys.exit(0)


def tool(name: str) -> str:
    """A tool from the deploy venv (beside this Python), else from PATH."""
    beside = pathlib.Path(sys.executable).parent / name
    if beside.exists():
        return str(beside)
    found = shutil.which(name)
    if not found:
        sys.exit(f"{name} not found: run scripts/setup (it installs the deploy tools)")
    return found


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    kw.setdefault("capture_output", True)
    kw.setdefault("text", True)
    return subprocess.run(cmd, **kw)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url: str, timeout: float = 5) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def wait_http(url: str, timeout: float, proc: subprocess.Popen | None = None) -> str:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode} while waiting for {url}")
        try:
            return http_get(url, timeout=2)
        except (urllib.error.URLError, ConnectionError, OSError) as e:
            last = e
        time.sleep(0.2)
    raise TimeoutError(f"{url} did not answer in {timeout} s: {last}")


def prom_api(base: str, path: str, **params) -> dict:
    """GET base/api/v1/path; returns the decoded answer (status success or error)."""
    url = f"{base}/api/v1/{path}"
    if params:
        url += "?" + urllib.parse.urlencode(params, doseq=True)
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return json.loads(r.read().decode())
    except urllib.error.HTTPError as e:
        return json.loads(e.read().decode() or '{"status":"error","error":"http %d"}' % e.code)


class Processes:
    """Children started by a test; all are killed (process group) when it ends."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []

    def start(self, cmd: list[str], log: pathlib.Path, **kw) -> subprocess.Popen:
        out = open(log, "wb")
        p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, **kw)
        self.procs.append(p)
        return p

    def stop(self, p: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 10) -> None:
        if p.poll() is not None:
            return
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            return
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()

    def stop_all(self) -> None:
        for p in reversed(self.procs):
            self.stop(p)


def dashboard_files() -> list[pathlib.Path]:
    return sorted(DASHBOARDS.glob("*.json"))


def dashboard_targets(dashboard: dict):
    """(panel, target) for every query target of every panel."""
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            yield panel, target


def substitute(expr: str, values: dict[str, str]) -> str:
    """Fills Grafana variables ($name and ${name}) the way Grafana would."""
    for name in sorted(values, key=len, reverse=True):
        expr = expr.replace("${" + name + "}", values[name]).replace("$" + name, values[name])
    return expr
