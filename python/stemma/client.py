"""`stemma.Client`: the coordinator's UserService from Python (docs/python.md).

Every call has a deadline (`timeout`, 10 s by default, as the CLI's --timeout); every gRPC
error becomes a `stemma.errors.StemmaError` subclass carrying the coordinator's message.
Results are plain Python values: dicts with the proto's field names (enums as names),
lists of them, and pandas DataFrames for metric series and the report's table when pandas
is installed. A Client is safe to share between threads (gRPC channels are)."""

import json
import os
import re
import secrets
import shutil
import subprocess
import tempfile
import time

import grpc

from . import _config
from ._convert import to_dict
from ._specs import jobs_from
from .errors import (DeadlineExceeded, FailedPrecondition, InvalidArgument, JobFailed, NotFound,
                     StemmaError, Unavailable, from_rpc_error)
from .v1 import experiment_pb2, job_pb2, user_service_pb2, user_service_pb2_grpc

_MAX_MESSAGE = 64 * 1024 * 1024  # as the CLI: job and metric answers can be large
_TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED")
_JOB_ID = re.compile(r"^j-[0-9]+$")
# How long a watch keeps trying to get a lost stream back (a coordinator restart).
_RECONNECT_FOR_S = 60.0

METRIC_COLUMNS = ("job", "job_name", "revision", "attempt", "name", "step", "value", "time_ms",
                  "labels")


def looks_like_job_id(text):
    """"j-12": a job id rather than a job or experiment name (cli/metrics_view.cc)."""
    return bool(_JOB_ID.match(text))


def coords_from_name(job_name):
    """"cpt[family=slavic,lr=2]" -> {"family": "slavic", "lr": "2"} (a cell's name carries its
    matrix coordinates, as cli/report reads them)."""
    if not job_name.endswith("]") or "[" not in job_name:
        return {}
    inner = job_name[job_name.index("[") + 1:-1]
    return dict(part.split("=", 1) for part in inner.split(",") if "=" in part)


def _pandas():
    try:
        import pandas
    except ImportError:
        return None
    return pandas


class Client:
    """A connection to one coordinator.

    address  HOST:PORT; default $STEMMA_COORDINATOR, the CLI config's current context,
             else localhost:7070
    token    bearer token; default $STEMMA_TOKEN, $STEMMA_TOKEN_FILE, the context's
             token-file, ~/.config/stemma/token
    ca       the coordinator's CA (a PEM file path, or PEM text/bytes); default $STEMMA_CA,
             the context's ca, ~/.config/stemma/ca.pem; none: plaintext
    context  a named context of the CLI's config file instead of the current one (it beats
             the environment, as the CLI's --context does); its namespace is where
             experiment names are looked up
    timeout  seconds for each call
    cli      the `stemma` binary `report_data` runs; default $STEMMA_CLI, else `stemma` on PATH
    """

    def __init__(self, address=None, token=None, ca=None, *, context=None, timeout=10.0,
                 cli=None):
        settings = _config.resolve(address, token, ca, context)
        self.address, self._token, self._ca_pem = settings.address, settings.token, \
            settings.ca_pem
        server_name = settings.server_name
        # The context's namespace: where experiment() looks names up (the CLI's exp -n).
        self.namespace = settings.namespace
        self.timeout = float(timeout)
        self._cli = cli
        options = [("grpc.max_receive_message_length", _MAX_MESSAGE),
                   ("grpc.max_send_message_length", _MAX_MESSAGE),
                   # Reconnect quickly after a coordinator restart (watch, wait).
                   ("grpc.initial_reconnect_backoff_ms", 100),
                   ("grpc.min_reconnect_backoff_ms", 100),
                   ("grpc.max_reconnect_backoff_ms", 1000)]
        if server_name:
            options.append(("grpc.ssl_target_name_override", server_name))
        if self._ca_pem is not None:
            credentials = grpc.ssl_channel_credentials(root_certificates=self._ca_pem)
            self._channel = grpc.secure_channel(self.address, credentials, options)
        else:
            self._channel = grpc.insecure_channel(self.address, options)
        self._stub = user_service_pb2_grpc.UserServiceStub(self._channel)
        self._metadata = (("authorization", "Bearer " + self._token),) if self._token else ()

    def close(self):
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"stemma.Client({self.address!r}, tls={self._ca_pem is not None})"

    # ------------------------------------------------------------------ plumbing

    def _call(self, method, request, timeout=None, wait_for_ready=None):
        try:
            return getattr(self._stub, method)(request, timeout=timeout or self.timeout,
                                               metadata=self._metadata,
                                               wait_for_ready=wait_for_ready)
        except grpc.RpcError as e:
            raise from_rpc_error(e, self.address) from None

    def _keyed(self, method, request, what):
        """A call that changes something, with an idempotency key, sent again with the same
        key while its answer is lost (UNAVAILABLE, DEADLINE_EXCEEDED) until the timeout:
        never twice, and never reported failed when it may have been committed
        (cli/client.cc KeyedCall)."""
        if not request.idempotency_key:
            request.idempotency_key = "py-" + secrets.token_hex(16)
        deadline = time.monotonic() + self.timeout
        backoff = 0.1
        sent = False
        for attempt in range(1 << 30):
            try:
                return getattr(self._stub, method)(
                    request, timeout=max(0.001, deadline - time.monotonic()),
                    metadata=self._metadata, wait_for_ready=attempt > 0 or None)
            except grpc.RpcError as e:
                code = e.code()
                if code not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    raise from_rpc_error(e, self.address) from None
                text = e.details() or ""
                never = code == grpc.StatusCode.UNAVAILABLE and (
                    "onnection refused" in text or "ailed to connect" in text)
                if attempt == 0 and never:
                    raise from_rpc_error(e, self.address) from None
                sent = sent or not never
                if time.monotonic() + backoff >= deadline:
                    if not sent:
                        raise from_rpc_error(e, self.address) from None
                    raise Unavailable(
                        f"the coordinator at {self.address} did not confirm the {what} within "
                        f"{self.timeout:g} s ({text}); it may have been committed: send it "
                        f"again with idempotency_key={request.idempotency_key!r}") from None
                time.sleep(backoff)
                backoff = min(backoff * 2, 1.0)

    # ------------------------------------------------------------------ jobs

    def submit(self, jobs, *, idempotency_key=None):
        """Submits jobs and returns their ids, in order.

        `jobs`: a dict (one job, as a job file's YAML has it), a list of dicts, YAML text
        (one or more documents, or a `jobs:` list), or a path to a job file. The same
        `idempotency_key` returns the same ids however often it is sent."""
        specs = jobs_from(_text_or_path(jobs), _source_name(jobs))
        request = user_service_pb2.SubmitRequest(jobs=specs,
                                                 idempotency_key=idempotency_key or "")
        return list(self._keyed("Submit", request, "submit").job_ids)

    def job(self, job, *, history=False):
        """One job (an id, or a job's name: its most recent job) as a dict; with `history`,
        its attempts too under "history"."""
        response = self._call("GetJob", user_service_pb2.GetJobRequest(id=job))
        out = to_dict(response.job)
        if history:
            out["history"] = [to_dict(a) for a in response.history]
        return out

    def jobs(self, *, state=None, kind=None, labels=None, experiment=None, selector=None,
             owner=None, mine=False, limit=None):
        """Jobs as a list of dicts, in submission order. `state`: a name or a list
        ("RUNNING", ["QUEUED", "PENDING"]); `kind`: noop | exec | engine; `labels`: a dict that
        must match; `selector`: kubectl's form ("stage=cpt,family in (slavic,indic)");
        `limit`: at most this many (default all)."""
        states = [state] if isinstance(state, str) else list(state or [])
        request = user_service_pb2.ListJobsRequest(
            states=[job_pb2.JobState.Value(s.upper()) for s in states], kind=kind or "",
            labels=labels or {}, experiment=experiment or "", selector=selector or "",
            owner=owner or "", mine=mine, page_size=1000)
        out = []
        while True:
            page = self._call("ListJobs", request)
            out.extend(to_dict(j) for j in page.jobs)
            if not page.next_page_token or (limit and len(out) >= limit) or not page.jobs:
                break
            request.page_token = page.next_page_token
        return out[:limit] if limit else out

    def cancel(self, job, reason=""):
        job_id = self._call("GetJob", user_service_pb2.GetJobRequest(id=job)).job.id
        request = user_service_pb2.CancelRequest(id=job_id, reason=reason)
        return to_dict(self._keyed("Cancel", request, "cancel").job)

    def retry(self, job):
        job_id = self._call("GetJob", user_service_pb2.GetJobRequest(id=job)).job.id
        return to_dict(self._keyed("Retry", user_service_pb2.RetryRequest(id=job_id),
                                   "retry").job)

    def workers(self):
        return [to_dict(w) for w in
                self._call("ListWorkers", user_service_pb2.ListWorkersRequest()).workers]

    def watch(self, jobs=None, *, experiment=None, timeout=None, initial=True):
        """Yields job events as they happen: dicts {"job": {...}, "previous": "RUNNING"}.

        With `jobs` (ids or names) or an `experiment` (its latest revision's jobs), it ends
        when every one of them has ended (a retried job counts again); with neither it
        watches every job until `timeout`. `initial`: first one event per job as it is now.
        A lost stream (a coordinator restart) is reopened for up to a minute."""
        ids = self._resolve_targets(jobs, experiment)
        request = user_service_pb2.WatchRequest(job_ids=ids, send_initial=initial)
        deadline = None if timeout is None else time.monotonic() + timeout
        pending = set(ids)
        lost_since = None
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise DeadlineExceeded(f"watch: timed out after {timeout:g} s waiting for "
                                       + ", ".join(sorted(pending)))
            stream = self._stub.Watch(request, timeout=left, metadata=self._metadata,
                                      wait_for_ready=lost_since is not None or None)
            try:
                for event in stream:
                    lost_since = None
                    out = {"job": to_dict(event.job),
                           "previous": job_pb2.JobState.Name(event.previous)}
                    state = out["job"]["state"]
                    if state in _TERMINAL:
                        pending.discard(event.job.id)
                    elif event.job.id in ids:
                        pending.add(event.job.id)
                    yield out
                    if ids and not pending:
                        stream.cancel()
                        return
                if ids and not pending:
                    return
            except grpc.RpcError as e:
                if ids and not pending:
                    return
                if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED and deadline is not None:
                    continue  # the loop's check raises with the jobs still pending
                if e.code() != grpc.StatusCode.UNAVAILABLE:
                    raise from_rpc_error(e, self.address) from None
                now = time.monotonic()
                lost_since = lost_since or now
                if now - lost_since > _RECONNECT_FOR_S:
                    raise from_rpc_error(e, self.address) from None
                time.sleep(0.2)
            finally:
                stream.cancel()

    def wait(self, jobs=None, *, experiment=None, timeout=None, check=False):
        """Waits until the jobs (ids or names), or every cell of the experiment's latest
        revision, have ended. Returns the jobs (dicts) or the experiment's cells. `check`:
        raise JobFailed when one did not succeed (a cell skipped for early stopping counts as
        done well, as `stemma exp wait` has it). DeadlineExceeded after `timeout` seconds."""
        if experiment is not None:
            return self._wait_experiment(experiment, timeout, check)
        ids = self._resolve_targets(jobs, None)
        final = {}
        for event in self.watch(ids, timeout=timeout):
            final[event["job"]["id"]] = event["job"]
        out = [final.get(i) or self.job(i) for i in ids]
        failed = [j for j in out if j["state"] != "SUCCEEDED"]
        if check and failed:
            raise JobFailed("; ".join(f"{j['id']} {j['spec'].get('name', '')} {j['state']}: "
                                      f"{j.get('reason', '')}" for j in failed), failed)
        return out

    def _wait_experiment(self, name, timeout, check):
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            got = self.experiment(name)
            cells = got["cells"]
            if all(c["state"] in _TERMINAL for c in cells):
                failed = [c for c in cells if not _ended_well(c)]
                if check and failed:
                    raise JobFailed("; ".join(f"{c['job_id']} {c['job_name']} {c['state']}: "
                                              f"{c.get('reason', '')}" for c in failed), failed)
                return cells
            if deadline is not None and time.monotonic() > deadline:
                done = sum(c["state"] in _TERMINAL for c in cells)
                raise DeadlineExceeded(f"wait: {name}: {done}/{len(cells)} ended after "
                                       f"{timeout:g} s")
            time.sleep(0.3)

    def _resolve_targets(self, jobs, experiment):
        if experiment is not None:
            return [c["job_id"] for c in self.experiment(experiment)["cells"] if c["job_id"]]
        if jobs is None:
            return []
        names = [jobs] if isinstance(jobs, str) else list(jobs)
        return [n if looks_like_job_id(n) else self.job(n)["id"] for n in names]

    def logs(self, job, *, attempt=0, rank=None, tail=None, since_ms=0):
        """A job's log (rank 0's unless `rank`), every attempt unless `attempt`, as text."""
        return "".join(self.stream_logs(job, attempt=attempt, rank=rank, tail=tail,
                                        since_ms=since_ms, follow=False))

    def stream_logs(self, job, *, follow=True, attempt=0, rank=None, tail=None, since_ms=0):
        """Yields a job's log as text chunks as they arrive; with `follow`, until it ends."""
        request = user_service_pb2.LogsRequest(job_id=job, follow=follow, attempt=attempt,
                                               since_ms=since_ms, tail_lines=tail or 0)
        if rank is not None:
            request.rank = rank
        stream = self._stub.Logs(request, timeout=None if follow else self.timeout,
                                 metadata=self._metadata)
        try:
            for chunk in stream:
                yield chunk.data.decode("utf-8", errors="replace")
        except grpc.RpcError as e:
            raise from_rpc_error(e, self.address) from None
        finally:
            stream.cancel()

    # ------------------------------------------------------------------ experiments

    def sweep(self, experiment, *, force=False, dry_run=False, idempotency_key=None,
              gpu_memory=None, imports=None):
        """Submits an experiment file (a path, or its YAML text): the coordinator expands it
        into jobs. Returns {"experiment": {...}, "cells": [...], "plan": text, "added",
        "removed", "changed", "existing"}. `gpu_memory`: plan against GPUs of this many MiB;
        `imports`: {name: text} of the files it extends, when given as text."""
        text, name = _read_experiment(experiment)
        request = experiment_pb2.SubmitExperimentRequest(
            file=name, text=text, dry_run=dry_run, force=force,
            idempotency_key=idempotency_key or "", gpu_memory_mb=int(gpu_memory or 0),
            imports=imports or {})
        if dry_run:
            return to_dict(self._call("SubmitExperiment", request))
        return to_dict(self._keyed("SubmitExperiment", request, "sweep"))

    def plan(self, experiment, *, force=False, gpu_memory=None, imports=None):
        """What `sweep` would do, submitting nothing: the same dict, the DAG as text under
        "plan" and each cell's expectation ("run: new cell", "cached: ...") under
        cells[i]["plan"]."""
        return self.sweep(experiment, force=force, dry_run=True, gpu_memory=gpu_memory,
                          imports=imports)

    def experiments(self):
        """Every experiment with its latest revision: a list of dicts."""
        return [to_dict(e) for e in self._call(
            "ListExperiments", experiment_pb2.ListExperimentsRequest()).experiments]

    def experiment(self, name, *, revision=0, namespace=None):
        """One experiment's revision (default the latest): {"experiment": {...}, "cells":
        [{job_name, stage, coords, job_id, state, reason, step, ...}]}."""
        request = experiment_pb2.GetExperimentRequest(
            name=name, revision=revision,
            owner=self.namespace if namespace is None else namespace)
        out = to_dict(self._call("GetExperiment", request))
        for cell in out["cells"]:
            if not cell["coords"]:  # a coordinator that sends none: they are in the name
                cell["coords"] = coords_from_name(cell["job_name"])
        return out

    # ------------------------------------------------------------------ metrics

    def metric_points(self, target=None, *, jobs=None, experiment=None, name=None, last=False,
                      limit=None, revision=None, cell=None):
        """The raw QueryMetrics answer: (list of MetricPoint messages, truncated)."""
        request = self._metrics_request(target, jobs, experiment, name, last, limit, revision,
                                        cell)
        response = self._call("QueryMetrics", request)
        return response.points, response.truncated

    def _metrics_request(self, target, jobs, experiment, name, last, limit, revision, cell):
        request = user_service_pb2.QueryMetricsRequest(name_pattern=name or "", last_only=last,
                                                       limit=int(limit or 0),
                                                       revision=int(revision or 0),
                                                       cell=cell or "")
        targets = [] if target is None else [target] if isinstance(target, str) else target
        for t in list(targets) + list(jobs or []):
            if looks_like_job_id(t):
                request.job_ids.append(t)
            elif not request.experiment and experiment is None:
                request.experiment = t
            else:
                raise InvalidArgument(f"'{t}': give job ids and at most one experiment")
        if experiment is not None:
            request.experiment = experiment
        return request

    def _job_names(self, ids, experiment):
        """Job id -> name, for points from a coordinator that does not send job names."""
        names = {}
        if experiment:
            names = {j["id"]: j["spec"].get("name", "") for j in self.jobs(experiment=experiment)}
        for job_id in ids - names.keys():
            try:
                names[job_id] = self.job(job_id)["spec"].get("name", "")
            except NotFound:
                names[job_id] = ""
        return names

    def metrics(self, target=None, *, jobs=None, experiment=None, name=None, last=False,
                limit=None, revision=None, cell=None, frame=None):
        """Metric series of jobs (ids) or of every job of an experiment (a name), as a pandas
        DataFrame with columns job, job_name, revision, attempt, name, step, value, time_ms,
        labels (one row per point, per job in the order asked, then as reported) when pandas
        is installed (or `frame=True`), else a list of dicts with those keys.

        `name`: a glob over names ("heldout_loss/*"); `last`: only each series' last point;
        `limit`: at most this many points (default 100,000; the answer says when it was cut:
        `df.attrs["truncated"]`); `revision`: the experiment's revision (0 the latest, -1
        all); `cell`: only jobs whose name matches this glob."""
        request = self._metrics_request(target, jobs, experiment, name, last, limit, revision,
                                        cell)
        response = self._call("QueryMetrics", request)
        points = response.points
        job_names = [p.job_name for p in points]
        missing = {p.job_id for p, n in zip(points, job_names) if not n}
        if (revision or cell) and points and len(missing) == len({p.job_id for p in points}):
            # A coordinator older than these fields answers with every revision's points,
            # none named by its cell: say so rather than return them as if selected.
            raise FailedPrecondition("the coordinator does not select metrics by revision or "
                                     "cell (it is older than this client)")
        if missing:
            names = self._job_names(missing, request.experiment)
            job_names = [n or names.get(p.job_id, "") for p, n in zip(points, job_names)]
        columns = {
            "job": [p.job_id for p in points],
            "job_name": job_names,
            "revision": [p.revision for p in points],
            "attempt": [p.attempt for p in points],
            "name": [p.name for p in points],
            "step": [p.step for p in points],
            "value": [p.value for p in points],
            "time_ms": [p.time_ms for p in points],
            "labels": [dict(p.labels) for p in points],
        }
        pandas = _pandas() if frame is not False else None
        if frame and pandas is None:
            raise ImportError("metrics(frame=True) needs pandas: pip install pandas")
        if pandas is None:
            return [dict(zip(METRIC_COLUMNS, row)) for row in zip(*columns.values())]
        df = pandas.DataFrame(columns, columns=list(METRIC_COLUMNS))
        df.attrs["truncated"] = response.truncated
        return df

    # ------------------------------------------------------------------ checkpoints

    def checkpoints(self, *, experiment=None, job=None, type=None, manifest_sha256=None,
                    include_deleted=False, limit=None):
        """Registered artifacts (checkpoints, datasets, results files) as a list of dicts:
        id, name, type, path, manifest_sha256, bytes, job_id, parents, operation, metrics, ..."""
        request = user_service_pb2.ListArtifactsRequest(
            experiment=experiment or "", job_id=job or "", type=type or "",
            manifest_sha256=manifest_sha256 or "", include_deleted=include_deleted,
            limit=int(limit or 0))
        return [to_dict(a) for a in self._call("ListArtifacts", request).artifacts]

    def checkpoint(self, artifact):
        """One artifact by id ("a-12") or path: {"artifact", "parents", "producer",
        "children", "consumer_jobs"}."""
        return to_dict(self._call("GetArtifact", user_service_pb2.GetArtifactRequest(
            id=artifact)))

    def lineage(self, artifact, *, depth=0):
        """The ancestors of an artifact (id or path), each once, the artifact itself first:
        a list of artifact dicts whose "parents" name the others' ids. `depth`: 0 = down to
        the base."""
        response = self._call("Lineage", user_service_pb2.LineageRequest(id=artifact,
                                                                         max_depth=depth))
        return [to_dict(a) for a in response.artifacts]

    # ------------------------------------------------------------------ report

    def report(self, experiment, *, revision=0, metrics=None, columns="languages"):
        """The study report as `stemma report EXPERIMENT --format json` prints it (a dict,
        format "stemma.report/1"; docs/report.md). The report's model lives in the CLI
        (cli/report/), so this runs that binary against this client's coordinator with this
        client's credentials rather than computing a second, drifting copy of it."""
        # Asked over gRPC first: an unknown experiment is a typed NotFound, not CLI text.
        self.experiment(experiment, revision=revision)
        args = ["report", experiment, "--format", "json", "--columns", columns]
        if revision:
            args += ["--revision", str(revision)]
        for m in metrics or []:
            args += ["--metric", m]
        return json.loads(self._run_cli(args))

    def report_data(self, experiment, *, revision=0, metrics=None, columns="languages",
                    values="value"):
        """The report's table as a pandas DataFrame: one row per table row (index: the row's
        title), one column per report column key ("bpb/ru", "acc/belebele_uk", ...).
        `values`: "value" (default) or "delta" (against the baseline row). The whole report
        (columns' metadata, summary, sweep points, notes) is in `df.attrs["report"]`."""
        pandas = _pandas()
        if pandas is None:
            raise ImportError("report_data needs pandas: pip install pandas")
        if values not in ("value", "delta"):
            raise InvalidArgument(f"values: '{values}' is not value or delta")
        report = self.report(experiment, revision=revision, metrics=metrics, columns=columns)
        keys = [c["key"] for c in report["columns"]]
        rows = {row["title"]: {k: row["cells"].get(k, {}).get(values) for k in keys}
                for row in report["rows"]}
        df = pandas.DataFrame.from_dict(rows, orient="index", columns=keys, dtype="float64")
        df.index.name = "row"
        df.attrs["report"] = report
        return df

    def _cli_path(self):
        path = self._cli or os.environ.get("STEMMA_CLI") or shutil.which("stemma")
        if not path:
            raise NotFound("the `stemma` CLI is needed for the report: put it on PATH, set "
                           "STEMMA_CLI, or give Client(cli=...)")
        return path

    def _run_cli(self, args):
        env = dict(os.environ)
        for k in ("STEMMA_TOKEN", "STEMMA_TOKEN_FILE", "STEMMA_CA", "STEMMA_CONFIG"):
            env.pop(k, None)
        env["STEMMA_CONFIG"] = os.devnull  # this client's address and credentials only
        if self._token:
            env["STEMMA_TOKEN"] = self._token
        with tempfile.TemporaryDirectory(prefix="stemma-py-") as tmp:
            if self._ca_pem is not None:
                ca = os.path.join(tmp, "ca.pem")
                with open(ca, "wb") as f:
                    f.write(self._ca_pem)
                env["STEMMA_CA"] = ca
            argv = [self._cli_path(), "--coordinator", self.address, "--timeout",
                    f"{self.timeout:g}", *args]
            done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            message = done.stderr.strip().removeprefix("stemma: error: ") or \
                f"{' '.join(argv[:1] + args)} exited {done.returncode}"
            raise (Unavailable if "cannot reach" in message else StemmaError)(message)
        return done.stdout


def _ended_well(cell):
    return cell["state"] == "SUCCEEDED" or (cell["state"] == "CANCELLED"
                                           and cell.get("early_stop"))


def _looks_like_path(value):
    return isinstance(value, (str, os.PathLike)) and "\n" not in str(value) and \
        os.path.isfile(str(value))


def _text_or_path(value):
    if isinstance(value, os.PathLike) or _looks_like_path(value):
        with open(value, encoding="utf-8") as f:
            return f.read()
    return value


def _source_name(value):
    return os.fspath(value) if _looks_like_path(value) else "jobs"


def _read_experiment(experiment):
    if isinstance(experiment, os.PathLike) or _looks_like_path(experiment):
        with open(experiment, encoding="utf-8") as f:
            return f.read(), os.fspath(experiment)
    if isinstance(experiment, dict):
        import yaml

        return yaml.safe_dump(experiment, sort_keys=False), "experiment"
    if isinstance(experiment, str) and "\n" not in experiment and \
            experiment.endswith((".yaml", ".yml")):
        raise NotFound(f"{experiment}: cannot read the experiment file")
    return experiment, "experiment"
