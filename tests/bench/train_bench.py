"""Training throughput: `stemma-engine train` against transformers + torch.optim.AdamW.

Run through tests/bench/train (which picks the venv Python). One run, same machine, same
model, data, batch, sequence length, optimizer settings and thread count on both sides:

  model        a Llama (LlamaForCausalLM) made here with transformers from a fixed seed and
               saved as safetensors in HF layout, with Stemma's byte tokenizer
               (stemma_tokenizer.json); both sides load that same directory.
  data         synthetic text tokenized by `stemma-engine tokenize --eos`. The engine's loader
               (shuffle off, one dataset, no held-out split) cuts the token stream into
               consecutive rows of seq_len+1 tokens; the Python side reads the same shard and
               cuts the same rows, so both see identical batches and the first-step losses
               must agree (same init, same data, fp32).
  optimizer    AdamW, constant lr (no warmup), betas, eps, weight decay and grad-norm clipping
               identical on both sides.
  timing       tokens/s over the steps after the warm-up ones. Stemma: this script stamps
               each `step` event as it arrives on stdout (start-up and checkpoint saving are
               outside the window). Transformers: wall time of the same steps in-process.
               Rounds alternate (Stemma, transformers, ...) and the best round of each side
               counts, since the machine is shared and load drifts.
  matmul peak  torch.mm in this process with the same threads at the shapes of the model's
               linear layers ([tokens, in] x [in, out]), best of several repetitions per
               shape; the peak is the best shape's GFLOP/s.
  FLOPs/token  6 * N + 12 * L * H * T, where N = the matmul parameters (attention q/k/v/o,
               MLP gate/up/down of every layer, plus lm_head; embeddings and norms excluded),
               L = layers, H = hidden size, T = sequence length (the attention score and
               value products, forward + backward). MFU = tokens/s * FLOPs/token / peak.

Load: on a machine shared with other work, OpenMP's default spin-waiting dominates both
sides (idle threads spin while their sibling is descheduled; perf showed ~64% of the
trainer's samples in libgomp's spin loop at load 7 on 2 cores). --omp-wait-policy PASSIVE
sets OMP_WAIT_POLICY for both sides; the JSON records it and the 1-minute load average.

The last stdout line is one JSON object: stemma_tokens_per_s, transformers_tokens_per_s,
ratio (target >= 1.1), matmul_peak_gflops, mfu_vs_matmul_peak (Stemma's; target >= 0.6),
transformers_mfu_vs_matmul_peak, loss_first_step_stemma, loss_first_step_transformers, and
the configuration. Progress goes to stderr.
"""

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time


def log(message):
    print(f"[bench train] {message}", file=sys.stderr, flush=True)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    env = os.environ.get
    p.add_argument("--engine", default=env("STEMMA_ENGINE", "build/bin/stemma-engine"))
    p.add_argument("--threads", type=int, default=int(env("STEMMA_BENCH_THREADS", "2")))
    p.add_argument("--hidden", type=int, default=int(env("STEMMA_BENCH_HIDDEN", "512")))
    p.add_argument("--layers", type=int, default=int(env("STEMMA_BENCH_LAYERS", "4")))
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--intermediate", type=int,
                   default=int(env("STEMMA_BENCH_INTERMEDIATE", "1408")))
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--seq-len", type=int, default=int(env("STEMMA_BENCH_SEQ_LEN", "128")))
    p.add_argument("--batch", type=int, default=int(env("STEMMA_BENCH_BATCH", "4")))
    p.add_argument("--warmup-steps", type=int, default=2)
    p.add_argument("--steps", type=int, default=int(env("STEMMA_BENCH_STEPS", "6")),
                   help="measured steps per round, after the warm-up ones")
    p.add_argument("--rounds", type=int, default=int(env("STEMMA_BENCH_ROUNDS", "2")))
    p.add_argument("--omp-wait-policy", choices=["", "ACTIVE", "PASSIVE"],
                   default=env("STEMMA_BENCH_OMP_WAIT_POLICY", ""),
                   help="OMP_WAIT_POLICY for both sides (default: libgomp's own, spinning); "
                        "PASSIVE stops idle OpenMP threads spinning, which matters on a "
                        "machine shared with other work")
    p.add_argument("--keep-tmp", action="store_true")
    return p.parse_args()


def make_model(args, model_dir, torch, transformers):
    """A randomly initialised Llama in HF layout, plus the byte tokenizer."""
    config = transformers.LlamaConfig(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
        num_hidden_layers=args.layers, num_attention_heads=args.heads,
        num_key_value_heads=args.heads, max_position_embeddings=max(2048, args.seq_len),
        rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=256, eos_token_id=257,
        pad_token_id=258)
    torch.manual_seed(1234)
    model = transformers.LlamaForCausalLM(config).to(torch.float32)
    model.save_pretrained(model_dir, safe_serialization=True)
    with open(os.path.join(model_dir, "stemma_tokenizer.json"), "w") as f:
        json.dump({"type": "bytes"}, f)
    return config


def make_text(path, num_chars):
    """Deterministic pseudo-words in paragraphs (the byte tokenizer: one token per byte)."""
    rng = random.Random(7)
    letters = "abcdefghijklmnopqrstuvwxyz"
    paragraphs, total = [], 0
    while total < num_chars:
        words = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 9)))
                 for _ in range(rng.randint(20, 120))]
        text = " ".join(words) + "."
        paragraphs.append(text)
        total += len(text) + 1
    with open(path, "w") as f:
        f.write("\n\n".join(paragraphs) + "\n")


def run(cmd, **kwargs):
    result = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    if result.returncode != 0:
        sys.exit(f"bench train: {' '.join(cmd)} failed ({result.returncode}):\n"
                 f"{result.stderr[-4000:]}")
    return result


def flops_per_token(config, seq_len):
    h, i, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    kv = config.num_key_value_heads * (h // config.num_attention_heads)
    per_layer = h * h + 2 * h * kv + h * h + 3 * h * i  # q, k, v, o, gate/up/down
    matmul_params = layers * per_layer + h * config.vocab_size  # + lm_head
    return 6 * matmul_params + 12 * layers * h * seq_len, matmul_params


def matmul_peak_gflops(torch, config, tokens):
    """Best GFLOP/s of torch.mm over the model's linear-layer shapes."""
    h, i, v = config.hidden_size, config.intermediate_size, config.vocab_size
    best = 0.0
    for k, n in [(h, h), (h, i), (i, h), (h, v)]:
        a, b = torch.randn(tokens, k), torch.randn(k, n)
        torch.mm(a, b)
        fastest = min(timed(lambda: torch.mm(a, b)) for _ in range(12))
        best = max(best, 2.0 * tokens * k * n / fastest / 1e9)
    return best


def timed(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def stemma_round(args, engine, workdir, model_dir, data_dir, round_index):
    total_steps = args.warmup_steps + args.steps
    spec = {
        "model": model_dir,
        "out": os.path.join(workdir, f"stemma-out-{round_index}"),
        "overwrite": True,
        "data": {"datasets": [{"path": data_dir, "weight": 1.0}], "seq_len": args.seq_len,
                 "shuffle": False},
        "batch_size": args.batch,
        "steps": total_steps,
        "threads": args.threads,
        "seed": 0,
        "optimizer": {"lr": OPTIMIZER["lr"], "betas": [OPTIMIZER["beta1"], OPTIMIZER["beta2"]],
                      "eps": OPTIMIZER["eps"], "weight_decay": OPTIMIZER["weight_decay"]},
        "schedule": {"type": "constant", "warmup_steps": 0},
        "clip_grad_norm": CLIP,
        "log_every": 1,
    }
    spec_path = os.path.join(workdir, f"spec-{round_index}.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    proc = subprocess.Popen([engine, "train", "--spec", spec_path], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    stamps, losses = {}, {}
    for line in proc.stdout:
        now = time.perf_counter()
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            sys.exit(f"bench train: stemma-engine printed a non-JSON line: {line!r}")
        if event.get("event") == "step":
            stamps[event["step"]] = now
            losses[event["step"]] = event["loss"]
    stderr = proc.stderr.read()
    if proc.wait() != 0:
        sys.exit(f"bench train: stemma-engine train failed ({proc.returncode}):\n"
                 f"{stderr[-4000:]}")
    first, last = args.warmup_steps, total_steps
    if first not in stamps or last not in stamps:
        sys.exit(f"bench train: missing step events {first} / {last} (got {sorted(stamps)})")
    seconds = stamps[last] - stamps[first]
    tokens_per_s = args.steps * args.batch * args.seq_len / seconds
    return tokens_per_s, losses[1], [losses[s] for s in sorted(losses)]


def transformers_round(args, torch, transformers, model_dir, rows):
    model = transformers.LlamaForCausalLM.from_pretrained(
        model_dir, attn_implementation="sdpa", dtype=torch.float32)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=OPTIMIZER["lr"],
                                  betas=(OPTIMIZER["beta1"], OPTIMIZER["beta2"]),
                                  eps=OPTIMIZER["eps"], weight_decay=OPTIMIZER["weight_decay"])
    losses, start = [], None
    for step in range(args.warmup_steps + args.steps):
        if step == args.warmup_steps:
            start = time.perf_counter()
        batch = rows[step * args.batch:(step + 1) * args.batch]  # [batch, seq_len + 1]
        inputs, targets = batch[:, :-1], batch[:, 1:]
        logits = model(input_ids=inputs).logits  # [batch, seq_len, vocab]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 targets.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        optimizer.step()
        losses.append(loss.item())
    seconds = time.perf_counter() - start
    return args.steps * args.batch * args.seq_len / seconds, losses[0], losses


OPTIMIZER = {"lr": 3e-4, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1}
CLIP = 1.0


def main():
    args = parse_args()
    engine = os.path.abspath(args.engine)
    if not os.access(engine, os.X_OK):
        sys.exit(f"bench train: no stemma-engine at {engine} (build the engine and set "
                 "STEMMA_ENGINE=BUILD_DIR/bin/stemma-engine)")
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    if args.omp_wait_policy:  # before torch loads libgomp, and inherited by stemma-engine
        os.environ["OMP_WAIT_POLICY"] = args.omp_wait_policy
    import numpy as np
    import torch
    import transformers
    torch.set_num_threads(args.threads)

    workdir = tempfile.mkdtemp(prefix="stemma_bench_train_")
    try:
        model_dir = os.path.join(workdir, "model")
        config = make_model(args, model_dir, torch, transformers)
        total_steps = args.warmup_steps + args.steps
        rows_needed = total_steps * args.batch
        text = os.path.join(workdir, "corpus.txt")
        make_text(text, int(rows_needed * (args.seq_len + 1) * 1.1) + 10_000)
        data_dir = os.path.join(workdir, "tokens")
        run([engine, "tokenize", "--tokenizer", model_dir, "--input", text, "--format",
             "text", "--language", "xx", "--out", data_dir, "--eos"])
        with open(os.path.join(data_dir, "index.json")) as f:
            index = json.load(f)
        stream = np.concatenate([np.fromfile(os.path.join(data_dir, s["file"]), dtype="<u4")
                                 for s in index["shards"]])
        width = args.seq_len + 1
        rows = torch.from_numpy(
            stream[:rows_needed * width].astype(np.int64).reshape(rows_needed, width))

        per_token, matmul_params = flops_per_token(config, args.seq_len)
        peak = matmul_peak_gflops(torch, config, args.batch * args.seq_len)
        log(f"matmul peak {peak:.1f} GFLOP/s; {per_token / 1e6:.1f} MFLOP/token; "
            f"{matmul_params / 1e6:.2f} M matmul parameters")

        stemma, hf = [], []
        for r in range(args.rounds):
            stemma.append(stemma_round(args, engine, workdir, model_dir, data_dir, r))
            log(f"round {r}: stemma {stemma[-1][0]:.0f} tokens/s, losses "
                f"{[round(x, 4) for x in stemma[-1][2]]}")
            hf.append(transformers_round(args, torch, transformers, model_dir, rows))
            log(f"round {r}: transformers {hf[-1][0]:.0f} tokens/s, losses "
                f"{[round(x, 4) for x in hf[-1][2]]}")
        stemma_tps = max(s[0] for s in stemma)
        hf_tps = max(h[0] for h in hf)
        # Re-measure the peak after the runs as well: load on a shared machine drifts.
        peak = max(peak, matmul_peak_gflops(torch, config, args.batch * args.seq_len))
        result = {
            "stemma_tokens_per_s": round(stemma_tps, 1),
            "transformers_tokens_per_s": round(hf_tps, 1),
            "ratio": round(stemma_tps / hf_tps, 3),
            "matmul_peak_gflops": round(peak, 2),
            "mfu_vs_matmul_peak": round(stemma_tps * per_token / 1e9 / peak, 3),
            "transformers_mfu_vs_matmul_peak": round(hf_tps * per_token / 1e9 / peak, 3),
            "loss_first_step_stemma": stemma[0][1],
            "loss_first_step_transformers": hf[0][1],
            "flops_per_token": per_token,
            "model": {"hidden": args.hidden, "layers": args.layers, "heads": args.heads,
                      "intermediate": args.intermediate, "vocab": args.vocab,
                      "matmul_params": matmul_params},
            "batch": args.batch, "seq_len": args.seq_len, "threads": args.threads,
            "warmup_steps": args.warmup_steps, "measured_steps": args.steps,
            "rounds": args.rounds,
            "omp_wait_policy": args.omp_wait_policy or None,
            "load_average_1min": round(os.getloadavg()[0], 2),
        }
        print(json.dumps(result), flush=True)
    finally:
        if args.keep_tmp:
            log(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
