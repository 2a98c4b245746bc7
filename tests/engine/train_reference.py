"""Reference training run for engine/train/train_test.cc: transformers + torch.optim.AdamW.

Reads a JSON job on argv[1]: {"model": DIR, "doc": [ids], "eos": id, "seq_len": T,
"batch_size": B, "steps": N, "lr": ..., "betas": [b1, b2], "eps": ..., "clip": ...} and prints
the per-step mean cross-entropy as one JSON list. The rows are what stemma's loader yields
for a single-document dataset without shuffling: consecutive non-overlapping windows of
T + 1 tokens over the endless stream doc, EOS, doc, EOS, ...
"""
import json
import sys

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM


def main():
    job = json.load(open(sys.argv[1]))
    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(
        job["model"], dtype=torch.float32, attn_implementation="eager")
    model.train()
    stream = job["doc"] + [job["eos"]]
    width = job["seq_len"] + 1
    position = 0

    def next_row():
        nonlocal position
        row = [stream[(position + k) % len(stream)] for k in range(width)]
        position += width
        return row

    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=job["lr"], betas=tuple(job["betas"]), eps=job["eps"],
                            weight_decay=0.0)
    losses = []
    for _ in range(job["steps"]):
        rows = torch.tensor([next_row() for _ in range(job["batch_size"])], dtype=torch.long)
        inputs, targets = rows[:, :-1], rows[:, 1:]
        logits = model(input_ids=inputs).logits
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))
        opt.zero_grad()
        loss.backward()
        if job["clip"] > 0:
            torch.nn.utils.clip_grad_norm_(params, job["clip"])
        opt.step()
        losses.append(loss.item())
    print(json.dumps(losses))


if __name__ == "__main__":
    main()
