"""Benchmark of `stemma-engine analyze` LAPE profiling against the same counting in
transformers (forward hooks on act_fn, tests/engine/analyze_hf.py), on one random Llama
written by transformers and the same windows of the same tokens. Checks that both select
the same neurons, and prints one JSON line with both throughputs (forward passes only: the
engine's done event `tokens_per_s`, transformers' timed loop).

usage: analyze_bench.py ENGINE_BIN [--tokens N] [--hidden H] [--layers L] [--inter I]
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile

import torch
from transformers import AutoModelForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import analyze_hf  # noqa: E402


def letters(path, first, last, chars, seed):
    rng = random.Random(seed)
    with open(path, "w") as f:
        written = 0
        while written < chars:
            word = "".join(chr(rng.randint(ord(first), ord(last)))
                           for _ in range(rng.randint(3, 12)))
            f.write(word + "\n")
            written += len(word)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("engine")
    parser.add_argument("--tokens", type=int, default=65536)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--inter", type=int, default=688)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--batch", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as tmp:
        args.arch, args.seed, args.experts, args.out = "llama", 0, 8, os.path.join(tmp, "model")
        analyze_hf.create(args)
        sources = []
        for lang, (a, b), seed in (("aa", ("a", "p"), 1), ("bb", ("h", "z"), 2)):
            path = os.path.join(tmp, lang + ".txt")
            letters(path, a, b, args.tokens, seed)
            sources.append((lang, path))
        spec = {"model": args.out, "out": os.path.join(tmp, "out"), "seq_len": args.seq_len,
                "batch_size": args.batch, "max_tokens": 0,
                "languages": [{"language": lang, "text": path} for lang, path in sources],
                "lape": {"random_mask": False, "keep_profile": False}}
        with open(os.path.join(tmp, "spec.json"), "w") as f:
            json.dump(spec, f)
        run = subprocess.run([args.engine, "analyze", "--spec", os.path.join(tmp, "spec.json")],
                             capture_output=True, text=True, check=True)
        done = json.loads(run.stdout.strip().splitlines()[-1])
        with open(os.path.join(tmp, "out", "neuron_mask.json")) as f:
            mask = json.load(f)
        model = AutoModelForCausalLM.from_pretrained(args.out, dtype=torch.float32,
                                                     attn_implementation="sdpa").eval()
        hf = analyze_hf.run_lape(model, args, sources)
        print(json.dumps({
            "bench": "analyze_lape_cpu",
            "model": f"llama hidden {args.hidden}, {args.layers} layers, intermediate {args.inter}",
            "tokens": done["tokens_profiled"], "seq_len": args.seq_len, "batch": args.batch,
            "threads": 2,
            "stemma_tokens_per_s": round(done["tokens_per_s"], 1),
            "transformers_tokens_per_s": round(hf["tokens_per_s"], 1),
            "same_selection": mask["languages"] == hf["languages"],
            "selected": sum(len(x) for lists in mask["languages"].values() for x in lists),
        }))


if __name__ == "__main__":
    main()
