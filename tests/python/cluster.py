"""A real Stemma cluster on loopback for the Python client's tests and benchmark: the
coordinator and workers from a build's bin directory as separate processes, in a fresh
temporary directory, each started with PR_SET_PDEATHSIG so it dies with the test (as
tests/integration/cluster.cc does for the C++ tests). Also installs the client the way a
user does, `pip install ./python` (without build isolation: the venv that scripts/setup
makes already has grpcio-tools, so nothing is downloaded), into that directory.

Standard library only: the test imports `stemma` after install_client() put it on sys.path."""

import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SKIP = 77  # CTest's SKIP_RETURN_CODE for these tests


def _die_with_parent():
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def install_client(dest):
    """`pip install ./python` from a copy of the checkout's python/ and proto/ (so that the
    build leaves nothing in the source tree) into dest/site; puts it first on sys.path."""
    src = os.path.join(dest, "src")
    shutil.copytree(os.path.join(REPO, "python"), os.path.join(src, "python"),
                    ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    shutil.copytree(os.path.join(REPO, "proto"), os.path.join(src, "proto"))
    site = os.path.join(dest, "site")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
         "--no-build-isolation", "--no-deps", "--no-index", "--target", site,
         os.path.join(src, "python")], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError("pip install ./python failed:\n" + done.stdout + done.stderr)
    sys.path.insert(0, site)
    return site


def skip_unless_venv_has(*modules):
    """Exit 77 (skipped) naming what is missing: the peers come from scripts/setup's venv."""
    import importlib.util

    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        print(f"skipped: {sys.executable} lacks {', '.join(missing)} (run scripts/setup; the "
              "tests run with ~/.cache/stemma/venv-python/bin/python)")
        sys.exit(SKIP)


class Cluster:
    def __init__(self, bin_dir, tls=False, tokens=False, keep=False):
        self.bin = os.path.abspath(bin_dir)
        self.dir = tempfile.mkdtemp(prefix="stemma-py-")
        self.keep = keep
        self.address = f"127.0.0.1:{free_port()}"
        self.metrics_address = f"127.0.0.1:{free_port()}"
        self.procs = {}
        self.ca = self._make_certs() if tls else None
        self.tokens_file = os.path.join(self.dir, "tokens") if tokens else None
        self.admin_token = self.create_token("admin", "py-admin") if tokens else ""

    # ---------------------------------------------------------------- security
    def _make_certs(self):
        d = self.dir
        with open(os.path.join(d, "san.ext"), "w") as f:
            f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
        ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"
        cmd = (f"cd {d} && openssl req -x509 {ec} -keyout ca.key -out ca.pem -days 2 "
               f"-subj /CN=stemma-py-test-ca && openssl req {ec} -keyout server.key "
               f"-out server.csr -subj /CN=localhost && openssl x509 -req -in server.csr "
               f"-CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem -days 2 "
               f"-extfile san.ext")
        subprocess.run(cmd, shell=True, check=True, capture_output=True)
        os.chmod(os.path.join(d, "server.key"), 0o600)
        return os.path.join(d, "ca.pem")

    def create_token(self, role, subject):
        done = subprocess.run([os.path.join(self.bin, "stemma"), "token", "create", "--role",
                               role, "--subject", subject, "--file", self.tokens_file],
                              capture_output=True, text=True, check=True)
        return done.stdout.strip()

    def write_secret(self, name, text):
        path = os.path.join(self.dir, name)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text + "\n")
        return path

    # ---------------------------------------------------------------- processes
    def _spawn(self, name, argv, env=None):
        log = open(os.path.join(self.dir, name + ".log"), "ab")
        self.procs[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, cwd=self.dir,
                                            env=env, preexec_fn=_die_with_parent)
        log.close()

    def start_coordinator(self, *extra):
        argv = [os.path.join(self.bin, "stemma-coordinator"), "--data",
                os.path.join(self.dir, "coordinator"), "--listen", self.address,
                "--metrics-listen", self.metrics_address, "--lease-ms", "1500",
                "--heartbeat-ms", "300"]
        if self.ca:
            argv += ["--tls-cert", os.path.join(self.dir, "server.pem"), "--tls-key",
                     os.path.join(self.dir, "server.key")]
        if self.tokens_file:
            argv += ["--tokens", self.tokens_file]
        self._spawn("coordinator", argv + list(extra))
        self.wait_until(lambda: self.cli("workers", "-o", "json").returncode == 0, 20,
                        "the coordinator did not start")

    def kill_coordinator(self):
        """SIGKILL, as a crash: start_coordinator() brings it back on the same port and data."""
        p = self.procs.pop("coordinator")
        p.kill()
        p.wait()

    def start_worker(self, name, cpus=8, allow_exec=True, extra=(), env=None):
        data = os.path.join(self.dir, "worker-" + name)
        argv = [os.path.join(self.bin, "stemma-worker"), "--coordinator", self.address,
                "--data", data, "--name", name, "--gpus", "0", "--cpus", str(cpus),
                "--kill-grace-ms", "500"]
        if allow_exec:
            argv.append("--allow-exec")
        if self.ca:
            argv += ["--ca", self.ca]
        if self.tokens_file:
            token = self.create_token("worker", name)
            argv += ["--token-file", self.write_secret("token-" + name, token)]
        self._spawn("worker-" + name, argv + list(extra), env)

    def wait_for_workers(self, n):
        def alive():
            r = self.cli("workers", "-o", "json")
            return r.returncode == 0 and sum(
                w.get("state") == "WORKER_ALIVE" or w.get("state") == "ALIVE"
                for w in json.loads(r.stdout)) >= n
        self.wait_until(alive, 30, "the workers did not register")

    def wait_until(self, predicate, timeout_s, what):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if predicate():
                return
            time.sleep(0.1)
        raise RuntimeError(f"{what} within {timeout_s} s; logs in {self.dir}:\n" + self.logs())

    def logs(self):
        out = []
        for name in self.procs:
            path = os.path.join(self.dir, name + ".log")
            with open(path, errors="replace") as f:
                out.append(f"--- {name} (last lines)\n" + "".join(f.readlines()[-15:]))
        return "\n".join(out)

    def cli(self, *args, token=None, env=None):
        """`stemma --coordinator ADDR args...` as the admin (with tokens)."""
        e = dict(os.environ if env is None else env)
        for k in ("STEMMA_TOKEN", "STEMMA_TOKEN_FILE", "STEMMA_CA", "STEMMA_COORDINATOR"):
            e.pop(k, None)
        e["STEMMA_CONFIG"] = os.devnull
        token = self.admin_token if token is None else token
        if token:
            e["STEMMA_TOKEN"] = token
        if self.ca:
            e["STEMMA_CA"] = self.ca
        return subprocess.run([os.path.join(self.bin, "stemma"), "--coordinator", self.address,
                               *args], capture_output=True, text=True, env=e, check=False)

    def close(self, failed=False):
        for p in self.procs.values():
            if p.poll() is None:
                p.terminate()
        for p in self.procs.values():
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if failed or self.keep:
            print(f"kept {self.dir}")
        else:
            shutil.rmtree(self.dir, ignore_errors=True)
