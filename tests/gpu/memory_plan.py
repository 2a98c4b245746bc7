#!/usr/bin/env python3
"""The memory plan's estimate for one train spec, as `stemma plan` gives it.

Usage: memory_plan.py BIN_DIR SPEC_YAML RESOURCES [GPU_MEMORY]

Starts a private `stemma-coordinator` (BIN_DIR, loopback, a temporary database), plans an
experiment of one stage that runs SPEC_YAML (a train spec file, YAML or JSON) with RESOURCES
(a YAML flow mapping such as "{gpus: 1}") through `stemma plan -o json` (with `--gpu-memory
GPU_MEMORY`, e.g. 141GiB, when given: no worker need be connected), and prints one JSON object:
{"memory_plan_mib": N, "memory_plan": "fp32 weight slices (1/W) ... = ~N GiB per GPU"}, or
{"memory_plan_mib": null, "why": "..."} when the plan could not be made. Exit 0 either way.
"""
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time


def plan(bin_dir, spec_path, resources, gpu_memory):
    coordinator = os.path.join(bin_dir, "stemma-coordinator")
    stemma = os.path.join(bin_dir, "stemma")
    for binary in (coordinator, stemma):
        if not os.access(binary, os.X_OK):
            return {"memory_plan_mib": None, "why": f"{binary} not built"}
    with open(spec_path) as f:
        spec = f.read()
    work = tempfile.mkdtemp(prefix="stemma-memory-plan.")
    try:
        experiment = os.path.join(work, "plan.yaml")
        with open(experiment, "w") as f:
            f.write("name: gpuplan\nstages:\n  big:\n")
            f.write(f"    resources: {resources}\n    train:\n")
            for line in spec.splitlines():
                f.write(f"      {line}\n")
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            addr = f"127.0.0.1:{sock.getsockname()[1]}"
        server = subprocess.Popen([coordinator, "--listen", addr, "--data",
                                   os.path.join(work, "coord")],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            cli = [stemma, "--coordinator", addr]
            for _ in range(100):
                if subprocess.run(cli + ["ls"], capture_output=True).returncode == 0:
                    break
                time.sleep(0.1)
            command = cli + ["plan", "-f", experiment, "-o", "json"]
            if gpu_memory:
                command += ["--gpu-memory", gpu_memory]
            result = subprocess.run(command, capture_output=True, text=True, timeout=60)
        finally:
            server.terminate()
            server.wait(timeout=30)
        if result.returncode != 0:
            return {"memory_plan_mib": None,
                    "why": f"stemma plan exit {result.returncode}: {result.stderr.strip()[-500:]}"}
        cells = json.loads(result.stdout).get("cells", [])
        cell = next((c for c in cells if c.get("job_name") == "big"), None)
        if cell is None or not cell.get("memory_per_device_mb"):
            return {"memory_plan_mib": None, "why": "the plan has no memory estimate for the job"}
        return {"memory_plan_mib": int(cell["memory_per_device_mb"]),
                "memory_plan": cell.get("memory_plan", "")}
    except (OSError, ValueError, subprocess.SubprocessError) as e:
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
