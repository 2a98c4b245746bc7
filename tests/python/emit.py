"""An exec job of the Python client's tests: prints what a trainer prints (engine `step` events
with loss and tokens_per_s, an eval `metric` event with labels) and, with --out, writes a
file and reports it as an output with its parents, as engine jobs do (docs/engine-events.md).

    emit.py --steps N --lr X [--out PATH --operation OP [--parent PATH]...]"""

import argparse
import hashlib
import json
import os

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=10)
parser.add_argument("--lr", type=float, default=1.0)
parser.add_argument("--out")
parser.add_argument("--operation", default="cpt")
parser.add_argument("--parent", action="append", default=[])
args = parser.parse_args()

for s in range(1, args.steps + 1):
    print(json.dumps({"event": "step", "step": s, "total_steps": args.steps,
                      "loss": round(3.0 / (s * args.lr), 6), "tokens_per_s": 1000.0 + s}),
          flush=True)
print(json.dumps({"event": "metric", "name": "acc/en", "value": 0.25 * args.lr,
                  "step": args.steps, "labels": {"language": "en", "type": "choice"}}),
      flush=True)
print("hello from the job", flush=True)
if args.out:
    data = f"weights lr={args.lr} parents={args.parent}\n".encode()
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "wb") as f:
        f.write(data)
    print(json.dumps({"event": "output", "name": "model", "path": args.out, "type": "file",
                      "manifest_sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data),
                      "parents": args.parent, "operation": args.operation}), flush=True)
