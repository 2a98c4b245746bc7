"""`stemma plan` on a private coordinator, for scripts that want the memory plan of a spec.

    import private_plan
    cells = private_plan.plan_cells(BIN_DIR, EXPERIMENT_FILE)           # {job_name: cell}
    cells = private_plan.plan_cells(BIN_DIR, EXPERIMENT_FILE, "141GiB")  # --gpu-memory

Starts `stemma-coordinator` from BIN_DIR on a free loopback port with a database in a
temporary directory, waits until `stemma ls` answers, runs `stemma plan -f EXPERIMENT_FILE -o
json` and stops the coordinator again. The CLI runs with HOME = that temporary directory and
without the developer's STEMMA_* settings, so no ~/.config/stemma (config, token, CA) reaches
it and it writes nothing into the real HOME. Raises PlanError saying why when a binary is not
built, the coordinator does not answer or the plan fails.

Used by tests/bench/sharded_bench.py, tests/gpu/memory_plan.py and tests/check_memory_plan.py.
"""
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time


class PlanError(RuntimeError):
    """The plan could not be made (the message says why)."""


def missing_binaries(bin_dir):
    """The control-plane binaries the plan needs that BIN_DIR lacks (empty when none)."""
    return [b for b in ("stemma-coordinator", "stemma")
            if not os.access(os.path.join(bin_dir, b), os.X_OK)]


def plan_cells(bin_dir, experiment, gpu_memory="", timeout=60):
    """The plan's cells for the experiment file `experiment`, by job name."""
    missing = missing_binaries(bin_dir)
    if missing:
        raise PlanError(f"{', '.join(missing)} not built in {bin_dir}")
    work = tempfile.mkdtemp(prefix="stemma-private-plan.")
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEMMA_")}
    env["HOME"] = work
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        addr = f"127.0.0.1:{sock.getsockname()[1]}"
    server = subprocess.Popen([os.path.join(bin_dir, "stemma-coordinator"), "--listen", addr,
                               "--data", os.path.join(work, "coord")],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        cli = [os.path.join(bin_dir, "stemma"), "--coordinator", addr]
        deadline = time.monotonic() + timeout
        while subprocess.run(cli + ["ls"], capture_output=True, env=env,
                             timeout=timeout).returncode != 0:
            if server.poll() is not None:
                raise PlanError(f"stemma-coordinator exited {server.returncode} at start")
            if time.monotonic() > deadline:
                raise PlanError(f"stemma-coordinator on {addr} does not answer `stemma ls` "
                                f"after {timeout} s")
            time.sleep(0.1)
        command = cli + ["plan", "-f", experiment, "-o", "json"]
        if gpu_memory:
            command += ["--gpu-memory", gpu_memory]
        result = subprocess.run(command, capture_output=True, text=True, env=env,
                                timeout=timeout)
        if result.returncode != 0:
            raise PlanError(f"stemma plan exit {result.returncode}: "
                            f"{result.stderr.strip()[-500:]}")
        try:
            return {c["job_name"]: c for c in json.loads(result.stdout).get("cells", [])}
        except (ValueError, KeyError) as e:
            raise PlanError(f"stemma plan -o json: unreadable output ({e})") from e
    except (OSError, subprocess.SubprocessError) as e:
        raise PlanError(str(e)[-500:]) from e
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        shutil.rmtree(work, ignore_errors=True)
