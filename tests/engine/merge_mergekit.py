"""Agreement of stemma-engine merge with mergekit (tests only; engine/merge/merge_test.cc).

usage: merge_mergekit.py CASES.json

CASES.json: [{"name": ..., "mergekit": {<a mergekit YAML config as JSON>},
              "stemma_out": DIR, "mergekit_out": DIR}, ...]
Runs each mergekit config through mergekit's Python API (pinned 0.1.5, on PYTHONPATH), then
compares every tensor with Stemma's output: same names, shapes and dtypes, values within one
bf16 unit in the last place. Prints one line per case; exits 1 on any disagreement.
"""
import json
import sys

import torch
from safetensors.torch import load_file


def load_dir(path):
    import glob
    import os
    tensors = {}
    for f in sorted(glob.glob(os.path.join(path, "*.safetensors"))):
        tensors.update(load_file(f))
    return tensors


def bf16_ulp(x):
    # Spacing of bf16 numbers around |x| (8 significant bits); tiny values use the subnormal floor.
    mag = x.abs().clamp_min(1e-30)
    return torch.exp2(torch.floor(torch.log2(mag)) - 7)


def main():
    from mergekit.config import MergeConfiguration
    from mergekit.merge import MergeOptions, run_merge

    cases = json.load(open(sys.argv[1]))
    failed = False
    for case in cases:
        config = MergeConfiguration.model_validate(case["mergekit"])
        run_merge(config, case["mergekit_out"], options=MergeOptions(copy_tokenizer=False))
        ours = load_dir(case["stemma_out"])
        theirs = load_dir(case["mergekit_out"])
        if set(ours) != set(theirs):
            print(f"{case['name']}: tensor names differ: only stemma {sorted(set(ours) - set(theirs))[:5]}, "
                  f"only mergekit {sorted(set(theirs) - set(ours))[:5]}")
            failed = True
            continue
        worst, worst_name, bad = 0.0, "", 0
        for name in sorted(ours):
            a, b = ours[name], theirs[name]
            if a.shape != b.shape or a.dtype != b.dtype:
                print(f"{case['name']}: {name}: {a.dtype}{list(a.shape)} vs mergekit {b.dtype}{list(b.shape)}")
                failed = True
                continue
            a, b = a.float(), b.float()
            diff = (a - b).abs()
            ulps = diff / bf16_ulp(torch.maximum(a.abs(), b.abs()))
            bad += int((ulps > 1.0).sum())
            if float(ulps.max()) > worst:
                worst, worst_name = float(ulps.max()), name
        status = "ok" if bad == 0 else "MISMATCH"
        print(f"{case['name']}: {status}: {len(ours)} tensors, max difference {worst:.3f} bf16 ulp"
              f" ({worst_name}), {bad} elements over 1 ulp")
        failed |= bad > 0
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
