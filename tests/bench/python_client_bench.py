"""tests/bench/python_client: `Client.metrics(EXPERIMENT)` into a pandas DataFrame against
`stemma metrics EXPERIMENT -o json`, the same 10,000 points from the same coordinator.

Setup (not timed): a real stemma-coordinator and stemma-worker on loopback, the client
installed with `pip install ./python` into the run's temp dir, and one experiment whose C
exec cells each `/bin/cat` a file of N/(2C) engine `step` lines (loss and tokens_per_s:
two series per line), waited for, and the number of stored points checked.

Timed, in rounds that interleave the sides (so a noisy moment hits each):
  metrics_df_s      client.metrics(EXPERIMENT) with a connected Client (a notebook's second
                    cell): the QueryMetrics call and building the DataFrame
  cli_json_s        `stemma metrics EXPERIMENT -o json` as a subprocess, to its exit (process
                    start, the same RPC, the JSON printed)
  cli_json_df_s     the same plus json.loads of its stdout into a DataFrame: what a Python
                    user without the client would do
One untimed call first (it imports pandas). Also once: metrics_df_cold_s (import stemma + Client() + the first call, as a fresh
notebook's first cell; measured in a child process).

The last stdout line is one JSON object: points, cells, rounds, the medians above and each
side's per-round values (*_all), ratio_cli_over_client (cli_json_s / metrics_df_s),
ratio_cli_df_over_client, target_metrics_df_s (1.0), meets_target."""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
import cluster as harness  # noqa: E402


def log(text):
    print(f"[python_client] {text}", flush=True)


def make_experiment(c, points, cells):
    lines = points // (2 * cells)
    path = os.path.join(c.dir, "steps.jsonl")
    with open(path, "w") as f:
        for s in range(1, lines + 1):
            f.write(json.dumps({"event": "step", "step": s, "total_steps": lines,
                                "loss": round(3.0 / s, 6), "tokens_per_s": 5000.0 + s}) + "\n")
    values = ", ".join(f'"{i}"' for i in range(cells))
    return (f"name: py-bench\nstages:\n  train:\n    matrix: {{seed: [{values}]}}\n"
            f"    exec: {{argv: [/bin/cat, \"{path}\"]}}\n"), lines * 2 * cells


def time_cli(c, experiment, to_frame):
    import pandas

    t = time.perf_counter()
    done = c.cli("metrics", experiment, "-o", "json", "--limit", "1000000")
    if done.returncode != 0:
        raise RuntimeError(done.stderr)
    if to_frame:
        df = pandas.DataFrame(json.loads(done.stdout))
        n = len(df)
    else:
        n = done.stdout.count('"job"')
    return time.perf_counter() - t, n


def cold_call(site, address, experiment):
    code = ("import sys, time; t = time.perf_counter(); sys.path.insert(0, sys.argv[1]); "
            "import stemma; df = stemma.Client(sys.argv[2]).metrics(sys.argv[3]); "
            "print(time.perf_counter() - t, len(df))")
    out = subprocess.run([sys.executable, "-c", code, site, address, experiment],
                         capture_output=True, text=True, check=True).stdout.split()
    return float(out[0]), int(out[1])


def run_rounds(c, client, experiment, points, rounds):
    sides = {"metrics_df_s": [], "cli_json_s": [], "cli_json_df_s": []}
    for r in range(rounds):
        t = time.perf_counter()
        df = client.metrics(experiment, limit=1_000_000)
        sides["metrics_df_s"].append(time.perf_counter() - t)
        if len(df) != points:
            raise RuntimeError(f"the client read {len(df)} points, not {points}")
        for key, frame in (("cli_json_s", False), ("cli_json_df_s", True)):
            seconds, n = time_cli(c, experiment, frame)
            if n != points:
                raise RuntimeError(f"the CLI printed {n} points, not {points}")
            sides[key].append(seconds)
        log(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.3f}" for k, v in sides.items()))
    return sides


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bin", required=True)
    p.add_argument("--points", type=int, default=10_000)
    p.add_argument("--cells", type=int, default=4)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--keep-tmp", action="store_true")
    a = p.parse_args()
    c = harness.Cluster(a.bin, keep=a.keep_tmp)
    ok = False
    try:
        site = harness.install_client(c.dir)
        import stemma

        c.start_coordinator()
        c.start_worker("w1", cpus=4)
        c.wait_for_workers(1)
        text, points = make_experiment(c, a.points, a.cells)
        client = stemma.Client(c.address)
        client.sweep(text)
        client.wait(experiment="py-bench", timeout=300, check=True)
        log(f"experiment py-bench: {a.cells} cells, {points} points")
        cold, n = cold_call(site, c.address, "py-bench")
        if n != points:
            raise RuntimeError(f"the coordinator holds {n} points, not {points}")
        client.metrics("py-bench")  # pandas imported, as in a notebook's later cells
        sides = run_rounds(c, client, "py-bench", points, a.rounds)
        ok = True
    finally:
        c.close(failed=not ok)
    med = {k: statistics.median(v) for k, v in sides.items()}
    result = {"points": points, "cells": a.cells, "rounds": a.rounds,
              "metrics_df_s": round(med["metrics_df_s"], 4),
              "metrics_df_cold_s": round(cold, 4),
              "cli_json_s": round(med["cli_json_s"], 4),
              "cli_json_df_s": round(med["cli_json_df_s"], 4),
              "ratio_cli_over_client": round(med["cli_json_s"] / med["metrics_df_s"], 2),
              "ratio_cli_df_over_client": round(med["cli_json_df_s"] / med["metrics_df_s"], 2),
              "target_metrics_df_s": 1.0, "meets_target": med["metrics_df_s"] <= 1.0}
    for k, v in sides.items():
        result[k.replace("_s", "_all")] = [round(x, 4) for x in v]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
