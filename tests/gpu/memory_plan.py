#!/usr/bin/env python3
"""The memory plan's estimate for one train spec, as `stemma plan` gives it.

Usage: memory_plan.py BIN_DIR SPEC_YAML RESOURCES [GPU_MEMORY]

Plans an experiment of one stage that runs SPEC_YAML (a train spec file, YAML or JSON) with
RESOURCES (a YAML flow mapping such as "{gpus: 1}") on a private `stemma-coordinator` from
BIN_DIR (tests/bench/lib/private_plan.py: loopback, a temporary database and HOME), with
`--gpu-memory GPU_MEMORY`, e.g. 141GiB, when given (no worker need be connected), and prints
one JSON object: {"memory_plan_mib": N, "memory_plan": "fp32 weight slices (1/W) ... = ~N GiB
per GPU"}, or {"memory_plan_mib": null, "why": "..."} when the plan could not be made. Exit 0
either way.
"""
import json
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench", "lib"))
import private_plan  # noqa: E402


def plan(bin_dir, spec_path, resources, gpu_memory):
    work = tempfile.mkdtemp(prefix="stemma-memory-plan.")
    try:
        with open(spec_path) as f:
            spec = f.read()
        experiment = os.path.join(work, "plan.yaml")
        with open(experiment, "w") as f:
            f.write("name: gpuplan\nstages:\n  big:\n")
            f.write(f"    resources: {resources}\n    train:\n")
            for line in spec.splitlines():
                f.write(f"      {line}\n")
        cell = private_plan.plan_cells(bin_dir, experiment, gpu_memory).get("big")
        if cell is None or not cell.get("memory_per_device_mb"):
            return {"memory_plan_mib": None, "why": "the plan has no memory estimate for the job"}
        return {"memory_plan_mib": int(cell["memory_per_device_mb"]),
                "memory_plan": cell.get("memory_plan", "")}
    except (OSError, private_plan.PlanError) as e:
        return {"memory_plan_mib": None, "why": str(e)[-500:]}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main():
    if len(sys.argv) not in (4, 5):
        sys.exit(__doc__.strip().splitlines()[2])
    gpu_memory = sys.argv[4] if len(sys.argv) == 5 else ""
    print(json.dumps(plan(sys.argv[1], sys.argv[2], sys.argv[3], gpu_memory)))


if __name__ == "__main__":
    main()
