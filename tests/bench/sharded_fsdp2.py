"""One rank of the FSDP2 side of tests/bench/sharded (started by torchrun).

transformers' LlamaForCausalLM loaded from the same directory Stemma trains, each decoder
layer wrapped by fully_shard (FSDP2, per-parameter sharding) and then the root, gloo on the
CPU, activation checkpointing through transformers' gradient checkpointing (non-reentrant),
torch.optim.AdamW with the same settings as Stemma's spec. Each rank trains on its share of
the same global batches (rows [r·B/W, (r+1)·B/W) of every global batch, as Stemma's ranks).

Argument: a JSON file with model_dir, rows (a .npy file of [steps·B, T+1] token rows),
batch, warmup_steps, steps, threads, checkpointing, lr, betas, eps, weight_decay, clip, out.
Writes {"rank", "tokens_per_s", "peak_rss_kb", "losses"} to out.<rank>.json.
"""

import json
import resource
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import transformers
from torch.distributed.fsdp import fully_shard


def main():
    with open(sys.argv[1]) as f:
        cfg = json.load(f)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(cfg["threads"])
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM.from_pretrained(
        cfg["model_dir"], attn_implementation="sdpa", dtype=torch.float32)
    if cfg["checkpointing"]:
        model.gradient_checkpointing_enable(
            gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], betas=tuple(cfg["betas"]),
                                  eps=cfg["eps"], weight_decay=cfg["weight_decay"])
    rows = torch.from_numpy(np.load(cfg["rows"]))
    batch, share = cfg["batch"], cfg["batch"] // world
    losses, times = [], []
    for step in range(cfg["warmup_steps"] + cfg["steps"]):
        start = time.perf_counter()
        global_rows = rows[step * batch:(step + 1) * batch]
        mine = global_rows[rank * share:(rank + 1) * share]  # [share, T + 1]
        logits = model(input_ids=mine[:, :-1]).logits  # [share, T, V]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 mine[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["clip"])
        optimizer.step()
        global_loss = loss.detach().clone()
        dist.all_reduce(global_loss)
        losses.append(global_loss.item() / world)
        if step >= cfg["warmup_steps"]:
            times.append(time.perf_counter() - start)
    tokens = cfg["steps"] * batch * (rows.shape[1] - 1)
    result = {"rank": rank, "tokens_per_s": tokens / sum(times),
              "peak_rss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
              "losses": losses}
    with open(f"{cfg['out']}.{rank}.json", "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
