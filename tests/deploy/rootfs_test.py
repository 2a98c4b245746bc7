#!/usr/bin/env python3
"""Runs the daemons inside the runtime file system the container files describe, so that a
shared library missing from deploy/images/runtime-packages.txt fails here rather than in a
cluster.

The root file system is Debian 12 (`mmdebstrap --variant=minbase`, the same as a slim image)
with exactly the packages of runtime-packages.txt, cached as a tarball under
~/.cache/stemma/rootfs/ (keyed by the package list), with the binaries of this build
copied into /usr/local/bin. Inside it, as in a pod: user 65532, a read-only root, tmpfs
for the data directories, its own mount and PID namespaces. The coordinator and a worker
start there, the CLI (also inside) submits jobs that run to SUCCEEDED, and both /metrics
answer; an online backup (sqlite3 .backup, as docs/operator-guide.md says) restored alone
on a fresh volume gives a coordinator that knows the same jobs. Then a library is removed from the tree and ldd must report it missing (so the
check can fail).

    rootfs_test.py --bin-dir DIR
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import tempfile
import time

import deploylib as lib

PACKAGES = lib.DEPLOY / "images" / "runtime-packages.txt"
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
BINARIES = ["stemma-coordinator", "stemma-worker", "stemma"]
UID = 65532


def packages() -> list[str]:
    out = []
    for line in PACKAGES.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            out.append(line)
    return out


def base_tarball() -> pathlib.Path:
    pkgs = packages()
    key = hashlib.sha256(f"{SUITE} minbase {' '.join(sorted(pkgs))}".encode()).hexdigest()[:16]
    cache = pathlib.Path(os.environ.get("STEMMA_CACHE", pathlib.Path.home() / ".cache" / "stemma")) / "rootfs"
    tarball = cache / f"debian-{SUITE}-minbase-{key}.tar"
    if tarball.exists():
        print(f"rootfs: cached {tarball}", flush=True)
        return tarball
    cache.mkdir(parents=True, exist_ok=True)
    partial = tarball.with_suffix(".partial.tar")
    cmd = [lib.tool("mmdebstrap"), "--variant=minbase", "--quiet",
           "--include=" + ",".join(pkgs), SUITE, str(partial), MIRROR]
    print("rootfs: " + " ".join(cmd), flush=True)
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"mmdebstrap failed ({r.returncode}):\n{r.stdout}{r.stderr}")
    partial.rename(tarball)
    return tarball


def in_root(root: pathlib.Path, argv: list[str], tmpfs: list[str], user: bool = True,
            binds: dict[str, pathlib.Path] | None = None) -> list[str]:
    """A command line that runs argv in root like a container: new mount and PID namespaces,
    the root read-only, /proc mounted, tmpfs on each of tmpfs and the host directories of
    binds (target -> host dir, a volume) writable, as UID (unless user=False)."""
    mounts = [f"mount --bind {root} {root}", f"mount -o remount,bind,ro {root}",
              f"mount -t proc proc {root}/proc"]
    mounts += [f"mount -t tmpfs -o mode=1777 tmpfs {root}{d}" for d in tmpfs]
    mounts += [f"mount --bind {host} {root}{target}" for target, host in (binds or {}).items()]
    spec = f"--userspec={UID}:{UID} " if user else ""
    script = " && ".join(mounts) + f" && exec chroot {spec}{root} \"$@\""
    return ["unshare", "--mount", "--pid", "--fork", "sh", "-c", script, "sh", *argv]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin-dir", required=True)
    args = parser.parse_args()
    bin_dir = pathlib.Path(args.bin_dir)
    if os.geteuid() != 0:
        print("rootfs_test: SKIP: needs root (mount namespace, chroot); CI runs as root", flush=True)
        raise SystemExit(77)
    f = lib.Failures()
    tarball = base_tarball()
    procs = lib.Processes()
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="stemma-rootfs-"))
    keep = False
    try:
        root = tmp / "root"
        root.mkdir()
        subprocess.run(["tar", "-xf", str(tarball), "-C", str(root)], check=True)
        for b in BINARIES:
            shutil.copy2(bin_dir / b, root / "usr" / "local" / "bin" / b)
        for d in ("var/lib/stemma", "var/lib/stemma-worker", "jobs"):
            (root / d).mkdir(parents=True, exist_ok=True)
        (root / "jobs" / "noop.yaml").write_text("\n---\n".join(
            f"name: rootfs-{i}\nnoop: {{duration_ms: 200}}\n" for i in range(5)))

        for b in BINARIES:
            r = lib.run(["chroot", str(root), "/usr/bin/ldd", f"/usr/local/bin/{b}"])
            missing = [l.strip() for l in r.stdout.splitlines() if "not found" in l]
            f.check(r.returncode == 0 and not missing, f"{b} in the runtime root: missing libraries {missing}\n{r.stderr}")

        grpc, cmetrics, chealth, wmetrics = (lib.free_port() for _ in range(4))
        coordinator_args = ["/usr/local/bin/stemma-coordinator", "--data=/var/lib/stemma",
                            f"--listen=127.0.0.1:{grpc}", f"--metrics-listen=127.0.0.1:{cmetrics}"]
        r = lib.run([str(bin_dir / "stemma-coordinator"), "--help"])
        if "--health-listen" in r.stdout:
            coordinator_args.append(f"--health-listen=127.0.0.1:{chealth}")
        # The database volume: a host directory owned by the pod's user, shared with the
        # backup below as a volume is with `kubectl exec`.
        volume = tmp / "coordinator-volume"
        volume.mkdir()
        os.chown(volume, UID, UID)
        db_volume = {"/var/lib/stemma": volume}
        coordinator = procs.start(in_root(root, coordinator_args, ["/tmp"], binds=db_volume), tmp / "coordinator.log")
        lib.wait_http(f"http://127.0.0.1:{cmetrics}/metrics", 20, coordinator)
        worker = procs.start(in_root(root, [
            "/usr/local/bin/stemma-worker", f"--coordinator=127.0.0.1:{grpc}",
            "--data=/var/lib/stemma-worker", "--name=rootfs-w0", "--gpus=1", "--cpus=2",
            f"--metrics-listen=127.0.0.1:{wmetrics}"], ["/var/lib/stemma-worker", "/tmp"]), tmp / "worker.log")
        text = lib.wait_http(f"http://127.0.0.1:{wmetrics}/metrics", 20, worker)
        f.check("stemma_worker_connected" in text, "the worker's /metrics has no stemma_worker_connected")

        cli = ["/usr/local/bin/stemma", f"--coordinator=127.0.0.1:{grpc}"]
        r = lib.run(in_root(root, cli + ["submit", "-f", "/jobs/noop.yaml"], ["/tmp"]))
        f.check(r.returncode == 0, f"stemma submit inside the root failed: {r.stdout}{r.stderr}")
        states: list[str] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            r = lib.run(in_root(root, cli + ["-o", "json", "ls"], ["/tmp"]))
            if r.returncode == 0 and r.stdout.strip():
                data = json.loads(r.stdout)
                jobs = data.get("jobs", data) if isinstance(data, dict) else data
                states = sorted(j.get("state", "?") for j in jobs)
                if states and all(s == "SUCCEEDED" for s in states):
                    break
            time.sleep(0.5)
        f.check(states == ["SUCCEEDED"] * 5, f"jobs run inside the root ended {states}, want 5 SUCCEEDED")
        text = lib.http_get(f"http://127.0.0.1:{cmetrics}/metrics")
        f.check('stemma_coordinator_workers{state="alive"} 1' in text, "the coordinator does not see its worker alive")
        # The operator guide's online backup, while the coordinator runs: sqlite3's .backup
        # inside the coordinator's file system, then the copy checked and counted.
        backup = ("sqlite3 /var/lib/stemma/stemma.db '.backup /var/lib/stemma/backup.db' && "
                  "sqlite3 /var/lib/stemma/backup.db 'PRAGMA integrity_check' 'SELECT count(*) FROM jobs'")
        r = lib.run(in_root(root, ["/bin/sh", "-c", backup], ["/tmp"], binds=db_volume))
        f.check(r.returncode == 0 and r.stdout.split() == ["ok", "5"],
                f"online backup in the runtime root: {r.returncode} {r.stdout!r} {r.stderr!r}")
        for p in (worker, coordinator):
            f.check(p.poll() is None, f"{p.args[-1]} exited early")
        procs.stop_all()

        # Restore: the backup alone on a fresh volume; a coordinator started on it knows the
        # five jobs.
        restored = tmp / "restored-volume"
        restored.mkdir()
        shutil.copy2(volume / "backup.db", restored / "stemma.db")
        for path in (restored, restored / "stemma.db"):
            os.chown(path, UID, UID)
        grpc2, metrics2 = lib.free_port(), lib.free_port()
        again = procs.start(in_root(root, ["/usr/local/bin/stemma-coordinator", "--data=/var/lib/stemma",
                                           f"--listen=127.0.0.1:{grpc2}", f"--metrics-listen=127.0.0.1:{metrics2}"],
                                    ["/tmp"], binds={"/var/lib/stemma": restored}), tmp / "restored.log")
        lib.wait_http(f"http://127.0.0.1:{metrics2}/metrics", 20, again)
        r = lib.run(in_root(root, ["/usr/local/bin/stemma", f"--coordinator=127.0.0.1:{grpc2}", "-o", "json", "ls"], ["/tmp"]))
        names = sorted(j["name"] for j in json.loads(r.stdout)) if r.returncode == 0 else r.stderr
        f.check(names == [f"rootfs-{i}" for i in range(5)], f"the restored coordinator lists {names}")
        procs.stop_all()
        for name in ("coordinator", "worker"):
            log = (tmp / f"{name}.log").read_text(errors="replace")
            f.check("error while loading shared libraries" not in log, f"{name}: {log[-500:]}")

        # The check must be able to fail: without SQLite's library, ldd says so and the
        # coordinator does not start.
        for lib_file in list((root / "usr" / "lib" / "x86_64-linux-gnu").glob("libsqlite3.so*")):
            lib_file.unlink()
        r = lib.run(["chroot", str(root), "/usr/bin/ldd", "/usr/local/bin/stemma-coordinator"])
        f.check("libsqlite3.so.0 => not found" in r.stdout, f"ldd did not notice a removed library:\n{r.stdout}")
        r = lib.run(in_root(root, ["/usr/local/bin/stemma-coordinator", "--help"], ["/tmp"]))
        f.check(r.returncode != 0 and "libsqlite3" in r.stderr, f"the coordinator ran without libsqlite3: {r.returncode}")
        keep = bool(f.items)
    finally:
        procs.stop_all()
        if keep:
            print(f"kept {tmp} (logs: coordinator.log, worker.log)", flush=True)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    f.exit("rootfs_test")


if __name__ == "__main__":
    main()
