#!/usr/bin/env python3
"""Generates Stemma's Grafana dashboards and the Kubernetes PrometheusRule from one source.

    deploy/generate.py            write the outputs
    deploy/generate.py --check    exit 1 if a checked-in output differs from a fresh one
    deploy/generate.py --runbook-base-url URL --rule-out FILE
                                  write a PrometheusRule whose runbook_url points at
                                  URL/runbooks/<alert>.md (where your copy of docs/ is served);
                                  the kustomize overlays do the same from their runbooks.yaml

Outputs (checked in, never edited by hand):
    deploy/grafana/dashboards/stemma-cluster.json
    deploy/grafana/dashboards/stemma-experiments.json
    deploy/kubernetes/components/monitoring/prometheusrule.yaml   (from deploy/prometheus/stemma-rules.yaml)
    deploy/kubernetes/components/monitoring/dashboards/*.json      (copies for the Grafana ConfigMap)

The dashboards are described below as rows of panels. Every query selects on the
dashboard's `job` and `instance` variables, every rate uses `$__rate_interval`, every panel
reads from the `datasource` variable. A panel's `needs` says what must have happened (or
landed) before it can show data; tests/deploy/prometheus_live.py holds every panel without
`needs` to returning data after a few jobs.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import sys

import yaml

DEPLOY = pathlib.Path(__file__).resolve().parent
DASHBOARD_DIR = DEPLOY / "grafana" / "dashboards"
RULES_SOURCE = DEPLOY / "prometheus" / "stemma-rules.yaml"
MONITORING = DEPLOY / "kubernetes" / "components" / "monitoring"
PROMETHEUS_RULE = MONITORING / "prometheusrule.yaml"
# The same dashboards inside the monitoring component (kustomize reads files only below a
# kustomization), as a ConfigMap that Grafana's dashboard sidecar loads.
COMPONENT_DASHBOARDS = MONITORING / "dashboards"

# Metrics that other parts of Stemma are adding; panels on them are empty until then.
AUTH = "issue 13: stemma_auth_failures_total (and only after a call was refused)"
TRAINING = "a running job that reports step events (loss, tokens_per_s, total_steps)"
EVAL_METRICS = "an eval job (stemma-engine eval) that reported its metrics"
REGISTRY = "a job that published a checkpoint (an output event of type checkpoint)"
FAILURES = "a failed attempt"
RPC_ERRORS = "an RPC that ended with an error code"
TLS = "a daemon that loads TLS certificates (--tls-cert, --ca)"
DCGM = ("NVIDIA's DCGM exporter scraped by the same Prometheus, and worker series with a pod label "
        "(Kubernetes: the ServiceMonitor adds it)")
STALL = "a training job that has advanced at least twice (a mean step time is known)"
# The base of runbook_url in deploy/prometheus/stemma-rules.yaml.
RUNBOOK_BASE = "https://stemma.example.com/docs"


def dcgm(metric: str) -> str:
    """A DCGM exporter series of the GPUs that Stemma's worker pods hold: DCGM labels the
    pod using each GPU (exported_pod once Prometheus keeps its own `pod`), joined with the
    workers the dashboard's $job/$instance select."""
    return (f'(label_replace({metric}, "pod", "$1", "exported_pod", "(.+)") '
            f'and on (pod) stemma_worker_connected{sel()})')


def eq(label: str, value: str) -> str:
    return f'{label}="{value}"'


def rx(label: str, value: str) -> str:
    return f'{label}=~"{value}"'


def nre(label: str, value: str) -> str:
    return f'{label}!~"{value}"'


def sel(*extra: str, experiment: bool = False) -> str:
    """A label selector with the dashboard's variables, plus `extra` matchers."""
    parts = [rx('job', '$job'), rx('instance', '$instance')]
    if experiment:
        parts += [rx('experiment', '$experiment'), rx('stage', '$stage')]
    return "{" + ", ".join(parts + list(extra)) + "}"


def rate(metric: str, *extra: str, fn: str = "rate") -> str:
    return f"{fn}({metric}{sel(*extra)}[$__rate_interval])"


def quantiles(metric: str, by: str = "", qs=(0.5, 0.9, 0.99)) -> list[tuple[str, str]]:
    """histogram_quantile targets for a histogram `metric` (without _bucket)."""
    group = ", ".join([b for b in [by] if b] + ["le"])
    legend_prefix = f"{{{{{by}}}}} " if by else ""
    return [
        (
            f"histogram_quantile({q}, sum by ({group}) ({rate(metric + '_bucket')}))",
            f"{legend_prefix}p{int(q * 100)}",
        )
        for q in qs
    ]


@dataclasses.dataclass
class Panel:
    title: str
    targets: list[tuple[str, str]]  # (PromQL, legend)
    unit: str = "short"
    description: str = ""
    kind: str = "timeseries"  # or "stat"
    needs: str | None = None
    width: int = 8
    stack: bool = False


@dataclasses.dataclass
class Row:
    title: str
    panels: list[Panel]


@dataclasses.dataclass
class Dashboard:
    uid: str
    title: str
    description: str
    rows: list[Row]
    experiment_vars: bool = False


CLUSTER = Dashboard(
    uid="stemma-cluster",
    title="Stemma / Cluster",
    description="Jobs, scheduling, workers and GPUs, the coordinator's store and RPCs.",
    rows=[
        Row("Jobs", [
            Panel("Jobs by state", [
                (f"sum by (state) (stemma_coordinator_jobs{sel(nre('state', 'SUCCEEDED|FAILED|CANCELLED'))})", "{{state}}"),
            ], description="Jobs not yet finished, by state (PENDING waits on dependencies).", stack=True),
            Panel("Queue depth by kind", [
                (f"sum by (kind) (stemma_coordinator_jobs{sel(eq('state', 'QUEUED'))})", "{{kind}}"),
            ], description="QUEUED jobs: ready to run, waiting for a worker with room.", stack=True),
            Panel("Throughput", [
                (f"sum(rate(stemma_coordinator_jobs_submitted_total{sel()}[$__rate_interval]))", "submitted"),
                (f"sum by (to) ({rate('stemma_coordinator_job_transitions_total', rx('to', 'SUCCEEDED|FAILED|CANCELLED'))})", "{{to}}"),
            ], unit="ops", description="Jobs submitted and finished per second."),
            Panel("Attempts ended by result", [
                (f"sum by (result) ({rate('stemma_coordinator_attempts_ended_total')})", "{{result}}"),
            ], unit="ops", stack=True),
            Panel("Attempt failure share", [
                ("(sum(increase(stemma_coordinator_attempts_ended_total"
                 + sel(rx('result', 'failed|failed_permanently'))
                 + "[$__range])) or vector(0)) / sum(increase(stemma_coordinator_attempts_ended_total"
                 + sel() + "[$__range]))", "failed"),
            ], unit="percentunit", kind="stat", width=4,
                description="Share of attempts over the dashboard's range that failed (retried or not)."),
            Panel("Jobs finished", [
                (f"sum by (state) (stemma_coordinator_jobs{sel(rx('state', 'SUCCEEDED|FAILED|CANCELLED'))})", "{{state}}"),
            ], kind="stat", width=4, description="Finished jobs the coordinator holds."),
        ]),
        Row("Scheduling", [
            Panel("Queue wait", quantiles("stemma_scheduler_queue_wait_seconds"), unit="s",
                  description="Time from QUEUED to ASSIGNED."),
            Panel("Scheduling latency", quantiles("stemma_scheduler_latency_seconds"), unit="s",
                  description="From a job being placeable to its assignment being sent."),
            Panel("Scheduler pass", quantiles("stemma_scheduler_pass_seconds", qs=(0.5, 0.99)), unit="s",
                  description="Duration of one scheduling pass over the queue."),
            Panel("Preemptions", [
                (f"sum by (outcome) ({rate('stemma_scheduler_preemptions_total')})", "{{outcome}}"),
            ], unit="ops", stack=True,
                description="Attempts preempted for a higher-priority job and requeued without spending an "
                            "attempt: stopped (a trainer checkpointed at once and exited) or killed (it did not "
                            "stop within --preemption-grace-s)."),
        ]),
        Row("Demand and timeouts", [
            Panel("Queued GPUs by size", [
                (f"sum by (per_node) (stemma_scheduler_queued_gpus{sel()})", "{{per_node}} per node"),
            ], stack=True, description="GPUs that QUEUED jobs ask for, by GPUs per node (rounded up to a power "
                                       "of two): what the worker pools' ScaledObjects scale on."),
            Panel("GPU demand and capacity", [
                (f"sum(stemma_scheduler_queued_gpus{sel()}) + sum(stemma_coordinator_gpus{sel(eq('state', 'allocated'))})",
                 "asked (queued + allocated)"),
                (f"sum(stemma_coordinator_gpus{sel()})", "offered by live workers"),
            ], description="When the first line stays above the second, the pools are at their maxReplicaCount "
                           "or new worker pods cannot be scheduled."),
            Panel("Attempts near their timeout", [
                (f"max(stemma_coordinator_attempts_near_timeout{sel()})", "past 90%"),
            ], kind="stat", width=4, description="Running attempts that have used more than 90% of their timeout "
                                                 "(StemmaAttemptNearTimeout)."),
            Panel("Largest timeout share", [
                (f"max(stemma_coordinator_attempt_timeout_ratio_max{sel()})", "max"),
            ], unit="percentunit", kind="stat", width=4,
                description="The largest share of its timeout a running attempt has used (0 when none has one)."),
        ]),
        Row("Workers and GPUs", [
            Panel("Workers by state", [
                (f"sum by (state) (stemma_coordinator_workers{sel()})", "{{state}}"),
            ], description="As the coordinator sees them (alive, draining, lost)."),
            Panel("GPUs", [
                (f"sum by (state) (stemma_coordinator_gpus{sel()})", "{{state}}"),
            ], description="GPUs on live workers, free and allocated.", stack=True),
            Panel("Attempts running per worker", [
                (f"sum by (instance) (stemma_worker_attempts_running{sel()})", "{{instance}}"),
            ]),
            Panel("Heartbeat age", [
                (f"histogram_quantile(0.99, sum by (le) ({rate('stemma_coordinator_heartbeat_age_seconds_bucket')}))",
                 "coordinator p99"),
                (f"max by (instance) (stemma_worker_heartbeat_age_seconds{sel()})", "{{instance}}"),
            ], unit="s", description="Time between a worker's heartbeats at the coordinator (p99), "
                                     "and since each worker's last acknowledged heartbeat."),
            Panel("Heartbeat round trip", [
                (f"histogram_quantile(0.99, sum by (instance, le) ({rate('stemma_worker_heartbeat_rtt_seconds_bucket')}))",
                 "{{instance}} p99"),
            ], unit="s"),
            Panel("Workers connected", [
                (f"sum(stemma_worker_connected{sel()})", "connected"),
                (f"count(stemma_worker_connected{sel()})", "running"),
            ], kind="stat", width=4, description="Worker daemons registered with the coordinator, of those scraped."),
            Panel("Worker GPUs in use", [
                (f"sum(stemma_worker_gpus_in_use{sel()})", "in use"),
                (f"sum(stemma_worker_gpus{sel()})", "offered"),
            ], kind="stat", width=4),
            Panel("GPU utilisation", [
                (f"avg by (pod, gpu) ({dcgm('DCGM_FI_DEV_GPU_UTIL')})", "{{pod}} GPU {{gpu}}"),
            ], unit="percent", needs=DCGM,
                description="DCGM_FI_DEV_GPU_UTIL of each GPU a worker pod holds. A GPU of a running training job "
                            "near 0 for long is the hung-collective signature (see StemmaTrainingStalled)."),
            Panel("GPU memory used", [
                (f"max by (pod, gpu) ({dcgm('DCGM_FI_DEV_FB_USED')})", "{{pod}} GPU {{gpu}}"),
            ], unit="decmbytes", needs=DCGM, description="DCGM_FI_DEV_FB_USED (MiB) of each GPU a worker pod holds."),
            Panel("GPU memory used share", [
                (f"max by (pod, gpu) ({dcgm('DCGM_FI_DEV_FB_USED')} / ({dcgm('DCGM_FI_DEV_FB_USED')} + "
                 f"{dcgm('DCGM_FI_DEV_FB_FREE')}))", "{{pod}} GPU {{gpu}}"),
            ], unit="percentunit", needs=DCGM, description="Framebuffer used / (used + free): how close each GPU is to "
                                                           "an out-of-memory error."),
        ]),
        Row("Store and RPC", [
            Panel("SQLite commit time", quantiles("stemma_store_transaction_seconds", qs=(0.5, 0.99)), unit="s",
                  description="One transaction, fsync included; every state change waits for one."),
            Panel("SQLite commit errors", [
                (f"sum({rate('stemma_store_commit_errors_total')})", "failed"),
            ], unit="ops", description="Failed transactions (each is retried until it succeeds; see StemmaStoreErrors)."),
            Panel("Records per commit", [
                (f"sum(rate(stemma_store_transaction_records_sum{sel()}[$__rate_interval])) / "
                 f"sum(rate(stemma_store_transaction_records_count{sel()}[$__rate_interval]))", "mean"),
            ], description="Group commit: how many records share one transaction."),
            Panel("RPC latency p99 by method", [
                (f"histogram_quantile(0.99, sum by (method, le) ({rate('stemma_rpc_server_handling_seconds_bucket')}))",
                 "{{method}}"),
            ], unit="s"),
            Panel("RPC rate by method", [
                (f"sum by (method) ({rate('stemma_rpc_server_handling_seconds_count')})", "{{method}}"),
            ], unit="reqps"),
            Panel("RPC errors by code", [
                (f"sum by (method, code) ({rate('stemma_rpc_requests_total', nre('code', 'OK'))}) > 0",
                 "{{method}} {{code}}"),
            ], unit="reqps", needs=RPC_ERRORS,
                description="Calls (a worker session counts once, when it ends) that ended with a status other "
                            "than OK, by method and gRPC code: UNAUTHENTICATED and PERMISSION_DENIED are "
                            "refused credentials, NOT_FOUND and INVALID_ARGUMENT the caller's mistakes, "
                            "INTERNAL and UNAVAILABLE the coordinator's."),
            Panel("RPC error share", [
                (f"sum({rate('stemma_rpc_requests_total', nre('code', 'OK'))}) / "
                 f"sum({rate('stemma_rpc_requests_total')})", "errors"),
            ], unit="percentunit", kind="stat", width=4,
                description="Share of the calls that ended with an error code."),
            Panel("Stale reports refused", [
                (f"sum({rate('stemma_coordinator_stale_reports_total')})", "refused"),
            ], unit="ops", description="Reports from an attempt that is no longer the job's current one (fencing)."),
            Panel("Auth failures by reason", [
                (f"sum by (job, reason) ({rate('stemma_auth_failures_total')})", "{{job}} {{reason}}"),
            ], unit="ops", needs=AUTH, description="Calls refused for a missing or bad token or a role without the right."),
            Panel("Token-file lines refused", [
                (f"max by (job, instance) (stemma_auth_token_file_malformed_lines{sel()})", "{{job}} {{instance}}"),
            ], unit="short", kind="stat", width=4,
                description="Malformed lines in the token file at its last (re)load: their tokens are refused, "
                            "the other lines apply. -1: the file could not be read (the previous tokens stay)."),
            Panel("Certificate expiry", [
                (f"min by (job, instance, certificate) (stemma_tls_certificate_expiry_timestamp_seconds{sel()}) - time()",
                 "{{job}} {{instance}} {{certificate}}"),
            ], unit="s", needs=TLS,
                description="Time left before each certificate a daemon loads expires (StemmaCertificateExpiring "
                            "fires under 14 days). A renewed file shows at the next scrape."),
            Panel("gRPC handled by code (grpc-prometheus names)", [
                (f"sum by (grpc_service, grpc_code) ({rate('grpc_server_handled_total')}) > 0",
                 "{{grpc_service}} {{grpc_code}}"),
            ], unit="reqps",
                description="grpc_server_handled_total, as go-grpc-prometheus names it: stock gRPC dashboards read "
                            "these series."),
            Panel("gRPC handling p99 (grpc-prometheus names)", [
                (f"histogram_quantile(0.99, sum by (grpc_method, le) ({rate('grpc_server_handling_seconds_bucket', nre('grpc_type', 'bidi_stream|server_stream'))}))",
                 "{{grpc_method}}"),
            ], unit="s", description="grpc_server_handling_seconds of unary calls (a stream's is its whole life)."),
            Panel("Worker attempts finished", [
                (f"sum by (result) ({rate('stemma_worker_attempts_finished_total')})", "{{result}}"),
            ], unit="ops", stack=True),
        ]),
    ],
)

EXPERIMENTS = Dashboard(
    uid="stemma-experiments",
    title="Stemma / Experiments",
    description="Live training per running stage, eval results as they land, checkpoints registered.",
    experiment_vars=True,
    rows=[
        Row("Training", [
            Panel("Training loss", [
                (f"stemma_train_loss{sel(experiment=True)}", "{{experiment}} {{stage}}"),
            ], needs=TRAINING, width=12,
                description="Latest training loss of each running train job."),
            Panel("Tokens per second", [
                (f"stemma_train_tokens_per_second{sel(experiment=True)}", "{{experiment}} {{stage}}"),
            ], unit="short", needs=TRAINING, width=12),
            Panel("Step", [
                (f"stemma_train_step{sel(experiment=True)}", "{{experiment}} {{stage}}"),
            ], needs=TRAINING, width=12, description="Latest optimizer step of each running train job."),
            Panel("Progress", [
                (f"stemma_train_progress_ratio{sel(experiment=True)}", "{{experiment}} {{stage}}"),
            ], unit="percentunit", needs=TRAINING, width=12,
                description="Share of its steps each running train job has done (step / total_steps)."),
            Panel("Seconds per step", [
                (f"stemma_train_step_seconds{sel(experiment=True)}", "{{experiment}} {{stage}}"),
            ], unit="s", needs=STALL, width=8,
                description="Mean wall time per optimizer step (moving average) of the job of each stage that "
                            "reported last."),
            Panel("Time since the last step", [
                (f"time() - stemma_train_last_step_timestamp_seconds{sel(experiment=True)}", "{{experiment}} {{stage}}"),
            ], unit="s", needs=TRAINING, width=8,
                description="Since a running job of the stage last advanced. Rising for a job whose step takes "
                            "seconds: a hung collective, a stuck data loader, a dead rank."),
            Panel("Stalled training jobs", [
                (f"max(stemma_train_stalled_jobs{sel()})", "stalled"),
            ], kind="stat", width=8,
                description="Running training jobs with no step for 10x their mean step time and at least 5 "
                            "minutes (StemmaTrainingStalled)."),
        ]),
        Row("Results", [
            Panel("Eval results", [
                (f"stemma_eval_score{sel(experiment=True)}", "{{experiment}} {{cell}} {{metric}}"),
            ], needs=EVAL_METRICS, width=12,
                description="The latest value of each metric (ppl/uk, acc/belebele_uk, chrf/flores_uk, ...) "
                            "each eval cell (eval-dense[family=slavic], ...) reported, as it lands. Kept after the job ends; "
                            "not restored when the coordinator restarts (stemma metrics and the registry keep them)."),
            Panel("Checkpoints registered", [
                (f"sum by (operation) (increase(stemma_registry_checkpoints_registered_total{sel()}[$__rate_interval]))",
                 "{{operation}}"),
            ], needs=REGISTRY, width=8, stack=True,
                description="Checkpoints entering the registry, by the operation that made them (cpt, soup, merge, ...)."),
            Panel("Checkpoints registered in range", [
                (f"sum(increase(stemma_registry_checkpoints_registered_total{sel()}[$__range]))", "checkpoints"),
            ], needs=REGISTRY, kind="stat", width=4),
        ]),
        Row("Jobs", [
            Panel("Running jobs by kind", [
                (f"sum by (kind) (stemma_coordinator_jobs{sel(eq('state', 'RUNNING'))})", "{{kind}}"),
            ], stack=True),
            Panel("Finished jobs by kind", [
                (f"sum by (kind, state) (stemma_coordinator_jobs{sel(rx('state', 'SUCCEEDED|FAILED'))})", "{{kind}} {{state}}"),
            ]),
            Panel("Failed attempts", [
                (f"sum({rate('stemma_coordinator_attempts_ended_total', rx('result', 'failed|failed_permanently'))})", "failed"),
            ], unit="ops", needs=FAILURES),
        ]),
    ],
)

DASHBOARDS = [CLUSTER, EXPERIMENTS]

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


def query_variable(name: str, label: str, query: str, all_value: str) -> dict:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DATASOURCE,
        "definition": query,
        "query": {"query": query, "refId": f"{name}-variable"},
        "refresh": 2,
        "includeAll": True,
        "multi": True,
        "allValue": all_value,
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "sort": 1,
        "hide": 0,
        "options": [],
        "regex": "",
    }


def variables(dashboard: Dashboard) -> list[dict]:
    out = [
        {
            "name": "datasource",
            "label": "Data source",
            "type": "datasource",
            "query": "prometheus",
            "current": {},
            "hide": 0,
            "refresh": 1,
            "regex": "",
            "options": [],
        },
        query_variable("job", "Job", 'label_values(up{job=~"stemma-.*"}, job)', "stemma-.*"),
        query_variable("instance", "Instance", 'label_values(up{job=~"$job"}, instance)', ".+"),
    ]
    if dashboard.experiment_vars:
        out += [
            query_variable("experiment", "Experiment",
                           'label_values({__name__=~"stemma_train_step|stemma_eval_score", job=~"$job"}, experiment)',
                           ".*"),
            query_variable("stage", "Stage",
                           'label_values({__name__=~"stemma_train_step|stemma_eval_score", job=~"$job", '
                           'experiment=~"$experiment"}, stage)', ".*"),
        ]
    return out


def panel_json(panel: Panel, panel_id: int, x: int, y: int, height: int) -> dict:
    targets = [
        {
            "datasource": DATASOURCE,
            "expr": expr,
            "legendFormat": legend,
            "range": True,
            "refId": chr(ord("A") + i),
        }
        for i, (expr, legend) in enumerate(panel.targets)
    ]
    defaults: dict = {"unit": panel.unit}
    if panel.kind == "timeseries":
        defaults["custom"] = {
            "drawStyle": "line",
            "lineWidth": 1,
            "fillOpacity": 20 if panel.stack else 0,
            "showPoints": "never",
            "stacking": {"mode": "normal" if panel.stack else "none", "group": "A"},
        }
        options = {
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "desc"},
        }
    else:
        options = {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "value",
            "graphMode": "none",
            "textMode": "auto",
        }
    description = panel.description
    if panel.needs:
        description = (description + " " if description else "") + f"Empty until: {panel.needs}."
    return {
        "id": panel_id,
        "type": panel.kind,
        "title": panel.title,
        "description": description,
        "datasource": DATASOURCE,
        "gridPos": {"h": height, "w": panel.width, "x": x, "y": y},
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": options,
        "targets": targets,
    }


def dashboard_json(dashboard: Dashboard) -> dict:
    panels = []
    panel_id = 1
    y = 0
    for row in dashboard.rows:
        panels.append({
            "id": panel_id,
            "type": "row",
            "title": row.title,
            "collapsed": False,
            "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
            "panels": [],
        })
        panel_id += 1
        y += 1
        x = 0
        row_height = 0
        for panel in row.panels:
            height = 4 if panel.kind == "stat" else 8
            if x + panel.width > 24:
                x = 0
                y += row_height
                row_height = 0
            panels.append(panel_json(panel, panel_id, x, y, height))
            panel_id += 1
            x += panel.width
            row_height = max(row_height, height)
        y += row_height
    return {
        "uid": dashboard.uid,
        "title": dashboard.title,
        "description": dashboard.description,
        "tags": ["stemma"],
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "timepicker": {},
        "timezone": "",
        "annotations": {"list": []},
        "links": [{
            "title": "Stemma dashboards",
            "type": "dashboards",
            "tags": ["stemma"],
            "asDropdown": True,
            "includeVars": True,
            "keepTime": True,
        }],
        "templating": {"list": variables(dashboard)},
        "panels": panels,
    }


class _BlockDumper(yaml.SafeDumper):
    """Writes multi-line strings (the longer PromQL expressions) as literal blocks."""


def _str_representer(dumper: yaml.SafeDumper, value: str):
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_BlockDumper.add_representer(str, _str_representer)


def prometheus_rule(rules_text: str, runbook_base: str = RUNBOOK_BASE) -> str:
    rules = yaml.safe_load(rules_text)
    for group in rules["groups"]:
        for rule in group["rules"]:
            url = rule.get("annotations", {}).get("runbook_url")
            if url and runbook_base != RUNBOOK_BASE:
                if not url.startswith(RUNBOOK_BASE + "/runbooks/"):
                    raise SystemExit(f"{rule.get('alert')}: runbook_url {url} is not under {RUNBOOK_BASE}/runbooks/")
                rule["annotations"]["runbook_url"] = runbook_base.rstrip("/") + url[len(RUNBOOK_BASE):]
    obj = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "stemma",
            "labels": {"app.kubernetes.io/name": "stemma", "app.kubernetes.io/part-of": "stemma"},
        },
        "spec": rules,
    }
    header = ("# Generated by deploy/generate.py from deploy/prometheus/stemma-rules.yaml: "
              "edit that file and rerun.\n")
    return header + yaml.dump(obj, Dumper=_BlockDumper, sort_keys=False, width=1000,
                              allow_unicode=True)


def outputs() -> dict[pathlib.Path, str]:
    out = {}
    for d in DASHBOARDS:
        text = json.dumps(dashboard_json(d), indent=2) + "\n"
        out[DASHBOARD_DIR / f"{d.uid}.json"] = text
        out[COMPONENT_DASHBOARDS / f"{d.uid}.json"] = text
    out[PROMETHEUS_RULE] = prometheus_rule(RULES_SOURCE.read_text())
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="compare the checked-in outputs with fresh ones; write nothing")
    parser.add_argument("--runbook-base-url", metavar="URL",
                        help="write only a PrometheusRule (to --rule-out) whose runbook_url is "
                             "URL/runbooks/<alert>.md")
    parser.add_argument("--rule-out", metavar="FILE", help="where --runbook-base-url writes the rule")
    args = parser.parse_args()
    if args.runbook_base_url:
        if not args.rule_out or not args.runbook_base_url.startswith(("https://", "http://")):
            parser.error("--runbook-base-url takes an http(s) URL and needs --rule-out FILE")
        pathlib.Path(args.rule_out).write_text(prometheus_rule(RULES_SOURCE.read_text(), args.runbook_base_url))
        print(f"wrote {args.rule_out}")
        return 0
    stale = []
    for path, text in outputs().items():
        current = path.read_text() if path.exists() else None
        if current == text:
            continue
        if args.check:
            stale.append(path)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path.relative_to(DEPLOY.parent)}")
    for path in stale:
        print(f"{path.relative_to(DEPLOY.parent)} is out of date: run deploy/generate.py", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
