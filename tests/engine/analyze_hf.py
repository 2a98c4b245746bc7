"""transformers side of the analyze parity test and benchmark (engine/analyze/analyze_test.cc,
docs/eval.md): the same LAPE counting and MoE routing counting as `stemma-engine analyze`,
done with forward hooks on a transformers model, on the same windows of the same tokens.

  analyze_hf.py create --arch llama|olmoe --out DIR [--hidden H --layers L --inter I --seed S]
      a random checkpoint (weights ~ N(0, 1/fan_in), so neurons and routers vary per token)
      with the byte tokenizer (vocab 259), saved by save_pretrained
  analyze_hf.py lape --model DIR --seq-len T --batch B --out OUT.json LANG=FILE...
      over_zero counts per language -> the selection of analyze_golden.lape (default rates)
  analyze_hf.py routing --model DIR --seq-len T --batch B --out OUT.json LANG=FILE...
      top-k counts per language and MoE layer
  analyze_hf.py parity --out DIR --seq-len T --batch B LANG=FILE...
      all of it in one process (one transformers import): DIR/llama (seed 1) and DIR/olmoe
      (seed 2), then DIR/hf_lape.json and DIR/hf_routing.json

Text files are tokenized as the engine does for `text:` sources with the byte tokenizer:
each non-blank line alone (its UTF-8 bytes), concatenated.
"""
import argparse
import json
import os
import sys
import time

import torch
from transformers import AutoConfig, AutoModelForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import analyze_golden  # noqa: E402


def create(args):
    common = dict(vocab_size=259, hidden_size=args.hidden, intermediate_size=args.inter,
                  num_hidden_layers=args.layers, num_attention_heads=4, num_key_value_heads=4,
                  max_position_embeddings=4096, bos_token_id=256, eos_token_id=257,
                  pad_token_id=258, tie_word_embeddings=False)
    if args.arch == "llama":
        config = AutoConfig.for_model("llama", hidden_act="silu", rms_norm_eps=1e-5, **common)
    else:
        config = AutoConfig.for_model("olmoe", num_experts=args.experts, num_experts_per_tok=2,
                                      norm_topk_prob=False, rms_norm_eps=1e-5, **common)
    torch.manual_seed(args.seed)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim >= 2:
                p.copy_(torch.randn(p.shape) * p.shape[-1] ** -0.5)
    model.save_pretrained(args.out)
    with open(os.path.join(args.out, "config.json")) as f:
        cfg = json.load(f)
    cfg["stemma_tokenizer"] = {"type": "bytes"}
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)


def tokens_of(path):
    ids = []
    with open(path, "rb") as f:
        for raw in f:
            line = raw[:-1] if raw.endswith(b"\n") else raw
            if line.endswith(b"\r"):
                line = line[:-1]
            if not line.strip(b" \t\r\n"):
                continue
            ids.extend(line)
    return ids


def windows(ids, seq_len, batch):
    seq = min(seq_len, len(ids))
    n = len(ids) // seq
    rows = torch.tensor(ids[: n * seq], dtype=torch.long).view(n, seq)
    for start in range(0, n, batch):
        yield rows[start:start + batch]


def run_lape(model, args, sources):
    layers = model.model.layers
    counts, tokens = {}, {}
    seconds = 0.0
    for lang, path in sources:
        over_zero = torch.zeros(len(layers), model.config.intermediate_size, dtype=torch.long)
        hooks = []
        for i, layer in enumerate(layers):
            def hook(module, inp, out, i=i):
                over_zero[i] += (out > 0).reshape(-1, out.shape[-1]).sum(0)
            hooks.append(layer.mlp.act_fn.register_forward_hook(hook))
        ids = tokens_of(path)
        start = time.perf_counter()
        n = 0
        with torch.no_grad():
            for batch in windows(ids, args.seq_len, args.batch):
                model.model(input_ids=batch)
                n += batch.numel()
        seconds += time.perf_counter() - start
        for h in hooks:
            h.remove()
        counts[lang] = over_zero.tolist()
        tokens[lang] = n
    names = [lang for lang, _ in sources]
    result = analyze_golden.lape({"languages": names, "tokens": [tokens[l] for l in names],
                                  "over_zero": [counts[l] for l in names], "top_rate": 0.01,
                                  "filter_rate": 0.95, "activation_bar_ratio": 0.95})
    total = sum(tokens.values())
    result.update({"tokens": tokens, "seconds": seconds, "tokens_per_s": total / seconds})
    return result


def run_routing(model, args, sources):
    k = model.config.num_experts_per_tok
    e = model.config.num_experts
    counts, seconds = {}, 0.0
    for lang, path in sources:
        per_layer = torch.zeros(model.config.num_hidden_layers, e, dtype=torch.long)
        ids = tokens_of(path)
        start = time.perf_counter()
        with torch.no_grad():
            for batch in windows(ids, args.seq_len, args.batch):
                out = model(input_ids=batch, output_router_logits=True)
                for layer, logits in enumerate(out.router_logits):
                    chosen = logits.topk(k, dim=-1).indices.reshape(-1)
                    per_layer[layer] += torch.bincount(chosen, minlength=e)
        seconds += time.perf_counter() - start
        counts[lang] = per_layer.tolist()
    return {"counts": counts, "seconds": seconds}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["create", "lape", "routing", "parity"])
    parser.add_argument("--arch", default="llama")
    parser.add_argument("--out", required=True)
    parser.add_argument("--model")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--inter", type=int, default=128)
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("sources", nargs="*")
    args = parser.parse_intermixed_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.mode == "create":
        create(args)
        return
    sources = [tuple(s.split("=", 1)) for s in args.sources]
    if args.mode == "parity":
        root = args.out
        for arch, seed, mode, run in (("llama", 1, "lape", run_lape),
                                      ("olmoe", 2, "routing", run_routing)):
            args.arch, args.seed, args.out = arch, seed, os.path.join(root, arch)
            create(args)
            model = AutoModelForCausalLM.from_pretrained(args.out, dtype=torch.float32,
                                                         attn_implementation="sdpa").eval()
            with open(os.path.join(root, f"hf_{mode}.json"), "w") as f:
                json.dump(run(model, args, sources), f)
        return
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32,
                                                 attn_implementation="sdpa").eval()
    result = run_lape(model, args, sources) if args.mode == "lape" else run_routing(
        model, args, sources)
    with open(args.out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
