"""Generates the merge benchmark's inputs (tests/bench/merge): N bf16 checkpoints of about
1 GB each, shaped like Qwen2.5-0.5B (hidden 896, 24 layers, 14 heads / 2 KV heads, q/k/v
biases, tied 151936-row embedding: 494M parameters, 0.99 GB), two shards apiece, with
distinct random finite values.

usage: merge_make.py DIR [--models 5] [--layers 24]
Writes DIR/m0 .. DIR/m{N-1}; skips a model whose directory is complete.
"""
import argparse
import json
import os

import numpy as np

HIDDEN, INTER, VOCAB, HEADS, KV_HEADS = 896, 4864, 151936, 14, 2
KV = HIDDEN // HEADS * KV_HEADS  # 128


def shapes(layers):
    s = {"model.embed_tokens.weight": (VOCAB, HIDDEN), "model.norm.weight": (HIDDEN,)}
    for l in range(layers):
        p = f"model.layers.{l}."
        s[p + "self_attn.q_proj.weight"] = (HIDDEN, HIDDEN)
        s[p + "self_attn.q_proj.bias"] = (HIDDEN,)
        s[p + "self_attn.k_proj.weight"] = (KV, HIDDEN)
        s[p + "self_attn.k_proj.bias"] = (KV,)
        s[p + "self_attn.v_proj.weight"] = (KV, HIDDEN)
        s[p + "self_attn.v_proj.bias"] = (KV,)
        s[p + "self_attn.o_proj.weight"] = (HIDDEN, HIDDEN)
        s[p + "mlp.gate_proj.weight"] = (INTER, HIDDEN)
        s[p + "mlp.up_proj.weight"] = (INTER, HIDDEN)
        s[p + "mlp.down_proj.weight"] = (HIDDEN, INTER)
        s[p + "input_layernorm.weight"] = (HIDDEN,)
        s[p + "post_attention_layernorm.weight"] = (HIDDEN,)
    return s


def bf16_random(rng, shape):
    # Random sign and mantissa with a fixed exponent: finite bf16 values in ±[2^-7, 2^-6).
    bits = rng.integers(0, 1 << 16, size=shape, dtype=np.uint16)
    return (bits & np.uint16(0x807F)) | np.uint16(120 << 7)


def write_bf16_file(path, tensors):
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, array in tensors.items():
        header[name] = {"dtype": "BF16", "shape": list(array.shape),
                        "data_offsets": [offset, offset + array.nbytes]}
        offset += array.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for array in tensors.values():
            f.write(array.tobytes())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--models", type=int, default=5)
    ap.add_argument("--layers", type=int, default=24)
    args = ap.parse_args()
    config = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": HIDDEN,
              "intermediate_size": INTER, "num_hidden_layers": args.layers, "num_attention_heads": HEADS,
              "num_key_value_heads": KV_HEADS, "vocab_size": VOCAB, "rms_norm_eps": 1e-6,
              "rope_theta": 1000000.0, "tie_word_embeddings": True, "max_position_embeddings": 32768,
              "hidden_act": "silu", "torch_dtype": "bfloat16"}
    names = sorted(shapes(args.layers).items())
    half = len(names) // 2
    for m in range(args.models):
        out = os.path.join(args.dir, f"m{m}")
        if os.path.exists(os.path.join(out, "model.safetensors.index.json")):
            continue
        os.makedirs(out, exist_ok=True)
        rng = np.random.default_rng(1000 + m)
        weight_map, total = {}, 0
        for s, part in enumerate((names[:half], names[half:])):
            file = f"model-{s + 1:05d}-of-00002.safetensors"
            # numpy has no bf16: write the safetensors layout directly (uint16 bits as BF16).
            write_bf16_file(os.path.join(out, file), {n: bf16_random(rng, shape) for n, shape in part})
            for n, shape in part:
                weight_map[n] = file
                total += 2 * int(np.prod(shape))
        with open(os.path.join(out, "config.json"), "w") as f:
            json.dump(config, f, indent=2)
        with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)


if __name__ == "__main__":
    main()
