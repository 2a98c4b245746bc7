#!/usr/bin/env python3
"""transformers side of the eval benchmark (tests/bench/eval).

create: a random Llama with the byte vocabulary (259 ids: bytes, BOS 256, EOS 257, PAD 258),
        saved with save_pretrained, plus stemma_tokenizer.json so that Stemma's tokenizer
        loader picks the byte tokenizer.
ppl:    held-out perplexity of a Stemma token dataset with transformers, on exactly the
        windows `stemma-engine eval` uses (docs/eval.md, "perplexity"): held-out documents
        (FNV-1a 64 of the uint32 tokens, SplitMix64 finalizer, < fraction) in index order,
        each followed by EOS, windows of [BOS] + seq_len - 1 tokens; batches of equal-length
        windows; loss from model(input_ids, labels=input_ids) in eager PyTorch. Prints one
        JSON object: nll, tokens, ppl, seconds (the forward loop only), tokens_per_s.

usage: eval_hf.py create --out DIR [--hidden 256 --layers 4 --heads 4 --seq 2048 --seed 0]
       eval_hf.py ppl --model DIR --data DATASET --fraction F --split-seed S --seq-len L
                      --batch-size B --threads N [--attn eager|sdpa]
"""
import argparse
import json
import math
import os
import time

import numpy as np
import torch

MASK = (1 << 64) - 1


def mix64(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def fnv1a64(tokens):
    h = 0xCBF29CE484222325
    for b in tokens.astype("<u4").tobytes():
        h = ((h ^ b) * 0x100000001B3) & MASK
    return h


def held_out(tokens, fraction, seed):
    return (mix64(fnv1a64(tokens) ^ seed) >> 11) * 2.0**-53 < fraction


def read_dataset(path):
    with open(os.path.join(path, "index.json")) as f:
        index = json.load(f)
    shards = [np.fromfile(os.path.join(path, s["file"]), dtype="<u4") for s in index["shards"]]
    tokens = np.concatenate(shards) if shards else np.zeros(0, dtype="<u4")
    offsets = np.fromfile(os.path.join(path, index["documents"]["file"]), dtype="<u8")
    return index, tokens, offsets


def create(args):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=259, hidden_size=args.hidden,
                         intermediate_size=args.hidden * 8 // 3 // 16 * 16,
                         num_hidden_layers=args.layers, num_attention_heads=args.heads,
                         num_key_value_heads=args.heads, max_position_embeddings=args.seq,
                         rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
                         bos_token_id=256, eos_token_id=257, pad_token_id=258)
    torch.manual_seed(args.seed)
    model = LlamaForCausalLM(config).to(torch.float32)
    model.save_pretrained(args.out)
    with open(os.path.join(args.out, "stemma_tokenizer.json"), "w") as f:
        json.dump({"type": "bytes"}, f)


def ppl(args):
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(args.threads)
    index, tokens, offsets = read_dataset(args.data)
    tok = index["tokenizer"]
    bos, eos = tok.get("bos_id"), tok.get("eos_id")
    stream = []
    for d in range(len(offsets) - 1):
        doc = tokens[offsets[d]:offsets[d + 1]]
        if held_out(doc, args.fraction, args.split_seed):
            stream.extend(int(t) for t in doc)
            if not index["eos_appended"] and eos is not None:
                stream.append(eos)
    context = bos if bos is not None else eos
    step = args.seq_len - 1
    windows = [[context] + stream[b:b + step] for b in range(0, len(stream), step)]
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32,
                                                 attn_implementation=args.attn)
    model.eval()
    nll, count = 0.0, 0
    start = time.perf_counter()
    with torch.inference_mode():
        i = 0
        while i < len(windows):
            batch = [windows[i]]
            i += 1
            while i < len(windows) and len(batch) < args.batch_size and \
                    len(windows[i]) == len(batch[0]):
                batch.append(windows[i])
                i += 1
            ids = torch.tensor(batch, dtype=torch.long)
            out = model(input_ids=ids, labels=ids)
            predicted = ids.shape[0] * (ids.shape[1] - 1)
            nll += out.loss.double().item() * predicted  # the loss is the mean over predictions
            count += predicted
    seconds = time.perf_counter() - start
    print(json.dumps({"nll": nll, "tokens": count, "ppl": math.exp(nll / count),
                      "seconds": seconds, "tokens_per_s": count / seconds, "attn": args.attn}))


def main():
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("create")
    c.add_argument("--out", required=True)
    c.add_argument("--hidden", type=int, default=256)
    c.add_argument("--layers", type=int, default=4)
    c.add_argument("--heads", type=int, default=4)
    c.add_argument("--seq", type=int, default=2048)
    c.add_argument("--seed", type=int, default=0)
    p = sub.add_parser("ppl")
    p.add_argument("--model", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--fraction", type=float, required=True)
    p.add_argument("--split-seed", type=int, default=0)
    p.add_argument("--seq-len", type=int, required=True)
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--attn", default="eager")
    args = parser.parse_args()
    create(args) if args.command == "create" else ppl(args)


if __name__ == "__main__":
    main()
