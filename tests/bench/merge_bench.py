"""Driver of tests/bench/merge: times raw I/O, Stemma's soup and mergekit's linear merge of
the same checkpoints, each with its inputs in the page cache, and prints one JSON line.

usage: merge_bench.py --engine BIN --python PY --mergekit DIR --inputs DIR [--rounds 3]
"""
import argparse
import glob
import json
import os
import shutil
import subprocess
import time


def warm(files):
    # Read every input so all contenders find it in the page cache alike.
    for f in files:
        with open(f, "rb") as h:
            while h.read(64 << 20):
                pass


def run(cmd, env=None):
    """Runs cmd; returns (seconds, peak RSS MiB of that process)."""
    start = time.monotonic()
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(p.pid, 0)
    seconds = time.monotonic() - start
    err = p.stderr.read().decode(errors="replace")
    if status != 0:
        raise SystemExit(f"{cmd[0]} failed ({status}): {err[-2000:]}")
    return seconds, usage.ru_maxrss / 1024.0


def largest_tensor_mib(model_dir):
    largest = 0
    for f in glob.glob(os.path.join(model_dir, "*.safetensors")):
        with open(f, "rb") as h:
            n = int.from_bytes(h.read(8), "little")
            header = json.loads(h.read(n))
        for name, t in header.items():
            if name != "__metadata__":
                largest = max(largest, t["data_offsets"][1] - t["data_offsets"][0])
    return largest / (1 << 20)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", required=True)
    ap.add_argument("--python", required=True)
    ap.add_argument("--mergekit", required=True)
    ap.add_argument("--inputs", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    models = sorted(glob.glob(os.path.join(args.inputs, "m[0-9]*")))
    files = sorted(f for m in models for f in glob.glob(os.path.join(m, "*.safetensors")))
    input_bytes = sum(os.path.getsize(f) for f in files)
    output_bytes = input_bytes // len(models)
    work = os.path.join(args.inputs, "out")
    os.makedirs(work, exist_ok=True)

    def fresh(path):
        shutil.rmtree(path, ignore_errors=True)
        if os.path.exists(path + ".bin"):
            os.remove(path + ".bin")
        os.sync()  # no dirty pages of an earlier round left to flush
        warm(files)

    raw, stemma, rss = [], [], []
    spec = os.path.join(work, "soup.json")
    with open(spec, "w") as f:
        json.dump({"models": [{"path": m} for m in models], "out": os.path.join(work, "stemma")}, f)
    for _ in range(args.rounds):
        # Physical limit: read every input byte and write (and fsync) an output of one model's size.
        fresh(os.path.join(work, "raw"))
        block = 16 << 20
        cmd = ["bash", "-c", f"cat {' '.join(files)} > /dev/null && "
               f"dd if=/dev/zero of={work}/raw.bin bs={block} count={output_bytes // block} conv=fsync status=none"]
        raw.append(run(cmd)[0])
        fresh(os.path.join(work, "stemma"))
        seconds, peak = run([args.engine, "merge", "--spec", spec])
        stemma.append(seconds)
        rss.append(peak)
    # mergekit linear (normalised weights 1, like the soup), once: it takes much longer.
    fresh(os.path.join(work, "mergekit"))
    mk_config = os.path.join(work, "mergekit.yml")
    with open(mk_config, "w") as f:
        json.dump({"merge_method": "linear", "dtype": "bfloat16",
                   "models": [{"model": m, "parameters": {"weight": 1.0}} for m in models]}, f)
    env = dict(os.environ, PYTHONPATH=args.mergekit)
    mergekit_s, mergekit_rss = run([args.python, "-c",
                                    "import sys; from mergekit.scripts.run_yaml import main; "
                                    "sys.argv[0] = 'mergekit-yaml'; main()",
                                    mk_config, os.path.join(work, "mergekit"), "--no-copy-tokenizer"], env=env)
    largest = largest_tensor_mib(models[0])
    # What the stemma-engine process holds before any merge work: loading LibTorch (the CUDA
    # wheel) and its static initialisers. Reported so the merge's own share is visible.
    _, baseline_rss = run([args.engine, "help"])
    best_raw, best_stemma = min(raw), min(stemma)
    shutil.rmtree(work, ignore_errors=True)
    print(json.dumps({
        "benchmark": "merge",
        "models": len(models),
        "input_gib": round(input_bytes / (1 << 30), 3),
        "raw_io_s": round(best_raw, 3),
        "stemma_soup_s": round(best_stemma, 3),
        "mergekit_s": round(mergekit_s, 3),
        "ratio_vs_raw_io": round(best_raw / best_stemma, 3),
        "ratio_vs_mergekit": round(mergekit_s / best_stemma, 2),
        "stemma_peak_rss_mib": round(max(rss), 1),
        "largest_tensor_mib": round(largest, 1),
        "rss_target_mib": round(2 * largest + 256, 1),
        "engine_baseline_rss_mib": round(baseline_rss, 1),
        "mergekit_peak_rss_mib": round(mergekit_rss, 1),
        "rounds": args.rounds,
    }))


if __name__ == "__main__":
    main()
