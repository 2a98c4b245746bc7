#!/usr/bin/env python3
"""Interoperability of Stemma's safetensors with the Python ecosystem.

Run by engine/io/interop_test.cc as `python safetensors_interop.py DIR`:
  1. reads DIR/ours/ (written by Stemma's CheckpointWriter, possibly sharded) with
     safetensors.torch.load_file and checks every tensor against expected_tensors();
  2. writes DIR/theirs.safetensors with safetensors.torch.save_file (the same tensors);
  3. writes a tiny random LlamaForCausalLM with transformers.save_pretrained, sharded, to
     DIR/hf/, and DIR/hf_sums.json = {name: {"shape": [...], "dtype": ..., "sum": float}}.
Exits non-zero with a message naming the tensor on any mismatch.
"""
import glob
import json
import os
import sys

import torch
from safetensors.torch import load_file, save_file


def expected_tensors():
    """The tensor set both sides build; the C++ test mirrors this exactly."""
    specs = {
        "f64": (torch.float64, [3]),
        "f32": (torch.float32, [2, 3]),
        "f16": (torch.float16, [4, 2]),
        "bf16": (torch.bfloat16, [5]),
        "i64.scalar": (torch.int64, []),
        "i32.empty": (torch.int32, [0]),
        "i16": (torch.int16, [2, 2]),
        "i8": (torch.int8, [3]),
        "u8": (torch.uint8, [4]),
        "bool": (torch.bool, [3]),
    }
    out = {}
    for name, (dtype, shape) in specs.items():
        n = 1
        for d in shape:
            n *= d
        base = (torch.arange(n, dtype=torch.int64) * 3) % 11
        if dtype == torch.bool:
            v = base % 2 == 1
        elif dtype == torch.uint8:
            v = base.to(dtype)
        else:
            v = (base - 5).to(dtype)
        out[name] = v.reshape(shape)
    return out


def main():
    d = sys.argv[1]
    want = expected_tensors()
    got = {}
    for path in sorted(glob.glob(os.path.join(d, "ours", "*.safetensors"))):
        got.update(load_file(path))
    for name, w in want.items():
        if name not in got:
            sys.exit(f"ours: tensor {name} missing")
        g = got[name]
        if g.dtype != w.dtype or list(g.shape) != list(w.shape) or not torch.equal(g, w):
            sys.exit(f"ours: tensor {name} differs: {g.dtype} {list(g.shape)} {g} vs {w}")
    if set(got) != set(want):
        sys.exit(f"ours: unexpected tensors {sorted(set(got) - set(want))}")

    save_file(want, os.path.join(d, "theirs.safetensors"), metadata={"format": "pt"})

    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                         max_position_embeddings=64, tie_word_embeddings=False)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(os.path.join(d, "hf"), max_shard_size="4KB")
    sums = {name: {"shape": list(t.shape), "dtype": str(t.dtype),
                   "sum": float(t.double().sum())}
            for name, t in model.state_dict().items()}
    with open(os.path.join(d, "hf_sums.json"), "w") as f:
        json.dump(sums, f)
    print(f"interop ok: {len(got)} tensors read, {len(sums)} written by transformers")


if __name__ == "__main__":
    main()
