#!/usr/bin/env python3
"""Every study file in configs/experiments/ expands, validates and plans on a real coordinator.

What a researcher checks before spending a cluster: `stemma plan -f FILE` accepts each of the
four studies at both scales (and every other experiment file there), each plan has the jobs
and edges the study describes, and a paper-scale plan knows the cost of every training job
(GPUs and a GPU-hours estimate from tokens and model size; `models:` gives the sizes of
checkpoints this machine cannot read). The tiny files' costs are known too: their models come
from `init` stages whose sizes the planner reads from the spec.

The memory plan (docs/experiments.md): every train and eval job of every study file has an
estimate per device, and planned against 80 GiB GPUs (`--gpu-memory 80GiB`) every GPU job of a
paper-scale file fits (8×80 GB nodes are what the paper files are written for).

Usage: check_study_plans.py BIN_DIR SOURCE_DIR
"""
import json
import os
import pathlib
import socket
import subprocess
import sys
import tempfile
import time

STUDIES = ["family-experts", "lape-sparse", "deltamoe", "routing-ssft"]
GPU_MIB = 80 * 1024
# Jobs whose model alone exceeds one 80 GB GPU, which no setting of the file can change: eval
# holds the whole model per rank (DeltaMoE's 8-expert upcycle of Llama-3.1-8B: 88 GiB in bf16).
TOO_LARGE = {("deltamoe.paper.yaml", "eval-moe-cpt"), ("deltamoe.paper.yaml", "eval-deltamoe")}


def check_memory(rel, plan, paper: bool) -> list:
    """Every train and eval cell has a memory estimate; a paper file's GPU cells fit 80 GiB."""
    failures, largest = [], {}
    for c in plan.get("cells", []):
        if c.get("kind") not in ("train", "eval"):
            continue
        mib = int(c.get("memory_per_device_mb", c.get("memoryPerDeviceMb", 0)))
        text = c.get("memory_plan", c.get("memoryPlan", ""))
        if mib <= 0:
            failures.append(f"{rel}: {c['job_name']}: no memory estimate")
            continue
        stage = c.get("stage", "")
        if mib > largest.get(stage, (0, ""))[0]:
            largest[stage] = (mib, text)
        too_large = (pathlib.Path(rel).name, c["job_name"]) in TOO_LARGE
        if too_large and mib <= GPU_MIB:
            failures.append(f"{rel}: {c['job_name']} now fits 80 GiB: drop it from TOO_LARGE")
        if paper and int(c.get("gpus", 0)) > 0 and "per GPU" in text and mib > GPU_MIB and not too_large:
            failures.append(f"{rel}: {c['job_name']} does not fit an 80 GiB GPU: {text}")
        if paper and int(c.get("gpus", 0)) > 0 and "per GPU" not in text:
            failures.append(f"{rel}: {c['job_name']} asks for GPUs but runs on the CPU: {text}")
    for stage, (mib, text) in largest.items():
        print(f"  {stage}: {text}")
    return failures


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
            # A HOME of the test's own: no ~/.config/stemma of the developer's reaches the
            # CLI, and it writes none.
            env = {k: v for k, v in os.environ.items() if not k.startswith("STEMMA_")}
            env["HOME"] = tmp

            def stemma(*args):
                return subprocess.run([str(binary / "stemma"), "--coordinator", addr, *args],
                                      capture_output=True, text=True, cwd=source, env=env)
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
                r = stemma("plan", "-f", str(rel), "-o", "json", "--gpu-memory", "80GiB")
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
                failures += check_memory(rel, plan, f.name.endswith(".paper.yaml"))
                stem = f.name.removesuffix(".yaml").removesuffix(".paper")
                # Every file must plan; the four studies (not the examples beside them, such as
                # lm-eval.yaml) must also be whole studies.
                if stem in STUDIES and (jobs < 10 or edges < jobs):
                    failures.append(f"{rel}: a study has more than {jobs} jobs and {edges} edges")
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
