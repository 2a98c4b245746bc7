"""Metric export (python/stemma/export.py, `stemma metrics export`) read back by the peers'
own readers: MLflow's MlflowClient over the tracking store the export wrote, TensorBoard's
EventAccumulator over the event files. A study of exec jobs that print training series and
report output files with parents runs on a real coordinator and worker first.

    export_test.py BIN_DIR      (run by CTest as python_export; exit 77 = skipped)"""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import client_test  # noqa: E402  (the study and the emitter)
import cluster as harness  # noqa: E402

BIN = None
STEPS = 12


class ExportTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.c = harness.Cluster(BIN)
        try:
            harness.install_client(cls.c.dir)
            import stemma

            cls.stemma = stemma
            cls.c.start_coordinator()
            cls.c.start_worker("w1", cpus=4)
            cls.c.wait_for_workers(1)
            cls.client = stemma.Client(cls.c.address)
            with open(os.path.join(harness.REPO, "tests", "python", "emit.py")) as f:
                emit = f.read()
            with open(os.path.join(cls.c.dir, "emit.py"), "w") as f:
                f.write(emit)
            study = client_test.STUDY.format(dir=cls.c.dir, out=os.path.join(cls.c.dir, "out"),
                                             steps=STEPS)
            cls.client.sweep(study)
            cls.cells = {c["job_name"]: c for c in
                         cls.client.wait(experiment="py-study", timeout=120, check=True)}
            cls.arts = {a["path"]: a for a in cls.client.checkpoints(experiment="py-study")}
        except BaseException:
            cls.c.close(failed=True)
            raise

    @classmethod
    def tearDownClass(cls):
        cls.c.close(failed=client_test.Result.failed)

    def cli_env(self):
        """The environment `stemma metrics export` runs the exporter in: this venv's Python
        (its bin first on PATH, where `python3` is found) with the installed client."""
        env = dict(os.environ)
        env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
        env["PYTHONPATH"] = sys.path[0] + os.pathsep + env.get("PYTHONPATH", "")
        return env

    def check_mlflow_run(self, ml, run, cell):
        cpt = os.path.join(self.c.dir, "out", "cpt-2.bin")
        base = os.path.join(self.c.dir, "out", "base.bin")
        self.assertEqual(run.info.run_name, cell)
        self.assertEqual(run.info.status, "FINISHED")
        tags = run.data.tags
        self.assertEqual(tags["stemma.job_id"], self.cells[cell]["job_id"])
        self.assertEqual(tags["family"], "slavic")           # a label
        self.assertEqual(tags["stemma.coord.lr"], "2")
        self.assertEqual(tags["stemma.needs"], self.cells["base"]["job_id"])
        self.assertEqual(tags["stemma.output.model"], cpt)
        self.assertEqual(tags["stemma.output.model.artifact"], self.arts[cpt]["id"])
        self.assertEqual(tags["stemma.output.model.parents"], self.arts[base]["id"])
        self.assertIn(f"{self.arts[base]['id']} init {base}", tags["stemma.output.model.lineage"])
        params = run.data.params
        self.assertEqual(params["kind"], "exec")
        self.assertIn("--lr", params["exec.argv"])
        history = ml.get_metric_history(run.info.run_id, "loss")
        self.assertEqual([m.step for m in history], list(range(1, STEPS + 1)))
        self.assertAlmostEqual(history[-1].value, 3.0 / (STEPS * 2), places=6)
        series = self.client.metrics(self.cells[cell]["job_id"], name="loss")
        self.assertEqual([m.timestamp for m in history], list(series.time_ms))
        self.assertEqual(ml.get_metric_history(run.info.run_id, "acc/en")[0].value, 0.5)

    def test_mlflow_runs_read_back_with_mlflow(self):
        from mlflow.tracking import MlflowClient

        from stemma import export

        uri = "sqlite:///" + os.path.join(self.c.dir, "mlflow.db")
        runs = export.to_mlflow("py-study", uri, client=self.client)
        self.assertEqual(sorted(runs), ["base", "cpt[lr=1]", "cpt[lr=2]"])
        ml = MlflowClient(tracking_uri=uri)
        exp = ml.get_experiment_by_name("py-study")
        found = {r.info.run_name: r for r in ml.search_runs([exp.experiment_id])}
        self.assertEqual(sorted(found), sorted(runs))
        self.check_mlflow_run(ml, found["cpt[lr=2]"], "cpt[lr=2]")
        # Exported again: the same runs replaced, none added.
        export.to_mlflow("py-study", uri, client=self.client)
        self.assertEqual(len(ml.search_runs([exp.experiment_id])), 3)

    def test_stemma_metrics_export_to_mlflow_from_the_cli(self):
        from mlflow.tracking import MlflowClient

        uri = "sqlite:///" + os.path.join(self.c.dir, "mlflow-cli.db")
        done = self.c.cli("metrics", "export", "--to", "mlflow", "--tracking-uri", uri,
                          "--mlflow-experiment", "from-cli", "py-study", env=self.cli_env())
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertIn("exported 3 runs of py-study to mlflow", done.stderr)
        ml = MlflowClient(tracking_uri=uri)
        exp = ml.get_experiment_by_name("from-cli")
        found = {r.info.run_name: r for r in ml.search_runs([exp.experiment_id])}
        self.check_mlflow_run(ml, found["cpt[lr=2]"], "cpt[lr=2]")

    def test_tensorboard_runs_read_back_with_tensorboards_reader(self):
        from tensorboard.backend.event_processing import event_accumulator

        logdir = os.path.join(self.c.dir, "tb")
        done = self.c.cli("metrics", "export", "--to", "tensorboard", "--logdir", logdir,
                          "py-study", env=self.cli_env())
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertEqual(sorted(os.listdir(logdir)), ["base", "cpt_lr=1_", "cpt_lr=2_"])
        acc = event_accumulator.EventAccumulator(
            os.path.join(logdir, "cpt_lr=2_"),
            size_guidance={event_accumulator.SCALARS: 0, event_accumulator.TENSORS: 0})
        acc.Reload()
        loss = acc.Scalars("loss")
        self.assertEqual([e.step for e in loss], list(range(1, STEPS + 1)))
        self.assertAlmostEqual(loss[-1].value, 3.0 / (STEPS * 2), places=5)
        series = self.client.metrics(self.cells["cpt[lr=2]"]["job_id"], name="loss")
        self.assertEqual([round(e.wall_time * 1000) for e in loss], list(series.time_ms))
        self.assertIn("acc/en", acc.Tags()["scalars"])
        text = acc.Tensors("stemma/tags")[0].tensor_proto.string_val[0].decode()
        self.assertIn(f"| stemma.job_id | {self.cells['cpt[lr=2]']['job_id']} |", text)
        self.assertIn("| family | slavic |", text)
        self.assertIn("_hparams_/session_start_info", acc.Tags()["tensors"])
        # Exported again: the run's event files replaced, the points not doubled.
        from stemma import export

        export.to_tensorboard("py-study", logdir, client=self.client)
        again = event_accumulator.EventAccumulator(os.path.join(logdir, "cpt_lr=2_"))
        again.Reload()
        self.assertEqual(len(again.Scalars("loss")), STEPS)

    def test_export_without_the_python_client_says_how_to_get_it(self):
        env = dict(os.environ, PYTHONPATH="")
        done = self.c.cli("metrics", "export", "--to", "mlflow", "--python", "/usr/bin/python3",
                          "py-study", env=env)
        self.assertNotEqual(done.returncode, 0)
        self.assertIn("pip install ./python", done.stderr)


def main():
    global BIN
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    BIN = sys.argv[1]
    harness.skip_unless_venv_has("grpc_tools", "pandas", "yaml", "mlflow", "tensorboard")
    suite = unittest.defaultTestLoader.loadTestsFromTestCase(ExportTest)
    result = unittest.TextTestRunner(verbosity=2, resultclass=client_test.Result).run(suite)
    failed = len(result.failures) + len(result.errors)
    print(f"{result.testsRun - failed - len(result.skipped)} passed, {failed} failed")
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
