#!/usr/bin/env python3
"""Every study file in configs/experiments/ expands, validates and plans on a real coordinator.

What a researcher checks before spending a cluster: `stemma plan -f FILE` accepts each of the
four studies at both scales (and every other experiment file there), each plan has the jobs
and edges the study describes, and a paper-scale plan knows the cost of every training job
(GPUs and a GPU-hours estimate from tokens and model size; `models:` gives the sizes of
checkpoints this machine cannot read). The tiny files' costs are known too: their models come
from `init` stages whose sizes the planner reads from the spec.

Usage: check_study_plans.py BIN_DIR SOURCE_DIR
"""
import json
import pathlib
import socket
import subprocess
import sys
import tempfile
import time

STUDIES = ["family-experts", "lape-sparse", "deltamoe", "routing-ssft"]


def main() -> int:
    binary, source = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        addr = f"127.0.0.1:{s.getsockname()[1]}"
    failures = []
    with tempfile.TemporaryDirectory(prefix="stemma-plans.") as tmp:
        coordinator = subprocess.Popen([str(binary / "stemma-coordinator"), "--listen", addr, "--data", tmp],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            def stemma(*args):
                return subprocess.run([str(binary / "stemma"), "--coordinator", addr, *args],
                                      capture_output=True, text=True, cwd=source)
            for _ in range(100):
                if stemma("ls").returncode == 0:
                    break
                time.sleep(0.1)
            files = sorted((source / "configs" / "experiments").glob("*.yaml"))
            names = {f.name for f in files}
            for study in STUDIES:
                for suffix in (".yaml", ".paper.yaml"):
                    if study + suffix not in names:
                        failures.append(f"configs/experiments/{study}{suffix} is missing")
            for f in files:
                rel = f.relative_to(source)
                r = stemma("plan", "-f", str(rel), "-o", "json")
                if r.returncode != 0:
                    failures.append(f"{rel}: stemma plan exit {r.returncode}: {r.stderr.strip() or r.stdout.strip()}")
                    continue
                plan = json.loads(r.stdout)
                e = plan["experiment"]
                jobs, edges = int(e.get("jobs", 0)), int(e.get("edges", 0))
                hours = float(e.get("gpu_hours_estimate", e.get("gpuHoursEstimate", 0)))
                unknown = int(e.get("unknown_cost_jobs", e.get("unknownCostJobs", 0)))
                gpus = int(e.get("gpus", 0))
                kinds = {c.get("kind", "") for c in plan.get("cells", [])}
                print(f"{rel}: {jobs} jobs, {edges} edges, {gpus} GPUs, {hours:.4g} GPU-hours, "
                      f"{unknown} jobs of unknown cost, kinds {sorted(kinds)}")
                if jobs < 10 or edges < jobs:
                    failures.append(f"{rel}: a study has more than {jobs} jobs and {edges} edges")
                stem = f.name.removesuffix(".yaml").removesuffix(".paper")
                if stem in STUDIES:
                    if "eval" not in kinds or "train" not in kinds or "prepare" not in kinds:
                        failures.append(f"{rel}: a study prepares its corpus, trains and evaluates (kinds {sorted(kinds)})")
                    if unknown != 0:
                        failures.append(f"{rel}: {unknown} training jobs of unknown cost")
                    if f.name.endswith(".paper.yaml") and (gpus < 8 or hours <= 0):
                        failures.append(f"{rel}: the paper scale needs GPUs and GPU-hours (got {gpus}, {hours})")
        finally:
            coordinator.terminate()
            coordinator.wait(timeout=30)
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
