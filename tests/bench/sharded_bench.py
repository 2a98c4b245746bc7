"""Sharded training: Stemma against PyTorch FSDP2 (2 CPU ranks, gloo), and full vs none.

Run through tests/bench/sharded (which picks the venv Python). One run, this machine:

  side by side  the same Llama (made here with transformers from a fixed seed, HF layout,
                Stemma's byte tokenizer), the same token rows (cut from the dataset Stemma
                reads, shuffle off), the same global batch and AdamW settings. Stemma: two
                `stemma-engine train` processes (RANK 0/1 on loopback) at `--shard` (default
                full) with activation_checkpointing: 1. FSDP2: `torchrun --nproc-per-node 2
                sharded_fsdp2.py` (fully_shard per decoder layer, gloo, gradient
                checkpointing). One thread per rank on both sides (2 cores here).
  peak RSS      per rank: Stemma's through /usr/bin/time (%M, the process's max RSS); FSDP2's
                from getrusage(RUSAGE_SELF) inside each rank. The larger rank counts.
  tokens/s      global tokens over the measured steps (after the warm-up ones): Stemma from
                the arrival times of rank 0's step events; FSDP2 from each step's wall time.
  full vs none  the issue's figure: Stemma's peak RSS per rank (the larger rank) at `--shard`
                against `none` at the same world size, --big-ranks (4) ranks, for a model
                whose weights and optimizer state dominate (1024 hidden, 2816 FFN,
                --big-layers 7: 94.1 M parameters; 16-token rows, one row per rank, 3 steps;
                ~2.4 GiB per rank at none, so the four ranks stay under ~10 GiB). Each
                configuration runs alone (its ranks at once, never two configurations), and
                waits for the MemAvailable it needs. Peak RSS is /usr/bin/time's %M (VmHWM);
                peak RssAnon (polled every 5 ms) beside it, and per phase: `load` (before rank
                0's start event: loading the model, building the optimizer or the shards),
                `steps`, `publish`. `full_vs_none_memory_2ranks_small` is the same at 2 ranks
                for a 4-layer model (55.6 M), where 0.5 is ZeRO-3's floor itself.
  plan error    the memory plan (coordinator/experiments/memory.*, `stemma plan -o json` on a
                private coordinator, lib/private_plan.py, binaries beside the engine) for the
                big model at `--shard` (`plan_error`; at none: `plan_error_none`; the small
                one: `plan_error_2ranks_small`) against its measured peak anonymous RSS per
                rank, both above the runtime (the same command on a model of a few hundred
                parameters at the same world size), as tests/check_memory_plan.py does:
                |(plan − plan_runtime) / (anon − anon_runtime) − 1|. Null when the control
                plane binaries are not built (the JSON says why).

  profile       each Stemma rank prints where its time went (STEMMA_TRAIN_PROFILE: load,
                forward and backward compute, gathers, reduce-scatters, optimizer, in
                seconds): `stemma_profile_per_rank` (side by side), `memory_*.<shard>_profile
                _per_rank`.
  floor         at W ranks ZeRO-3 holds 16/W bytes per trainable parameter against shard
                none's 16 (+4 of autograd's gradients), so `full_vs_none_memory` cannot go
                below ~1/W plus what the runtime, the gathered layers and activations add;
                `..._above_runtime` takes the runtime (the tiny model's peak RSS) off both
                sides. `notes` says, in the run's own numbers, whether loading (each rank reads
                only its slices of the mapped checkpoint, since a610e0a) or the steps make the
                sharded peak, and why a ratio misses 0.5. `targets_met` says which targets this run
                met.

If the engine refuses `--shard` (e.g. `full` not built), the run falls back to `gradients` and
records the level it used in `stemma_shard`. The last stdout line is one JSON object.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "lib"))
import private_plan  # noqa: E402  (stemma plan on a private coordinator)
import train_bench  # noqa: E402  (make_model, make_text)

OPTIMIZER = {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}
CLIP = 1.0


def log(message):
    print(f"[bench sharded] {message}", file=sys.stderr, flush=True)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--engine", default="build/bin/stemma-engine")
    p.add_argument("--shard", default="full")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--intermediate", type=int, default=704)
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--warmup-steps", type=int, default=2)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--big-layers", type=int, default=7,
                   help="decoder layers of the full-vs-none model (7: 94.1 M parameters)")
    p.add_argument("--big-ranks", type=int, default=4)
    p.add_argument("--keep-tmp", action="store_true")
    return p.parse_args()


def model_args(args, **overrides):
    fields = dict(vocab=args.vocab, hidden=args.hidden, intermediate=args.intermediate,
                  layers=args.layers, heads=args.heads, seq_len=args.seq_len)
    fields.update(overrides)
    return argparse.Namespace(**fields)


def stemma_spec(model_dir, data_dir, out, seq_len, batch, steps, shard):
    return {
        "model": model_dir, "out": out, "overwrite": True,
        "data": {"datasets": [{"path": data_dir, "weight": 1.0}], "seq_len": seq_len,
                 "shuffle": False},
        "batch_size": batch, "steps": steps, "threads": 1, "seed": 0,
        "optimizer": OPTIMIZER, "schedule": {"type": "constant", "warmup_steps": 0},
        "clip_grad_norm": CLIP, "log_every": 1,
        "parallel": {"shard": shard}, "activation_checkpointing": 1,
    }


def rss_kib(pid):
    """(RssAnon, VmRSS) of `pid` in KiB; (0, 0) once it is gone."""
    anon = rss = 0
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    anon = int(line.split()[1])
                elif line.startswith("VmRSS:"):
                    rss = int(line.split()[1])
    except OSError:
        pass
    return anon, rss


class AnonPoller:
    """RssAnon and VmRSS (KiB) of each of `pids`, polled every 5 ms on a thread until stop():
    the peak RssAnon per rank, and (time, RssAnon, VmRSS) samples for the peaks per phase."""

    def __init__(self, pids):
        self.pids, self.peaks, self.done = pids, [0] * len(pids), False
        self.samples = [[] for _ in pids]
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()

    def _poll(self):
        while not self.done:
            now = time.perf_counter()
            for i, pid in enumerate(self.pids):
                anon, rss = rss_kib(pid)
                self.peaks[i] = max(self.peaks[i], anon)
                if anon:
                    self.samples[i].append((now, anon, rss))
            time.sleep(0.005)

    def stop(self):
        self.done = True
        self.thread.join()
        return self.peaks

    def phase_peaks(self, begin, end, field=1):
        """Each rank's peak RssAnon (field 1) or VmRSS (field 2), KiB, over the samples taken
        in [begin, end)."""
        return [max((x[field] for x in s if begin <= x[0] < end), default=0)
                for s in self.samples]


def run_stemma(engine, workdir, name, spec, world=2):
    """Runs `spec` as `world` ranks, one after the other configuration (never two at once).
    Returns a dict: rank 0's step arrival times and losses (by step), peak RSS per rank (KiB,
    /usr/bin/time's %M: the process's VmHWM), peak RssAnon per rank (KiB, of the engine, the
    child of /usr/bin/time), the peak RssAnon per rank in each phase ("load": before rank 0's
    start event, i.e. loading the model and building the optimizer or the shards; "steps":
    until rank 0's last step event; "publish": after it), and each rank's
    STEMMA_TRAIN_PROFILE line (None where it printed none); the same per phase for VmRSS
    (polled, so a little below VmHWM at most). Raises RuntimeError with rank 0's
    error."""
    spec_path = os.path.join(workdir, f"{name}.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    port = 29000 + os.getpid() % 20000
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1",
                   STEMMA_TRAIN_PROFILE="1")
        rss = os.path.join(workdir, f"{name}.rss.{rank}")
        procs.append((subprocess.Popen(
            ["/usr/bin/time", "-f", "%M", "-o", rss, engine, "train", "--spec", spec_path],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env), rss))
    poller = AnonPoller([engine_pid(p.pid) for p, _ in procs])
    stamps, losses, started = {}, {}, None
    for line in procs[0][0].stdout:
        now = time.perf_counter()
        event = json.loads(line) if line.startswith("{") else {}
        if event.get("event") == "start":
            started = now
        elif event.get("event") == "step":
            stamps[event["step"]] = now
            losses[event["step"]] = event["loss"]
    errors = [p.stderr.read() for p, _ in procs]
    codes = [p.wait() for p, _ in procs]
    anon = poller.stop()
    if any(codes):
        raise RuntimeError(f"{name}: exit codes {codes}: {errors[0][-2000:]}")
    last = stamps[max(stamps)] if stamps else float("inf")
    started = started if started is not None else last
    peaks = []
    for _, rss in procs:
        with open(rss) as f:
            peaks.append(int(f.read().split()[-1]))
    phases = {"load": (0, started), "steps": (started, last), "publish": (last, float("inf"))}
    return {"stamps": stamps, "losses": losses, "rss_kb": peaks, "anon_kb": anon,
            "anon_kb_by_phase": {k: poller.phase_peaks(*v) for k, v in phases.items()},
            "rss_kb_by_phase": {k: poller.phase_peaks(*v, field=2) for k, v in phases.items()},
            "profiles": [profile_of(text) for text in errors]}


def profile_of(stderr_text):
    """The JSON of a rank's "train profile: {...}" line (STEMMA_TRAIN_PROFILE), or None."""
    for line in stderr_text.splitlines():
        if line.startswith("train profile: "):
            return json.loads(line[len("train profile: "):])
    return None


def engine_pid(time_pid):
    """The pid of /usr/bin/time's child (the engine), waiting up to 5 s for it to exist."""
    for _ in range(1000):
        try:
            with open(f"/proc/{time_pid}/task/{time_pid}/children") as f:
                children = f.read().split()
            if children:
                return int(children[0])
        except OSError:
            return time_pid
        time.sleep(0.005)
    return time_pid


def plan_mib(bin_dir, workdir, trains):
    """The memory plan's estimate (MiB per rank) for each (train spec, ranks), from `stemma
    plan -o json` on a private coordinator (lib/private_plan.py); None when the control plane
    is not built beside the engine."""
    if private_plan.missing_binaries(bin_dir):
        return None
    stages = {f"c{i}": {"resources": {"cpus": 1, "ranks_per_part": ranks}, "train": spec}
              for i, (spec, ranks) in enumerate(trains)}
    exp = os.path.join(workdir, "plan.json")
    with open(exp, "w") as f:
        json.dump({"name": "benchplan", "stages": stages}, f)
    cells = private_plan.plan_cells(bin_dir, exp)
    return [int(cells[f"c{i}"].get("memory_per_device_mb", 0)) for i in range(len(trains))]


def run_fsdp2(args, workdir, model_dir, rows_path):
    cfg = {"model_dir": model_dir, "rows": rows_path, "batch": args.batch,
           "warmup_steps": args.warmup_steps, "steps": args.steps, "threads": 1,
           "checkpointing": True, "lr": OPTIMIZER["lr"], "betas": OPTIMIZER["betas"],
           "eps": OPTIMIZER["eps"], "weight_decay": OPTIMIZER["weight_decay"], "clip": CLIP,
           "out": os.path.join(workdir, "fsdp2")}
    cfg_path = os.path.join(workdir, "fsdp2.json")
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    result = subprocess.run(
        [torchrun, "--nproc-per-node", "2", "--master-port", str(30000 + os.getpid() % 20000),
         os.path.join(HERE, "sharded_fsdp2.py"), cfg_path],
        capture_output=True, text=True, env=env)
    if result.returncode != 0:
        sys.exit(f"bench sharded: FSDP2 failed ({result.returncode}):\n{result.stderr[-4000:]}")
    ranks = []
    for rank in range(2):
        with open(f"{cfg['out']}.{rank}.json") as f:
            ranks.append(json.load(f))
    return ranks


def make_data(engine, workdir, name, margs, rows_needed, torch, transformers, np):
    model_dir = os.path.join(workdir, f"{name}-model")
    train_bench.make_model(margs, model_dir, torch, transformers)
    text = os.path.join(workdir, f"{name}.txt")
    train_bench.make_text(text, int(rows_needed * (margs.seq_len + 1) * 1.1) + 10_000)
    data_dir = os.path.join(workdir, f"{name}-tokens")
    train_bench.run([engine, "tokenize", "--tokenizer", model_dir, "--input", text, "--format",
                     "text", "--language", "xx", "--out", data_dir, "--eos"])
    with open(os.path.join(data_dir, "index.json")) as f:
        index = json.load(f)
    stream = np.concatenate([np.fromfile(os.path.join(data_dir, s["file"]), dtype="<u4")
                             for s in index["shards"]])
    width = margs.seq_len + 1
    rows = stream[:rows_needed * width].astype(np.int64).reshape(rows_needed, width)
    return model_dir, data_dir, rows


def stemma_with_fallback(engine, workdir, name, make_spec, shard):
    try:
        return shard, run_stemma(engine, workdir, name, make_spec(shard))
    except RuntimeError as e:
        if shard == "gradients":
            raise
        log(f"shard {shard} refused ({str(e)[-300:].strip()}); falling back to gradients")
        return "gradients", run_stemma(engine, workdir, name, make_spec("gradients"))


def params_of(m):
    """Parameters of train_bench.make_model's Llama (untied head, no GQA)."""
    layer = 4 * m.hidden * m.hidden + 3 * m.hidden * m.intermediate + 2 * m.hidden
    return m.layers * layer + 2 * m.vocab * m.hidden + m.hidden


def mem_available_kib():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1])
    return 0


def wait_for_memory(need_kib, what):
    """Starts `what` only when MemAvailable holds need_kib (builds share this machine and their
    memory comes and goes): waits up to 5 minutes, then exits saying so."""
    for _ in range(30):
        if mem_available_kib() >= need_kib:
            return
        log(f"{what} needs ~{need_kib / 2**20:.1f} GiB, MemAvailable "
            f"{mem_available_kib() / 2**20:.1f} GiB: waiting")
        time.sleep(10)
    sys.exit(f"bench sharded: {what} needs ~{need_kib / 2**20:.1f} GiB and MemAvailable stayed "
             f"at {mem_available_kib() / 2**20:.1f} GiB (pass a smaller --big-layers)")


class MemoryConfig:
    """One `full` (or --shard) against `none` comparison: a model whose weights and optimizer
    state dominate (short rows, one row per rank), its runs at both levels and the runtime
    (the same command on a model of a few hundred parameters) at the same world size."""

    def __init__(self, name, margs, ranks, steps=3):
        self.name, self.margs, self.ranks, self.steps = name, margs, ranks, steps
        self.params = params_of(margs)

    def make(self, engine, workdir, tiny, deps):
        self.workdir = workdir
        self.model, self.data, _ = make_data(engine, workdir, self.name, self.margs,
                                             self.ranks * self.steps, *deps)
        self.tiny_model, self.tiny_data = tiny

    def spec(self, level):
        seq = self.margs.seq_len
        return stemma_spec(self.model, self.data, os.path.join(self.workdir, f"{self.name}-out"),
                           seq, self.ranks, self.steps, level)

    def runtime_spec(self, level):
        return stemma_spec(self.tiny_model, self.tiny_data,
                           os.path.join(self.workdir, f"{self.name}-tiny-out"),
                           self.margs.seq_len, self.ranks, self.steps, level)

    def run(self, engine, shard, none_plan_mib):
        """Runs none, `shard` and the runtime, one configuration at a time."""
        need = self.ranks * 1.15 * (none_plan_mib * 1024 if none_plan_mib
                                    else 20 * self.params / 1024 + 512 * 1024)
        wait_for_memory(need, f"{self.name} at shard none on {self.ranks} ranks")
        log(f"Stemma, {self.name} model ({self.params / 1e6:.1f} M), {self.ranks} ranks, none")
        self.none = run_stemma(engine, self.workdir, f"{self.name}-none", self.spec("none"),
                               self.ranks)
        log(f"Stemma, {self.name} model, {self.ranks} ranks, {shard}")
        self.sharded = run_stemma(engine, self.workdir, f"{self.name}-{shard}", self.spec(shard),
                                  self.ranks)
        log(f"Stemma, runtime model, {self.ranks} ranks, {shard}")
        self.runtime = run_stemma(engine, self.workdir, f"{self.name}-runtime",
                                  self.runtime_spec(shard), self.ranks)

    def ratios(self):
        """(peak RSS ratio, peak RssAnon ratio, peak RSS ratio above the runtime)."""
        none, sharded, rt = (max(r["rss_kb"]) for r in (self.none, self.sharded, self.runtime))
        anon = max(self.sharded["anon_kb"]) / max(self.none["anon_kb"])
        above = (sharded - rt) / (none - rt) if none > rt else None
        return sharded / none, anon, above

    def plan_error(self, plan, plan_runtime, none=False):
        """|(plan − plan_runtime) / (anon − anon_runtime) − 1| for the sharded run (or the
        none run: its runtime is the same tiny model's at the sharded level)."""
        run = self.none if none else self.sharded
        measured = (max(run["anon_kb"]) - max(self.runtime["anon_kb"])) / 1024.0
        return abs((plan - plan_runtime) / measured - 1) if measured > 0 else None

    def figures(self, shard):
        m = self.margs
        return {
            "model": {"params": self.params, "hidden": m.hidden, "layers": m.layers,
                      "intermediate": m.intermediate, "vocab": m.vocab, "seq_len": m.seq_len,
                      "global_batch": self.ranks, "steps": self.steps, "ranks": self.ranks},
            "none_peak_rss_kb_per_rank": self.none["rss_kb"],
            f"{shard}_peak_rss_kb_per_rank": self.sharded["rss_kb"],
            "runtime_peak_rss_kb_per_rank": self.runtime["rss_kb"],
            "none_peak_anon_kb_per_rank": self.none["anon_kb"],
            f"{shard}_peak_anon_kb_per_rank": self.sharded["anon_kb"],
            "runtime_peak_anon_kb_per_rank": self.runtime["anon_kb"],
            "none_peak_anon_kb_by_phase": self.none["anon_kb_by_phase"],
            f"{shard}_peak_anon_kb_by_phase": self.sharded["anon_kb_by_phase"],
            "none_peak_rss_kb_by_phase": self.none["rss_kb_by_phase"],
            f"{shard}_peak_rss_kb_by_phase": self.sharded["rss_kb_by_phase"],
            f"{shard}_profile_per_rank": self.sharded["profiles"],
        }


def note_floor(cfg, shard):
    """Why full_vs_none misses 0.5 on a config, in the run's own numbers ([] if it does not)."""
    ratio, _, above = cfg.ratios()
    if ratio <= 0.5:
        return []
    runtime_kb, none_kb = max(cfg.runtime["rss_kb"]), max(cfg.none["rss_kb"])
    above_text = f"{above:.3f}" if above is not None else "unknown"
    return [f"{cfg.name} ({cfg.params / 1e6:.1f} M, {cfg.ranks} ranks): {shard} vs none "
            f"{ratio:.3f} > 0.5: ZeRO-3's floor is 1/{cfg.ranks} of shard none's optimizer "
            f"state and weights before anything else, and the runtime (the tiny model's peak "
            f"RSS, {runtime_kb / 1024:.0f} MiB) is {100 * runtime_kb / none_kb:.0f} % of shard "
            f"none's peak; above the runtime the ratio is {above_text}"]


def note_load(cfg, shard):
    """Whether loading (each rank reads only its slices of the mapped checkpoint) or the steps
    make the sharded run's peak, in the run's own numbers."""
    anon, rss = cfg.sharded["anon_kb_by_phase"], cfg.sharded["rss_kb_by_phase"]
    load, steps, publish = (max(anon[k]) / 1024 for k in ("load", "steps", "publish"))
    rss_load, rss_steps = max(rss["load"]) / 1024, max(rss["steps"]) / 1024
    model_mib = 4 * cfg.params / 2**20
    none_mib = max(cfg.none["anon_kb"]) / 1024
    text = (f"{cfg.name} ({cfg.params / 1e6:.1f} M) at {shard}, {cfg.ranks} ranks: peak "
            f"RssAnon per rank while loading and sharding {load:.0f} MiB (each rank reads only its "
            f"slices of the checkpoint; the whole fp32 model is {model_mib:.0f} MiB), in the steps "
            f"{steps:.0f} MiB, publishing {publish:.0f} MiB (shard none: {none_mib:.0f} MiB): "
            f"the load-time peak {'dominates' if load > steps else 'does not dominate'}")
    if load > steps:
        text += f" (the steps alone: {steps / none_mib:.3f} of none)"
    text += (f". Peak RSS (VmRSS polled; VmHWM is the figure) while loading {rss_load:.0f} "
             f"MiB, in the steps {rss_steps:.0f} MiB: loading also maps the checkpoint "
             f"(up to {model_mib:.0f} MiB of file pages, shared by the ranks; each touches only "
             f"its slices' pages) and LibTorch's code")
    if rss_load > rss_steps:
        text += (f"; so full_vs_none_memory is set by loading, the steps' peak RSS alone is "
                 f"{rss_steps / (max(cfg.none['rss_kb']) / 1024):.3f} of none's")
    return [text]


def side_by_side(args, engine, workdir, deps):
    """Stemma at --shard against FSDP2 on the same small model, 2 ranks each."""
    np = deps[2]
    total = args.warmup_steps + args.steps
    model_dir, data_dir, rows = make_data(engine, workdir, "side", model_args(args),
                                          total * args.batch, *deps)
    rows_path = os.path.join(workdir, "rows.npy")
    np.save(rows_path, rows)
    log(f"Stemma, 2 ranks, shard {args.shard} + activation checkpointing")
    shard, stemma = stemma_with_fallback(
        engine, workdir, "stemma",
        lambda level: stemma_spec(model_dir, data_dir, os.path.join(workdir, "out"),
                                  args.seq_len, args.batch, total, level), args.shard)
    stamps = stemma["stamps"]
    stemma_tps = args.steps * args.batch * args.seq_len / (stamps[total] -
                                                           stamps[args.warmup_steps])
    log("FSDP2, 2 ranks (torchrun, gloo) + activation checkpointing")
    fsdp = run_fsdp2(args, workdir, model_dir, rows_path)
    fsdp_rss = max(r["peak_rss_kb"] for r in fsdp)
    return shard, {
        "rss_ratio_vs_fsdp2": max(stemma["rss_kb"]) / fsdp_rss,
        "tokens_per_s_ratio_vs_fsdp2": stemma_tps / fsdp[0]["tokens_per_s"],
        "stemma_profile_per_rank": stemma["profiles"],
        "stemma_shard": shard,
        "stemma_peak_rss_kb_per_rank": stemma["rss_kb"],
        "fsdp2_peak_rss_kb_per_rank": [r["peak_rss_kb"] for r in fsdp],
        "stemma_tokens_per_s": stemma_tps,
        "fsdp2_tokens_per_s": fsdp[0]["tokens_per_s"],
        "stemma_losses": [stemma["losses"][s] for s in sorted(stemma["losses"])],
        "fsdp2_losses": fsdp[0]["losses"],
    }


def main():
    args = parse_args()
    engine = os.path.abspath(args.engine)
    os.environ["OMP_NUM_THREADS"] = "1"
    import numpy as np
    import torch
    import transformers
    deps = (torch, transformers, np)

    workdir = tempfile.mkdtemp(prefix="stemma_bench_sharded_")
    try:
        # Models whose weights and optimizer state dominate: wide, 16-token rows, one row per
        # rank. The figure at --big-ranks (4) ranks, and the 2-rank small one beside.
        small = MemoryConfig("small", model_args(args, hidden=1024, intermediate=2816,
                                                 seq_len=16), 2)
        big = MemoryConfig("big", model_args(args, hidden=1024, intermediate=2816, seq_len=16,
                                             layers=args.big_layers), args.big_ranks)
        tiny_args = model_args(args, hidden=8, intermediate=8, layers=1, heads=1, seq_len=16)
        tiny_model, tiny_data, _ = make_data(engine, workdir, "tiny", tiny_args,
                                             args.big_ranks * 3, *deps)
        for cfg in (small, big):
            cfg.make(engine, workdir, (tiny_model, tiny_data), deps)

        shard, side = side_by_side(args, engine, workdir, deps)
        # The plan, before the large runs (it sizes the memory they wait for).
        plan_note = "stemma and stemma-coordinator not built beside the engine"
        plan = plan_mib(os.path.dirname(engine), workdir,
                        [(small.runtime_spec(shard), 2), (small.spec(shard), 2),
                         (big.runtime_spec(shard), big.ranks), (big.spec(shard), big.ranks),
                         (big.spec("none"), big.ranks)])
        small.run(engine, shard, None)
        big.run(engine, shard, plan[4] if plan else None)

        plan_errors = {}
        if plan is not None:
            plan_errors = {"big": big.plan_error(plan[3], plan[2]),
                           "big_none": big.plan_error(plan[4], plan[2], none=True),
                           "small": small.plan_error(plan[1], plan[0])}
            plan_note = (f"the big model at {shard}, {big.ranks} ranks: plan {plan[3]} MiB "
                         f"(runtime {plan[2]}), measured peak RssAnon "
                         f"{max(big.sharded['anon_kb']) / 1024:.0f} MiB (runtime "
                         f"{max(big.runtime['anon_kb']) / 1024:.0f}); the small model at 2 "
                         f"ranks: plan {plan[1]} MiB (runtime {plan[0]}), measured "
                         f"{max(small.sharded['anon_kb']) / 1024:.0f} MiB (runtime "
                         f"{max(small.runtime['anon_kb']) / 1024:.0f}); both above the runtime")
        full_vs_none, anon_ratio, above = big.ratios()
        small_ratio, _, small_above = small.ratios()
        plan_error = plan_errors.get("big")
        rss_ratio, tps_ratio = side["rss_ratio_vs_fsdp2"], side["tokens_per_s_ratio_vs_fsdp2"]
        result = {
            "rss_ratio_vs_fsdp2": rss_ratio,
            "tokens_per_s_ratio_vs_fsdp2": tps_ratio,
            # Peak RSS (VmHWM) per rank, the larger rank, at --shard against none on
            # --big-ranks ranks for the big model; RssAnon beside it.
            "full_vs_none_memory": full_vs_none,
            "full_vs_none_memory_anon": anon_ratio,
            "full_vs_none_memory_above_runtime": above,
            # ZeRO-3 keeps 16/W bytes per trainable parameter (fp32 master slice, two Adam
            # moments, gradient slice) where shard none keeps 16 (weights, the flat gradient
            # the ranks all-reduce, two moments) and autograd's gradients: ~1/W before the
            # runtime, activations and the gathered layers.
            "full_vs_none_memory_floor": 1 / big.ranks,
            "full_vs_none_memory_2ranks_small": small_ratio,
            "full_vs_none_memory_2ranks_small_above_runtime": small_above,
            "plan_error": plan_error,
            "plan_error_2ranks_small": plan_errors.get("small"),
            "plan_error_none": plan_errors.get("big_none"),
            "targets_met": {
                "rss_ratio_vs_fsdp2 <= 1": rss_ratio <= 1.0,
                "tokens_per_s_ratio_vs_fsdp2 >= 1": tps_ratio >= 1.0,
                "full_vs_none_memory <= 0.5": full_vs_none <= 0.5,
                "plan_error <= 0.2": plan_error is not None and plan_error <= 0.2,
            },
            "notes": note_load(big, shard) + note_floor(small, shard) + note_floor(big, shard),
            "plan_error_note": plan_note,
            "plan_mib": dict(zip(["small_runtime", "small", "big_runtime", "big",
                                  "big_none"], plan)) if plan else None,
            "memory_big": big.figures(shard),
            "memory_2ranks_small": small.figures(shard),
            **side,
            "config": {"hidden": args.hidden, "layers": args.layers,
                       "intermediate": args.intermediate, "vocab": args.vocab,
                       "seq_len": args.seq_len, "global_batch": args.batch,
                       "measured_steps": args.steps, "threads_per_rank": 1},
            "load_avg_1m": os.getloadavg()[0],
        }
        print(json.dumps(result))
    finally:
        if args.keep_tmp:
            log(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
