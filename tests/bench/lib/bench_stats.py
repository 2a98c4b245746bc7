#!/usr/bin/env python3
"""Statistics for tests/bench/orchestration.

  bench_stats.py free-ports K
      Prints K distinct free TCP ports on 127.0.0.1, one a line.
  bench_stats.py slurm TS_DIR SUBMIT_US JOBS
      Reads one file per job from TS_DIR, each "START_US END_US" (epoch microseconds written
      by the job itself) and prints JSON {jobs_per_s, burst_latency_p50_ms, ...}:
      throughput = JOBS / (last job end - submit start), burst latency = job start - submit
      start (queue wait behind the other array tasks included).
  bench_stats.py slurm-latency PAIRS_FILE JOBS
      Unloaded latency phase: PAIRS_FILE has one line per job, "SUBMIT_US START_US" (START_US
      "-" if the job did not start in time); prints JSON {latency_p50_ms, latency_p99_ms, ...}
      with latency = START_US - SUBMIT_US.
  bench_stats.py stemma-workers WORKERS_JSON
      Prints how many ALIVE workers `stemma workers -o json` lists.
  bench_stats.py stemma-states LS_JSON [IDS_FILE]
      Prints "<total> <succeeded> <terminal>" for the jobs (restricted to IDS_FILE's ids).
  bench_stats.py stemma LS_JSON SUBMIT_MS JOBS [IDS_FILE]
      From `stemma ls --all -o json` (fields id, state, created_ms, started_ms, finished_ms):
      throughput = JOBS / (max finished_ms - submit start), burst latency = started_ms -
      created_ms (queue wait behind the other jobs of the burst included).
  bench_stats.py stemma-latency LS_JSON IDS_FILE SUBMITS_FILE
      Unloaded latency phase: jobs submitted one at a time; IDS_FILE has their ids, SUBMITS_FILE
      one "ID SUBMIT_US" line per job (epoch us just before `stemma submit` ran). Prints JSON
      {latency_p50_ms, latency_p99_ms, ...}: latency = started_ms - created_ms (coordinator
      timestamps); cli_latency = started_ms - SUBMIT_US (includes the CLI's own start-up and
      connect, comparable to Slurm's sbatch-to-start); submitted_while_busy counts jobs created
      before the coordinator had recorded the previous one finished (the worker reports some
      completions a few tens of ms late; with C slots one unfinished job still leaves C-1
      free, so a few are harmless).
  bench_stats.py final --jobs N --concurrency C [--spawn F] [--stemma F] [--slurm F]
                       [--stemma-latency F] [--slurm-latency F]
      Merges the per-part JSON files (missing or empty -> null fields) into the one result line.
"""
import json
import math
import os
import socket
import sys

TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED", "CANCELED", "LOST", "TIMED_OUT", "TIMEOUT",
            "KILLED", "ERROR"}


def percentile(values, q):
    """Linear interpolation between closest ranks (numpy's default), q in [0, 100]."""
    if not values:
        return None
    v = sorted(values)
    if len(v) == 1:
        return float(v[0])
    pos = (len(v) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = math.ceil(pos)
    return float(v[lo] + (v[hi] - v[lo]) * (pos - lo))


def max_overlap(starts, ends):
    """Most jobs running at the same moment, from their own start/end timestamps."""
    events = sorted([(e, -1) for e in ends] + [(s, 1) for s in starts])
    cur = best = 0
    for _, d in events:
        cur += d
        best = max(best, cur)
    return best


def rnd(x, nd=3):
    return None if x is None else round(x, nd)


def load_json(path):
    with open(path) as f:
        text = f.read().strip()
    return json.loads(text) if text else None


def job_list(doc):
    """`ls -o json` / `workers -o json` may be a bare array or an object wrapping one."""
    if isinstance(doc, list):
        return doc
    if isinstance(doc, dict):
        for key in ("jobs", "workers", "items", "data"):
            if isinstance(doc.get(key), list):
                return doc[key]
    return []


def read_ids(path):
    if not path or not os.path.exists(path):
        return None
    ids = set()
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                ids.add(line.split()[0])
    return ids or None


def select_jobs(ls_path, ids_path):
    jobs = job_list(load_json(ls_path))
    ids = read_ids(ids_path)
    if ids is not None:
        picked = [j for j in jobs if str(j.get("id")) in ids]
        if picked:
            return picked
    return jobs


def norm_state(s):
    s = str(s or "").upper()
    return s[len("JOB_STATE_"):] if s.startswith("JOB_STATE_") else s


def cmd_free_ports(k):
    socks, ports = [], []
    for _ in range(k):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    print("\n".join(str(p) for p in ports))


def cmd_slurm(ts_dir, submit_us, jobs):
    submit_us = int(submit_us)
    jobs = int(jobs)
    starts, ends = [], []
    for name in os.listdir(ts_dir):
        try:
            with open(os.path.join(ts_dir, name)) as f:
                parts = f.read().split()
            s, e = (int(p.replace(".", "")) for p in parts[:2])
        except (OSError, ValueError):
            continue
        starts.append(s)
        ends.append(e)
    out = {"completed": len(starts)}
    if starts:
        span_s = (max(ends) - submit_us) / 1e6
        lat_ms = [(s - submit_us) / 1e3 for s in starts]
        out.update({
            "seconds": rnd(span_s),
            "jobs_per_s": rnd(len(starts) / span_s if span_s > 0 else None, 1),
            "burst_latency_p50_ms": rnd(percentile(lat_ms, 50), 1),
            "burst_latency_p99_ms": rnd(percentile(lat_ms, 99), 1),
            "first_start_ms": rnd(min(lat_ms), 1),
            "max_concurrent": max_overlap(starts, ends),
        })
        if len(starts) < jobs:
            out["jobs_per_s"] = None  # incomplete run: no honest throughput
    print(json.dumps(out))


def cmd_stemma_workers(path):
    try:
        workers = job_list(load_json(path))
        print(sum(str(w.get("state", "ALIVE")).upper().endswith("ALIVE") for w in workers
                  if isinstance(w, dict)))
    except (OSError, ValueError):
        print(0)


def cmd_stemma_states(ls_path, ids_path=None):
    jobs = select_jobs(ls_path, ids_path)
    states = [norm_state(j.get("state")) for j in jobs]
    print(len(states), sum(s == "SUCCEEDED" for s in states), sum(s in TERMINAL for s in states))


def cmd_stemma(ls_path, submit_ms, jobs, ids_path=None):
    submit_ms = float(submit_ms)
    jobs = int(jobs)
    rows = select_jobs(ls_path, ids_path)
    states = {}
    for j in rows:
        s = norm_state(j.get("state"))
        states[s] = states.get(s, 0) + 1
    finished = [float(j["finished_ms"]) for j in rows if j.get("finished_ms")]
    lat = [float(j["started_ms"]) - float(j["created_ms"]) for j in rows
           if j.get("started_ms") and j.get("created_ms")]
    out = {"listed": len(rows), "states": states,
           "succeeded": states.get("SUCCEEDED", 0)}
    if finished:
        span_s = (max(finished) - submit_ms) / 1e3
        out["seconds"] = rnd(span_s)
        out["jobs_per_s"] = rnd(jobs / span_s if span_s > 0 else None, 1)
        if out["succeeded"] < jobs:
            out["jobs_per_s"] = None  # incomplete run: no honest throughput
    out["burst_latency_p50_ms"] = rnd(percentile(lat, 50), 2)
    out["burst_latency_p99_ms"] = rnd(percentile(lat, 99), 2)
    print(json.dumps(out))


def latency_summary(lat_ms, jobs, nd):
    return {
        "jobs": jobs,
        "measured": len(lat_ms),
        "latency_p50_ms": rnd(percentile(lat_ms, 50), nd),
        "latency_p99_ms": rnd(percentile(lat_ms, 99), nd),
        "latency_min_ms": rnd(min(lat_ms), nd) if lat_ms else None,
        "latency_max_ms": rnd(max(lat_ms), nd) if lat_ms else None,
    }


def cmd_stemma_latency(ls_path, ids_path, submits_path):
    submit_us = {}
    with open(submits_path) as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 2:
                submit_us[parts[0]] = int(parts[1])
    rows = select_jobs(ls_path, ids_path)
    ids = read_ids(ids_path) or set()
    rows = [j for j in rows if str(j.get("id")) in ids]
    rows.sort(key=lambda j: float(j.get("created_ms") or 0))
    lat, cli_lat, busy = [], [], 0
    prev_finished = None
    for j in rows:
        created, started = j.get("created_ms"), j.get("started_ms")
        if started and created:
            lat.append(float(started) - float(created))
            sub = submit_us.get(str(j.get("id")))
            if sub is not None:
                cli_lat.append(float(started) - sub / 1e3)
        if prev_finished is not None and created and \
                (not prev_finished or float(created) < float(prev_finished)):
            busy += 1
        prev_finished = j.get("finished_ms")
    states = {}
    for j in rows:
        s = norm_state(j.get("state"))
        states[s] = states.get(s, 0) + 1
    out = latency_summary(lat, len(submit_us), 2)
    out.update({
        "cli_latency_p50_ms": rnd(percentile(cli_lat, 50), 2),
        "cli_latency_p99_ms": rnd(percentile(cli_lat, 99), 2),
        "submitted_while_busy": busy,
        "states": states,
    })
    print(json.dumps(out))


def cmd_slurm_latency(pairs_path, jobs):
    lat = []
    with open(pairs_path) as f:
        for line in f:
            parts = line.split()
            if len(parts) < 2 or parts[1] == "-":
                continue
            try:
                sub, start = int(parts[0]), int(parts[1].replace(".", ""))
            except ValueError:
                continue
            lat.append((start - sub) / 1e3)
    print(json.dumps(latency_summary(lat, int(jobs), 1)))


def part(path):
    if not path or not os.path.exists(path):
        return {}
    try:
        doc = load_json(path)
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}


def ratio(a, b):
    if a is None or b is None or b == 0:
        return None
    return round(a / b, 3)


def cmd_final(argv):
    args = {}
    it = iter(argv)
    for k in it:
        args[k.lstrip("-")] = next(it, None)
    spawn = part(args.get("spawn"))
    stemma = part(args.get("stemma"))
    slurm = part(args.get("slurm"))
    stemma_lat = part(args.get("stemma-latency"))
    slurm_lat = part(args.get("slurm-latency"))
    st = stemma.get("jobs_per_s")
    sl = slurm.get("jobs_per_s")
    sp = spawn.get("jobs_per_s")
    out = {
        "stemma_jobs_per_s": st,
        "slurm_jobs_per_s": sl,
        "spawn_limit_jobs_per_s": sp,
        "throughput_ratio": ratio(st, sl),
        "ratio_vs_spawn_limit": ratio(st, sp),
        "stemma_latency_p50_ms": stemma_lat.get("latency_p50_ms"),
        "stemma_latency_p99_ms": stemma_lat.get("latency_p99_ms"),
        "slurm_latency_p50_ms": slurm_lat.get("latency_p50_ms"),
        "slurm_latency_p99_ms": slurm_lat.get("latency_p99_ms"),
        "latency_ratio": ratio(slurm_lat.get("latency_p50_ms"),
                               stemma_lat.get("latency_p50_ms")),
        "stemma_cli_latency_p50_ms": stemma_lat.get("cli_latency_p50_ms"),
        "stemma_cli_latency_p99_ms": stemma_lat.get("cli_latency_p99_ms"),
        "stemma_burst_latency_p50_ms": stemma.get("burst_latency_p50_ms"),
        "stemma_burst_latency_p99_ms": stemma.get("burst_latency_p99_ms"),
        "slurm_burst_latency_p50_ms": slurm.get("burst_latency_p50_ms"),
        "slurm_burst_latency_p99_ms": slurm.get("burst_latency_p99_ms"),
        "stemma_latency_jobs": stemma_lat.get("measured"),
        "slurm_latency_jobs": slurm_lat.get("measured"),
        "jobs": int(args["jobs"]),
        "concurrency": int(args["concurrency"]),
    }
    print(json.dumps(out))


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    cmd, rest = argv[1], argv[2:]
    if cmd == "free-ports":
        cmd_free_ports(int(rest[0]))
    elif cmd == "slurm":
        cmd_slurm(*rest)
    elif cmd == "stemma-workers":
        cmd_stemma_workers(*rest)
    elif cmd == "stemma-states":
        cmd_stemma_states(*rest)
    elif cmd == "stemma":
        cmd_stemma(*rest)
    elif cmd == "stemma-latency":
        cmd_stemma_latency(*rest)
    elif cmd == "slurm-latency":
        cmd_slurm_latency(*rest)
    elif cmd == "final":
        cmd_final(rest)
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
