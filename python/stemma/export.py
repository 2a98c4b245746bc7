"""An experiment's runs into MLflow or TensorBoard: one run per cell (a job of the experiment's
revision), its spec as parameters, its labels and lineage as tags, its metric series as
metrics. Also a command:

    python -m stemma.export --to mlflow --tracking-uri sqlite:///mlflow.db EXPERIMENT
    python -m stemma.export --to tensorboard --logdir runs/ EXPERIMENT

which `stemma metrics export --to mlflow|tensorboard` runs. Exporting again replaces what the
earlier export wrote for the same jobs (MLflow runs are matched by their `stemma.job_id` tag;
TensorBoard event files in the cell's directory are rewritten)."""

import argparse
import json
import os
import re
import sys

from .client import Client
from .errors import StemmaError

_MEMOIZED = re.compile(r"memoized from (j-[0-9]+)")
_UNSAFE_KEY = re.compile(r"[^A-Za-z0-9_\-. /]")
_MAX_PARAM = 6000   # MLflow's limit on a parameter's value
_MAX_TAG = 8000     # ... and a tag's (older servers: 5000; lineage text is cut before)
_BATCH = 1000       # MLflow's limit of metrics per log_batch


def _key(text):
    """A name MLflow accepts as a param, tag or metric key (letters, digits, _ - . space /)."""
    return _UNSAFE_KEY.sub("_", text) or "_"


def _flatten(value, prefix, out):
    if isinstance(value, dict) and value:
        for k, v in value.items():
            _flatten(v, f"{prefix}.{k}" if prefix else str(k), out)
    elif isinstance(value, list):
        if value:
            out[prefix] = json.dumps(value)
    elif isinstance(value, dict):
        return
    else:
        out[prefix] = value


def spec_params(spec):
    """A job spec as flat parameters: "train.lr" = 0.0003, "resources.gpus" = 1, "kind" =
    train. Labels, dependencies and the experiment's name are left to the tags."""
    body = {k: v for k, v in spec.items()
            if k not in ("labels", "depends_on", "experiment", "name", "early_stop_rule")}
    kinds = [k for k in body if isinstance(body[k], dict) and k not in ("resources", "backoff")]
    out = {"kind": kinds[0] if kinds else ""}
    _flatten(body, "", out)
    return out


class Cell:
    """One cell of the experiment with what the export writes about it."""

    def __init__(self, cell, job, source, points, outputs):
        self.name = cell["job_name"]
        self.cell = cell
        self.job = job          # the cell's job (dict), or None before it was submitted
        self.source = source    # the job that ran for it (a memoized job's source), or job
        self.points = points    # MetricPoint messages of `source`
        self.outputs = outputs  # [(artifact dict, lineage list)]

    def params(self):
        return spec_params(self.job["spec"]) if self.job else {}

    def tags(self, experiment, revision, address):
        tags = {_key(k): v for k, v in (self.job or {}).get("spec", {}).get("labels", {}).items()}
        tags.update({
            "stemma.experiment": experiment, "stemma.revision": str(revision),
            "stemma.cell": self.name, "stemma.stage": self.cell.get("stage", ""),
            "stemma.job_id": self.cell.get("job_id", ""), "stemma.state": self.cell["state"],
            "stemma.coordinator": address,
            "stemma.needs": ",".join(self.cell.get("needs", [])),
        })
        for k, v in self.cell.get("coords", {}).items():
            tags[_key(f"stemma.coord.{k}")] = v
        if self.source and self.job and self.source["id"] != self.job["id"]:
            tags["stemma.memoized_from"] = self.source["id"]
        if self.cell.get("reason"):
            tags["stemma.reason"] = self.cell["reason"]
        for artifact, lineage in self.outputs:
            base = _key(f"stemma.output.{artifact.get('name') or artifact['id']}")
            tags[base] = artifact["path"]
            tags[base + ".artifact"] = artifact["id"]
            tags[base + ".manifest_sha256"] = artifact.get("manifest_sha256", "")
            tags[base + ".operation"] = artifact.get("operation", "")
            tags[base + ".parents"] = ",".join(artifact.get("parents", []))
            tags[base + ".lineage"] = lineage_text(lineage)
        return {k: str(v)[:_MAX_TAG] for k, v in tags.items()}


def lineage_text(lineage):
    """"a-7 soup /ckpt/soup <- a-3 cpt /ckpt/cpt-slavic <- a-1 external /models/base": the
    artifact, then its ancestors as the Lineage call lists them (each once)."""
    parts = [f"{a['id']} {'external' if a.get('external') else a.get('operation') or '?'} "
             f"{a['path']}" for a in lineage]
    return " <- ".join(parts)


def gather(client, experiment, revision=0):
    """(experiment dict, [Cell]) for the experiment's revision (0: the latest)."""
    got = client.experiment(experiment, revision=revision)
    jobs = {j["id"]: j for j in client.jobs(experiment=got["experiment"]["name"])}

    def job_of(job_id):
        if job_id and job_id not in jobs:
            try:
                jobs[job_id] = client.job(job_id)
            except StemmaError:
                return None
        return jobs.get(job_id)

    sources = {}
    for cell in got["cells"]:
        job = job_of(cell.get("job_id"))
        source = job
        for _ in range(16):  # a memoized job points at the one that ran, which may be memoized
            m = _MEMOIZED.search((source or {}).get("reason", ""))
            if not m or m.group(1) == source["id"] or job_of(m.group(1)) is None:
                break
            source = job_of(m.group(1))
        sources[cell["job_name"]] = (job, source)
    ran = sorted({s["id"] for _, s in sources.values() if s})
    points = {}
    if ran:
        found, _ = client.metric_points(jobs=ran, limit=5_000_000)
        for p in found:
            points.setdefault(p.job_id, []).append(p)
    artifacts = {}
    for a in client.checkpoints(experiment=got["experiment"]["name"]):
        artifacts.setdefault(a["job_id"], []).append(a)
    cells = []
    for cell in got["cells"]:
        job, source = sources[cell["job_name"]]
        if job is None:
            continue
        outputs = [(a, client.lineage(a["id"])) for a in artifacts.get(job["id"], [])
                   if a.get("state") != "ARTIFACT_DELETED"]
        cells.append(Cell(cell, job, source, points.get((source or job)["id"], []), outputs))
    return got["experiment"], cells


_MLFLOW_STATUS = {"SUCCEEDED": "FINISHED", "FAILED": "FAILED", "CANCELLED": "KILLED"}


def to_mlflow(experiment, tracking_uri=None, *, client=None, revision=0, mlflow_experiment=None):
    """Exports the experiment into MLflow at `tracking_uri` (default: MLflow's own default)
    under the MLflow experiment `mlflow_experiment` (default: the same name). Returns
    {cell name: MLflow run id}."""
    from mlflow.entities import Metric, Param
    from mlflow.tracking import MlflowClient

    client = client or Client()
    exp, cells = gather(client, experiment, revision)
    ml = MlflowClient(tracking_uri=tracking_uri)
    name = mlflow_experiment or exp["name"]
    found = ml.get_experiment_by_name(name)
    experiment_id = found.experiment_id if found else ml.create_experiment(
        name, tags={"stemma.experiment": exp["name"], "stemma.coordinator": client.address})
    runs = {}
    for cell in cells:
        for old in ml.search_runs([experiment_id],
                                  f"tags.`stemma.job_id` = '{cell.job['id']}'"):
            ml.delete_run(old.info.run_id)
        tags = cell.tags(exp["name"], exp["revision"], client.address)
        run = ml.create_run(experiment_id, start_time=cell.job.get("created_ms") or None,
                            tags=tags, run_name=cell.name)
        run_id = run.info.run_id
        params = [Param(_key(k), str(v)[:_MAX_PARAM]) for k, v in cell.params().items()]
        for i in range(0, len(params), 100):
            ml.log_batch(run_id, params=params[i:i + 100])
        metrics = [Metric(_key(p.name), p.value, p.time_ms, p.step) for p in cell.points]
        for i in range(0, len(metrics), _BATCH):
            ml.log_batch(run_id, metrics=metrics[i:i + _BATCH])
        status = _MLFLOW_STATUS.get(cell.cell["state"])
        if status:
            ml.set_terminated(run_id, status, end_time=cell.job.get("finished_ms") or None)
        runs[cell.name] = run_id
    return runs


def _run_dir(name):
    return re.sub(r"[^A-Za-z0-9_\-.=,]", "_", name).strip(".") or "_"


def _hparam(value):
    return value if isinstance(value, (bool, int, float, str)) else str(value)


def to_tensorboard(experiment, logdir, *, client=None, revision=0):
    """Writes one TensorBoard run per cell under `logdir` (a directory named after the cell):
    its series as scalars (tag = metric name, step and wall time as reported), its spec as
    hparams, its tags (labels, lineage) as a text summary `stemma/tags`. Returns {cell name:
    run directory}."""
    from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2
    from tensorboard.plugins.hparams import summary_v2 as hparams
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    client = client or Client()
    exp, cells = gather(client, experiment, revision)
    out = {}
    for cell in cells:
        run_dir = os.path.join(logdir, _run_dir(cell.name))
        os.makedirs(run_dir, exist_ok=True)
        for f in os.listdir(run_dir):
            if f.startswith("events.out.tfevents."):
                os.remove(os.path.join(run_dir, f))
        writer = EventFileWriter(run_dir)
        start = (cell.job.get("created_ms") or 0) / 1000.0
        params = {k: _hparam(v) for k, v in cell.params().items()}
        writer.add_event(event_pb2.Event(wall_time=start, step=0,
                                         summary=hparams.hparams_pb(params, trial_id=cell.name)))
        tags = cell.tags(exp["name"], exp["revision"], client.address)
        table = "| tag | value |\n|---|---|\n" + "".join(
            f"| {k} | {v.replace('|', '/')} |\n" for k, v in sorted(tags.items()))
        text = summary_pb2.Summary.Value(
            tag="stemma/tags",
            metadata=summary_pb2.SummaryMetadata(
                plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="text")),
            tensor=tensor_pb2.TensorProto(dtype=7,  # DT_STRING
                                          tensor_shape=tensor_shape_pb2.TensorShapeProto(),
                                          string_val=[table.encode()]))
        writer.add_event(event_pb2.Event(wall_time=start, step=0,
                                         summary=summary_pb2.Summary(value=[text])))
        for p in cell.points:
            value = summary_pb2.Summary.Value(tag=p.name, simple_value=p.value)
            writer.add_event(event_pb2.Event(wall_time=p.time_ms / 1000.0, step=p.step,
                                             summary=summary_pb2.Summary(value=[value])))
        writer.close()
        out[cell.name] = run_dir
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="stemma metrics export",
        description="An experiment's runs into MLflow or TensorBoard: one run per cell, its "
                    "spec as params, labels and lineage as tags, metric series as metrics.")
    parser.add_argument("experiment")
    parser.add_argument("--to", required=True, choices=("mlflow", "tensorboard"))
    parser.add_argument("--tracking-uri", help="MLflow tracking URI (default: MLflow's)")
    parser.add_argument("--mlflow-experiment", help="MLflow experiment name (default: the same)")
    parser.add_argument("--logdir", help="TensorBoard log directory (--to tensorboard)")
    parser.add_argument("--revision", type=int, default=0, help="default: the latest")
    parser.add_argument("--coordinator", help="default: $STEMMA_COORDINATOR, as the CLI")
    parser.add_argument("--timeout", type=float, default=10.0)
    args = parser.parse_args(argv)
    if args.to == "tensorboard" and not args.logdir:
        parser.error("--to tensorboard needs --logdir")
    try:
        client = Client(args.coordinator, timeout=args.timeout)
        if args.to == "mlflow":
            runs = to_mlflow(args.experiment, args.tracking_uri, client=client,
                             revision=args.revision, mlflow_experiment=args.mlflow_experiment)
        else:
            runs = to_tensorboard(args.experiment, args.logdir, client=client,
                                  revision=args.revision)
    except ImportError as e:
        package = "mlflow" if args.to == "mlflow" else "tensorboard"
        print(f"stemma: error: --to {args.to} needs the {package} package ({e}): "
              f"pip install {package}", file=sys.stderr)
        return 1
    except StemmaError as e:
        print(f"stemma: error: {e.message}", file=sys.stderr)
        return 1
    for name, where in runs.items():
        print(f"{where}\t{name}")
    print(f"exported {len(runs)} runs of {args.experiment} to {args.to}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
