"""The Python client (python/, docs/python.md) against a real coordinator and real workers:
installed with `pip install ./python` (its gRPC modules generated from proto/ at that
moment), over TLS with bearer tokens as a cluster runs it, every method a notebook uses, the
typed errors with the coordinator's messages, and the same numbers as the CLI's `-o json`.

    client_test.py BIN_DIR      (run by CTest as python_client; exit 77 = skipped)"""

import json
import os
import sys
import textwrap
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster as harness  # noqa: E402

BIN = None
STUDY = """\
name: py-study
stages:
  base:
    exec: {{argv: [/usr/bin/python3, "{dir}/emit.py", --steps, "5", --out, "{out}/base.bin",
                  --operation, init]}}
  cpt:
    needs: [base]
    matrix: {{lr: ["1", "2"]}}
    labels: {{family: slavic}}
    exec:
      argv: [/usr/bin/python3, "{dir}/emit.py", --steps, "{steps}", --lr, "${{{{ matrix.lr }}}}",
             --out, "{out}/cpt-${{{{ matrix.lr }}}}.bin", --parent, "{out}/base.bin"]
      inputs: ["{out}/base.bin"]  # a registered input: the parent of what it reports
"""
STEPS = 40  # per cpt cell: 2 series per step line
# A report needs eval cells, which need the engine: a base model, two tokenized languages
# and a perplexity eval (tests/integration/report_test.cc runs a larger one).
ENGINE_STUDY = """\
name: py-report
stages:
  base:
    init: {{arch: llama, preset: tiny, seed: 3}}
  tok:
    needs: [base]
    matrix: {{language: [en, ru]}}
    tokenize:
      tokenizer: "${{{{ needs.base.outputs.model }}}}"
      input: ["{dir}/${{{{ matrix.language }}}}.txt"]
      format: text
      line_docs: true
      language: "${{{{ matrix.language }}}}"
  eval-base:
    needs: [base, tok]
    eval:
      model: "${{{{ needs.base.outputs.model }}}}"
      tasks:
        - {{type: perplexity, language: "${{{{ needs.tok.matrix.language }}}}",
           data: "${{{{ needs.tok.outputs.dataset }}}}", heldout_fraction: 0.2, limit: 4}}
"""


def engine_binary():
    for path in (os.path.join(BIN, "stemma-engine"), os.environ.get("STEMMA_ENGINE", "")):
        if path and os.access(path, os.X_OK):
            return os.path.abspath(path)  # the worker runs in the cluster's directory
    return None


class ClientTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.c = harness.Cluster(BIN, tls=True, tokens=True)
        try:
            harness.install_client(cls.c.dir)
            import stemma

            cls.stemma = stemma
            # Made before the coordinator starts: it rereads the token file at most once a second.
            cls.reader_token = cls.c.create_token("read-only", "py-reader")
            cls.c.start_coordinator()
            engine = engine_binary()
            cls.c.start_worker("w1", cpus=4, extra=["--engine", engine] if engine else [])
            cls.c.start_worker("w2", cpus=4, extra=["--engine", engine] if engine else [])
            cls.c.wait_for_workers(2)
            cls.client = stemma.Client(cls.c.address, token=cls.c.admin_token, ca=cls.c.ca,
                                       cli=os.path.join(BIN, "stemma"))
            with open(os.path.join(harness.REPO, "tests", "python", "emit.py")) as f:
                emit = f.read()
            with open(os.path.join(cls.c.dir, "emit.py"), "w") as f:
                f.write(emit)
            # With tokens, an exec job writes only below its owner's prefix of the storage
            # root (docs/tenancy.md); the worker's storage root is the cluster's directory.
            cls.out = os.path.join(cls.c.dir, "py-admin", "out")
            cls.study = STUDY.format(dir=cls.c.dir, out=cls.out, steps=STEPS)
        except BaseException:
            cls.c.close(failed=True)
            raise

    @classmethod
    def tearDownClass(cls):
        cls.c.close(failed=Result.failed)

    def run_study(self):
        """The study, submitted once and waited for (the tests that read it share it)."""
        if not getattr(type(self), "study_done", None):
            self.client.sweep(self.study)
            type(self).study_done = self.client.wait(experiment="py-study", timeout=120,
                                                     check=True)
        return type(self).study_done

    # ------------------------------------------------------------------ connection

    def test_defaults_come_from_the_cli_environment_and_config(self):
        env = dict(os.environ)
        token_file = self.c.write_secret("admin-token", self.c.admin_token)
        try:
            os.environ.update(STEMMA_COORDINATOR=self.c.address, STEMMA_TOKEN_FILE=token_file,
                              STEMMA_CA=self.c.ca, STEMMA_CONFIG=os.devnull)
            os.environ.pop("STEMMA_TOKEN", None)
            self.assertEqual(len(self.stemma.Client().workers()), 2)
            # The CLI's config file: the current context names the server, CA and token file.
            config = os.path.join(self.c.dir, "config.yaml")
            with open(config, "w") as f:
                f.write(textwrap.dedent(f"""\
                    current-context: lab
                    contexts:
                    - name: other
                      server: 127.0.0.1:1
                    - name: lab
                      server: {self.c.address}
                      ca: {self.c.ca}
                      token-file: {token_file}
                    """))
            for k in ("STEMMA_COORDINATOR", "STEMMA_TOKEN_FILE", "STEMMA_CA"):
                del os.environ[k]
            os.environ["STEMMA_CONFIG"] = config
            self.assertEqual(self.stemma.Client().address, self.c.address)
            self.assertEqual(len(self.stemma.Client().workers()), 2)
            # The environment beats the current context; a context named explicitly beats both.
            os.environ["STEMMA_COORDINATOR"] = "127.0.0.1:2"
            self.assertEqual(self.stemma.Client().address, "127.0.0.1:2")
            self.assertEqual(self.stemma.Client(context="lab").address, self.c.address)
            self.assertEqual(self.stemma.Client(context="other").address, "127.0.0.1:1")
            with self.assertRaises(self.stemma.NotFound):
                self.stemma.Client(context="nowhere")
            del os.environ["STEMMA_COORDINATOR"]
            # A token file others may read is refused, as the CLI refuses it.
            os.chmod(token_file, 0o644)
            with self.assertRaises(self.stemma.PermissionDenied) as e:
                self.stemma.Client()
            self.assertIn("chmod 600", str(e.exception))
        finally:
            os.environ.clear()
            os.environ.update(env)

    def test_a_token_is_never_sent_in_clear_text_off_the_machine(self):
        with self.assertRaises(self.stemma.FailedPrecondition) as e:
            self.stemma.Client("203.0.113.7:7070", token="stm_x", ca=None)
        self.assertIn("clear text", str(e.exception))

    def test_errors_are_typed_and_carry_the_coordinators_message(self):
        s = self.stemma
        with self.assertRaises(s.NotFound) as e:
            self.client.job("j-987654")
        self.assertIn("j-987654", e.exception.message)
        self.assertEqual(e.exception.code, "NOT_FOUND")
        # Refused by the coordinator (the client does not check exec environments).
        with self.assertRaises(s.InvalidArgument) as e:
            self.client.submit({"name": "bad", "exec": {"argv": ["/bin/true"],
                                                        "env": {"PATH": "/tmp"}}})
        self.assertIn("exec.env.PATH", str(e.exception))
        # Refused while reading, naming the field as the CLI does.
        with self.assertRaises(s.InvalidArgument) as e:
            self.client.submit("name: bad\nnoop: {duration_ms: soon}\n")
        self.assertIn("noop.duration_ms: must be an integer", str(e.exception))
        reader = s.Client(self.c.address, token=self.reader_token, ca=self.c.ca)
        self.assertEqual(len(reader.workers()), 2)
        with self.assertRaises(s.PermissionDenied):
            reader.submit({"name": "nope", "noop": {}})
        with self.assertRaises(s.Unauthenticated):
            s.Client(self.c.address, token="stm_not-a-token", ca=self.c.ca).workers()
        closed = f"127.0.0.1:{harness.free_port()}"
        with self.assertRaises(s.Unavailable) as e:
            s.Client(closed, timeout=2).jobs()
        self.assertIn(closed, str(e.exception))

    # ------------------------------------------------------------------ jobs

    def test_submit_wait_logs_and_list_jobs(self):
        ids = self.client.submit(textwrap.dedent(f"""\
            name: py-hello
            labels: {{suite: py}}
            exec: {{argv: [/usr/bin/python3, "{self.c.dir}/emit.py", --steps, "3"]}}
            ---
            name: py-after
            labels: {{suite: py}}
            depends_on: [py-hello]
            noop: {{duration_ms: 1e2}}
            """))
        self.assertEqual(len(ids), 2)
        jobs = self.client.wait(ids, timeout=60, check=True)
        self.assertEqual([j["state"] for j in jobs], ["SUCCEEDED", "SUCCEEDED"])
        self.assertEqual(jobs[1]["spec"]["noop"]["duration_ms"], 100)
        self.assertIn("hello from the job", self.client.logs(ids[0]))
        self.assertEqual(self.client.job("py-hello")["id"], ids[0])  # a name works as an id
        listed = self.client.jobs(labels={"suite": "py"}, state="SUCCEEDED")
        self.assertEqual(sorted(j["id"] for j in listed), sorted(ids))
        # The same idempotency key gives the same jobs, never new ones.
        again = [self.client.submit({"name": "once", "noop": {}}, idempotency_key="py-k1")
                 for _ in range(2)]
        self.assertEqual(again[0], again[1])
        # A failure is an answer: check=True raises JobFailed naming the job.
        failing = self.client.submit({"name": "py-fails", "max_attempts": 1,
                                      "noop": {"exit_code": 3}})
        with self.assertRaises(self.stemma.JobFailed) as e:
            self.client.wait(failing, timeout=60, check=True)
        self.assertEqual(e.exception.jobs[0]["state"], "FAILED")

    def test_watch_yields_events_until_the_jobs_end(self):
        ids = self.client.submit([{"name": "py-watched", "noop": {"duration_ms": 300}}])
        events = list(self.client.watch(ids, timeout=60))
        states = [e["job"]["state"] for e in events]
        self.assertEqual(states[-1], "SUCCEEDED")
        self.assertTrue(all(e["job"]["id"] == ids[0] for e in events))
        self.assertIn("RUNNING", [e["previous"] for e in events] + states)
        with self.assertRaises(self.stemma.DeadlineExceeded):
            long = self.client.submit({"name": "py-long", "noop": {"duration_ms": 60000}})
            list(self.client.watch(long, timeout=0.5))
        self.client.cancel(long[0], reason="test over")

    def test_files_by_path_and_logs_followed_to_the_end(self):
        path = os.path.join(self.c.dir, "follow.yaml")
        with open(path, "w") as f:
            f.write("name: py-follow\nexec: {argv: [/bin/sh, -c, "
                    "'for i in 1 2 3; do echo line $i; sleep 0.2; done']}\n")
        (job,) = self.client.submit(path)
        self.assertEqual(self.client.job(job)["spec"]["name"], "py-follow")
        text = "".join(self.client.stream_logs(job, follow=True))
        self.assertEqual([l for l in text.splitlines() if l.startswith("line")],
                         ["line 1", "line 2", "line 3"])
        study = os.path.join(self.c.dir, "py-by-path.yaml")
        with open(study, "w") as f:
            f.write("name: py-by-path\nstages:\n  a: {noop: {}}\n")
        got = self.client.sweep(study)
        self.assertEqual(got["experiment"]["name"], "py-by-path")
        self.assertEqual(len(self.client.wait(experiment="py-by-path", timeout=60, check=True)), 1)

    def test_watch_survives_a_coordinator_restart(self):
        ids = self.client.submit({"name": "py-through-restart", "noop": {"duration_ms": 1500}})
        events = self.client.watch(ids, timeout=120)
        first = next(events)
        self.assertEqual(first["job"]["id"], ids[0])
        self.c.kill_coordinator()
        self.c.start_coordinator()
        rest = list(events)
        self.assertEqual(rest[-1]["job"]["state"], "SUCCEEDED")
        self.assertEqual(self.client.job(ids[0])["state"], "SUCCEEDED")

    # ------------------------------------------------------------------ experiments

    def test_plan_submits_nothing_and_sweep_runs_the_study(self):
        plan = self.client.plan(self.study)
        self.assertEqual([c["job_name"] for c in plan["cells"]],
                         ["base", "cpt[lr=1]", "cpt[lr=2]"])
        self.assertTrue(all(c["plan"].startswith("run") for c in plan["cells"]))
        self.assertIn("base", plan["plan"])
        cells = self.run_study()
        self.assertEqual({c["state"] for c in cells}, {"SUCCEEDED"})
        names = [e["name"] for e in self.client.experiments()]
        self.assertIn("py-study", names)
        got = self.client.experiment("py-study")
        self.assertEqual(got["experiment"]["revision"], 1)
        self.assertEqual(got["cells"][1]["coords"], {"lr": "1"})

    def test_metrics_is_a_dataframe_with_the_clis_numbers(self):
        self.run_study()
        df = self.client.metrics("py-study")
        # base: 5 steps x 2 series + 1 metric; each cpt: STEPS x 2 + 1.
        self.assertEqual(len(df), 11 + 2 * (2 * STEPS + 1))
        self.assertEqual(list(df.columns), list(self.stemma.client.METRIC_COLUMNS))
        loss = df[(df.job_name == "cpt[lr=2]") & (df.name == "loss")]
        self.assertEqual(list(loss.step), list(range(1, STEPS + 1)))
        self.assertAlmostEqual(loss.value.iloc[-1], 3.0 / (STEPS * 2), places=6)
        acc = df[df.name == "acc/en"]
        self.assertEqual(acc.labels.iloc[0], {"language": "en", "type": "choice"})
        cli = self.c.cli("metrics", "py-study", "-o", "json")
        self.assertEqual(cli.returncode, 0, cli.stderr)
        from_cli = json.loads(cli.stdout)
        self.assertEqual([(p["job"], p["name"], p["step"], p["value"]) for p in from_cli],
                         list(zip(df.job, df.name, df.step, df.value)))
        cpt = self.client.metrics("py-study", cell="cpt*", name="loss")
        self.assertEqual(sorted(set(cpt.job_name)), ["cpt[lr=1]", "cpt[lr=2]"])
        self.assertEqual(set(cpt.revision), {1})
        last = self.client.metrics("py-study", name="loss", last=True)
        self.assertEqual(sorted(last.job_name), ["base", "cpt[lr=1]", "cpt[lr=2]"])
        rows = self.client.metrics(list(df.job.unique()[:1]), frame=False)
        self.assertIsInstance(rows, list)
        self.assertEqual(set(rows[0]), set(self.stemma.client.METRIC_COLUMNS))

    def test_checkpoints_and_lineage(self):
        self.run_study()
        arts = {a["path"]: a for a in self.client.checkpoints(experiment="py-study")}
        base, cpt = (os.path.join(self.out, n) for n in ("base.bin", "cpt-2.bin"))
        self.assertIn(base, arts, list(arts))
        self.assertIn(cpt, arts)
        self.assertEqual(arts[cpt]["operation"], "cpt")
        lineage = self.client.lineage(arts[cpt]["id"])
        self.assertEqual([a["path"] for a in lineage], [cpt, base])
        self.assertEqual(lineage[0]["parents"], [arts[base]["id"]])
        details = self.client.checkpoint(arts[base]["id"])
        self.assertEqual(sorted(a["path"] for a in details["children"]),
                         sorted(os.path.join(self.out, f"cpt-{x}.bin")
                                for x in (1, 2)))

    def test_report_data_is_the_reports_table(self):
        self.run_study()
        report = self.client.report("py-study")
        self.assertEqual(report["format"], "stemma.report/1")
        df = self.client.report_data("py-study")
        self.assertEqual(len(df), len(report["rows"]))
        self.assertEqual(list(df.columns), [c["key"] for c in report["columns"]])
        self.assertEqual(df.attrs["report"]["experiment"], "py-study")
        with self.assertRaises(self.stemma.NotFound):
            self.client.report_data("no-such-study")

    def test_report_data_has_the_numbers_the_engine_reported(self):
        if engine_binary() is None:
            self.skipTest("stemma-engine is not built here; STEMMA_ENGINE=PATH names one")
        for lang, words in (("en", "the quick brown fox {} jumps over the lazy dog"),
                            ("ru", "быстрая коричневая лиса {} прыгает через ленивую собаку")):
            with open(os.path.join(self.c.dir, f"{lang}.txt"), "w") as f:
                f.write("".join(words.format(i) + "\n" for i in range(150)))
        self.client.sweep(ENGINE_STUDY.format(dir=self.c.dir))
        cells = self.client.wait(experiment="py-report", timeout=400, check=True)
        df = self.client.report_data("py-report")
        self.assertIn("base", df.index)
        self.assertIn("bpb/en", df.columns)
        self.assertIn("bpb/ru", df.columns)
        eval_job = next(c["job_id"] for c in cells if c["job_name"] == "eval-base")
        reported = self.client.metrics(eval_job, name="bpb/*", last=True)
        values = dict(zip(reported.name, reported.value))
        for name in ("bpb/en", "bpb/ru"):
            self.assertAlmostEqual(df.loc["base", name], values[name], places=6)
        self.assertTrue(all(v == 0 for v in self.client.report_data(
            "py-report", values="delta").loc["base"]), "the base is its own baseline")


class Result(unittest.TextTestResult):
    """Keeps the cluster's directory when anything failed (tearDownClass asks)."""

    failed = False

    def addFailure(self, test, err):
        Result.failed = True
        super().addFailure(test, err)

    def addError(self, test, err):
        Result.failed = True
        super().addError(test, err)


def main():
    global BIN
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    BIN = sys.argv[1]
    harness.skip_unless_venv_has("grpc_tools", "pandas", "yaml")
    suite = unittest.defaultTestLoader.loadTestsFromTestCase(ClientTest)
    result = unittest.TextTestRunner(verbosity=2, resultclass=Result).run(suite)
    failed = len(result.failures) + len(result.errors)
    print(f"{result.testsRun - failed - len(result.skipped)} passed, {failed} failed"
          + (f", {len(result.skipped)} skipped" if result.skipped else ""))
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
