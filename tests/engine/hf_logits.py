#!/usr/bin/env python3
"""Golden logits from transformers for the engine's parity tests (engine/model/model_test.cc).

Loads a checkpoint directory with AutoModelForCausalLM (fp32, eager attention), refuses it
when transformers reports any missing, unexpected or mismatched tensor (so a checkpoint the
engine writes must load unchanged), runs one forward pass over the given token ids and
writes a safetensors file with:
  logits         [1, T, V] f32
  router_logits  [L, T, E] f32 (MoE models only, one row block per layer)
  aux_loss       []        f32 (MoE models only: transformers' load_balancing_loss_func)

With --create-from CONFIG_DIR, it first builds a model from CONFIG_DIR/config.json,
gives every tensor random values of a size that makes each part of the network matter
(weights ~ N(0, 1/fan_in), norm weights and biases away from their identity values; unlike
the small HF init, under which attention and norms barely move the logits), and saves it
with save_pretrained to --model: a checkpoint written by transformers, for the engine to load.

usage: hf_logits.py [--create-from CONFIG_DIR --seed S] --model DIR --tokens 1,2,3 --out FILE
"""
import argparse
import sys

import torch
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModelForCausalLM


def randomize(model, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    gemma = "gemma" in model.config.model_type
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if p.ndim >= 2:  # Linear [out, in], fused experts [E, out, in], embeddings
                std = 0.5 if "embed_tokens" in name else p.shape[-1] ** -0.5
                p.copy_(noise * std)
            elif "norm" in name:
                p.copy_(noise * 0.2 + (0.0 if gemma else 1.0))
            else:  # biases
                p.copy_(noise * 0.2)


def create(config_dir: str, out_dir: str, seed: int) -> None:
    config = AutoConfig.from_pretrained(config_dir)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    randomize(model, seed)
    model.save_pretrained(out_dir)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--tokens", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--create-from")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.create_from:
        create(args.create_from, args.model, args.seed)

    torch.manual_seed(0)
    model, info = AutoModelForCausalLM.from_pretrained(
        args.model, dtype=torch.float32, attn_implementation="eager", output_loading_info=True
    )
    problems = {k: v for k, v in info.items() if v and k != "error_msgs"}
    if problems or info.get("error_msgs"):
        print(f"hf_logits: {args.model} did not load cleanly: {info}", file=sys.stderr)
        return 1
    model.eval()

    ids = torch.tensor([[int(t) for t in args.tokens.split(",")]], dtype=torch.long)
    is_moe = hasattr(model.config, "num_experts") and model.config.num_experts
    with torch.no_grad():
        kwargs = {"output_router_logits": True} if is_moe else {}
        out = model(input_ids=ids, use_cache=False, **kwargs)
    tensors = {"logits": out.logits.float().contiguous()}
    if is_moe:
        tensors["router_logits"] = torch.stack([r.float() for r in out.router_logits]).contiguous()
        tensors["aux_loss"] = out.aux_loss.float().reshape(()).contiguous()
    save_file(tensors, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
