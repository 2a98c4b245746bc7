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

What each image holds is read from its container file (deploy/images/*.Dockerfile: the
package lists its final stage installs, the files it copies from /build/bin), so every
binary and library of every image is checked in a root with exactly that image's packages.
The coordinator and worker images share runtime-packages.txt and run in the tree above. The
worker-cuda image (runtime and engine-runtime packages; stemma-worker, stemma-engine and the
stemma-engine-torch it execs, libstemma_sentencepiece.so) gets a tree of its own when this build has the engine: ldd of
every file (the sentencepiece library is dlopened beside the engine, so ldd is what checks
it), stemma-engine initialising and verifying a model there, and a worker inside the tree
running an init job for a coordinator outside it. LibTorch is this build's (the CPU wheel),
bind-mounted at the engine's RUNPATH as the image copies the CUDA wheel's to its own; the
CUDA libraries themselves can only be checked on a GPU node. Without the engine that part
is skipped (and says so).

    rootfs_test.py --bin-dir DIR
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import pathlib
import re
import shutil
import subprocess
import tempfile
import time

import deploylib as lib

IMAGES = lib.DEPLOY / "images"
PACKAGES = IMAGES / "runtime-packages.txt"
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
UID = 65532


def image_contents() -> dict[str, dict[str, list[str]]]:
    """Per container file (by name without .Dockerfile): the package lists its final stage
    installs, the /build/bin files it copies in, and the other trees it copies from the build
    stage (LibTorch and the CUDA libraries of the torch wheel)."""
    out = {}
    for path in sorted(IMAGES.glob("*.Dockerfile")):
        text = path.read_text()
        final = text[text.rindex("\nFROM "):]
        lists = re.findall(r"deploy/images/([\w.-]+-packages\.txt)", final)
        files, trees = [], []
        for m in re.finditer(r"^COPY --from=build (.+)$", final, re.M):
            srcs = m.group(1).split()[:-1]
            files += [s.rsplit("/", 1)[1] for s in srcs if s.startswith("/build/bin/")]
            trees += [s for s in srcs if not s.startswith("/build/bin/")]
        out[path.name.removesuffix(".Dockerfile")] = {"packages": lists, "files": files, "trees": trees}
    return out


def packages(lists: list[str]) -> list[str]:
    out = []
    for name in lists:
        for line in (IMAGES / name).read_text().splitlines():
            line = line.split("#", 1)[0].strip()
            if line and line not in out:
                out.append(line)
    return out


def base_tarball(pkgs: list[str]) -> pathlib.Path:
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


def runpath_dirs(binary: pathlib.Path) -> list[pathlib.Path]:
    """The RUNPATH/RPATH directories of an ELF file that exist on this machine."""
    r = lib.run(["readelf", "-d", str(binary)])
    out = []
    for m in re.finditer(r"\((?:RUNPATH|RPATH)\)\s+Library r(?:un)?path: \[(.*)\]", r.stdout):
        out += [pathlib.Path(d) for d in m.group(1).split(":") if d and pathlib.Path(d).is_dir()]
    return out


def check_engine_image(bin_dir: pathlib.Path, image: dict, tmp: pathlib.Path, procs: lib.Processes,
                       f: lib.Failures) -> None:
    f.check({"stemma-worker", "stemma-engine", "stemma-engine-torch", "libstemma_sentencepiece.so"}
            <= set(image["files"]),
            f"worker-cuda.Dockerfile copies {image['files']}")
    f.check(image["packages"] == ["runtime-packages.txt", "engine-runtime-packages.txt"],
            f"worker-cuda.Dockerfile installs {image['packages']}")
    tarball = base_tarball(packages(image["packages"]))
    root = tmp / "root-cuda"
    root.mkdir()
    subprocess.run(["tar", "-xf", str(tarball), "-C", str(root)], check=True)
    for b in image["files"]:
        shutil.copy2(bin_dir / b, root / "usr" / "local" / "bin" / b)
    # The trees the image copies from its torch venv (torch/lib, nvidia/), taken from this
    # build's venv (the one the engine's RUNPATH names) and bind-mounted read-only at the
    # same paths, as the image keeps its venv's paths. The directories above them are made
    # traversable for the pod's user (/root is 0700 in Debian; the image's /opt/torch is not).
    torch_lib = next((d for d in runpath_dirs(bin_dir / "stemma-engine-torch")
                      if d.as_posix().endswith("site-packages/torch/lib")), None)
    image_torch_lib = next((s for s in image["trees"] if s.endswith("site-packages/torch/lib")), None)
    binds = {}
    if f.check(torch_lib is not None and image_torch_lib is not None,
               f"stemma-engine-torch's RUNPATH has no torch/lib ({torch_lib}) or the image copies none ({image['trees']})"):
        local_venv = pathlib.Path(torch_lib.as_posix()[:-len("lib/python3.11/site-packages/torch/lib")])
        image_venv = image_torch_lib[:-len("lib/python3.11/site-packages/torch/lib")]
        for tree in image["trees"]:
            f.check(tree.startswith(image_venv), f"worker-cuda copies {tree}, outside its torch venv {image_venv}")
            d = local_venv / tree[len(image_venv):]
            if not f.check(d.exists(), f"worker-cuda copies {tree}; this build's venv has no {d}"):
                continue
            target = root / d.relative_to("/")
            if d.is_dir():
                target.mkdir(parents=True, exist_ok=True)
            else:  # a single library (pyarrow's Arrow and Parquet): bind-mounted onto a file
                target.parent.mkdir(parents=True, exist_ok=True)
                target.touch()
            for parent in [target, *target.parents]:
                if parent == root:
                    break
                parent.chmod(0o755)
            binds[str(d)] = d
    for d in ("var/lib/stemma-worker",):
        (root / d).mkdir(parents=True, exist_ok=True)
    for b in image["files"]:
        r = lib.run(in_root(root, ["/usr/bin/ldd", f"/usr/local/bin/{b}"], ["/tmp"], user=False, binds=binds))
        missing = [l.strip() for l in r.stdout.splitlines() if "not found" in l]
        f.check(r.returncode == 0 and not missing,
                f"worker-cuda: {b} in its runtime root: missing libraries {missing}\n{r.stderr}")
    # LibTorch for real, as the pod's user: a tiny model initialised and checked.
    script = ("/usr/local/bin/stemma-engine init --preset tiny --seed 1 --out /tmp/m >/dev/null && "
              "/usr/local/bin/stemma-engine verify /tmp/m")
    r = lib.run(in_root(root, ["/bin/sh", "-c", script], ["/tmp"], binds=binds), timeout=300)
    f.check(r.returncode == 0, f"worker-cuda: stemma-engine init + verify in the root: {r.returncode}\n{r.stdout[-800:]}{r.stderr[-800:]}")

    # The image's worker, inside the tree, runs an engine job for a coordinator outside it.
    grpc, cmetrics, wmetrics = lib.free_port(), lib.free_port(), lib.free_port()
    coordinator = procs.start([str(bin_dir / "stemma-coordinator"), f"--data={tmp}/cuda-coordinator",
                               f"--listen=127.0.0.1:{grpc}", f"--metrics-listen=127.0.0.1:{cmetrics}"],
                              tmp / "cuda-coordinator.log")
    lib.wait_http(f"http://127.0.0.1:{cmetrics}/metrics", 20, coordinator)
    worker = procs.start(in_root(root, [
        "/usr/local/bin/stemma-worker", f"--coordinator=127.0.0.1:{grpc}", "--data=/var/lib/stemma-worker/data",
        "--storage-root=/var/lib/stemma-worker", "--name=rootfs-cuda", "--gpus=0", "--cpus=2",
        f"--metrics-listen=127.0.0.1:{wmetrics}"], ["/var/lib/stemma-worker", "/tmp"], binds=binds),
        tmp / "cuda-worker.log")
    lib.wait_http(f"http://127.0.0.1:{wmetrics}/metrics", 20, worker)
    (tmp / "init.yaml").write_text("name: rootfs-init\ninit: {preset: tiny, seed: 2, out: model-tiny}\n")
    cli = [str(bin_dir / "stemma"), f"--coordinator=127.0.0.1:{grpc}"]
    r = lib.run(cli + ["submit", "-f", str(tmp / "init.yaml")])
    f.check(r.returncode == 0, f"worker-cuda: stemma submit init.yaml: {r.stdout}{r.stderr}")
    r = lib.run(cli + ["wait", "rootfs-init", "--timeout-s", "240"])
    job = lib.run(cli + ["get", "rootfs-init", "-o", "json"])
    f.check(r.returncode == 0, f"worker-cuda: the init job run by the image's worker did not succeed: "
                               f"{job.stdout[-1500:]}{job.stderr}")
    procs.stop(worker)
    procs.stop(coordinator)
    log = (tmp / "cuda-worker.log").read_text(errors="replace")
    f.check("error while loading shared libraries" not in log, f"worker-cuda worker: {log[-500:]}")

    # The check must be able to fail: without Debian's libsentencepiece, ldd of the shim the
    # engine dlopens says so.
    for lib_file in list((root / "usr" / "lib" / "x86_64-linux-gnu").glob("libsentencepiece.so*")):
        lib_file.unlink()
    r = lib.run(in_root(root, ["/usr/bin/ldd", "/usr/local/bin/libstemma_sentencepiece.so"], ["/tmp"], user=False))
    f.check("libsentencepiece.so.0 => not found" in r.stdout, f"ldd did not notice a removed library:\n{r.stdout}")
    shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin-dir", required=True)
    args = parser.parse_args()
    bin_dir = pathlib.Path(args.bin_dir)
    if os.geteuid() != 0:
        print("rootfs_test: SKIP: needs root (mount namespace, chroot); CI runs as root", flush=True)
        raise SystemExit(77)
    f = lib.Failures()
    images = image_contents()
    f.check(sorted(images) == ["coordinator", "worker", "worker-cuda"], f"container files: {sorted(images)}")
    # The coordinator and worker images: one tree with runtime-packages.txt, their files in it.
    binaries: list[str] = []
    for name in ("coordinator", "worker"):
        f.check(images.get(name, {}).get("packages") == ["runtime-packages.txt"],
                f"{name}.Dockerfile installs {images.get(name, {}).get('packages')}, not runtime-packages.txt")
        binaries += [b for b in images.get(name, {}).get("files", []) if b not in binaries]
    f.check({"stemma-coordinator", "stemma-worker", "stemma"} <= set(binaries),
            f"the images copy {binaries}: the daemons and the CLI should be among them")
    tarball = base_tarball(packages(["runtime-packages.txt"]))
    procs = lib.Processes()
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="stemma-rootfs-"))
    keep = False
    try:
        root = tmp / "root"
        root.mkdir()
        subprocess.run(["tar", "-xf", str(tarball), "-C", str(root)], check=True)
        for b in binaries:
            shutil.copy2(bin_dir / b, root / "usr" / "local" / "bin" / b)
        for d in ("var/lib/stemma", "var/lib/stemma-worker", "jobs"):
            (root / d).mkdir(parents=True, exist_ok=True)
        (root / "jobs" / "noop.yaml").write_text("\n---\n".join(
            f"name: rootfs-{i}\nnoop: {{duration_ms: 200}}\n" for i in range(5)))

        for b in binaries:
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
        shutil.rmtree(root, ignore_errors=True)

        cuda = images.get("worker-cuda", {"packages": [], "files": []})
        missing = [b for b in cuda["files"] if not (bin_dir / b).exists()]
        if missing:
            print(f"rootfs_test: worker-cuda image not checked: {missing} not in {bin_dir} "
                  "(a build without the engine)", flush=True)
        else:
            check_engine_image(bin_dir, cuda, tmp, procs, f)
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
