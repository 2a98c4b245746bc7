#!/usr/bin/env python3
"""Jobs that no worker can hold are refused at submit, naming the estimate and the fields.

A real coordinator and a real worker with 8 fake GPUs (80 GiB each, as `--gpus` declares
them); a Llama-2-7B-shaped checkpoint directory (its published config.json only: the plan reads
the shape, nothing loads weights). Checked as a user would:
- `stemma submit` of full fine-tuning with nothing sharded (~146 GiB per GPU at one 4,096-token
  row per GPU) is refused: the error names `needs ~N GiB per GPU`, the worker's 80 GiB, and
  `parallel.shard` (what would make it fit) with that estimate; nothing is queued.
- the same job with `parallel: {shard: full}` and `activation_checkpointing: 1` is accepted.
- `stemma sweep` of an experiment with that job is refused the same way; `stemma plan` of it
  prints the stage's estimate and `does not fit`; `stemma plan --gpu-memory 141GiB` shows it
  fitting; a bad `--gpu-memory` names the flag.
- a CPU job larger than the worker's memory (`--memory-mb`) is refused naming the memory.

Usage: check_memory_refusals.py BIN_DIR [--worker PATH]
"""
import json
import os
import pathlib
import re
import socket
import subprocess
import sys
import tempfile
import time

LLAMA2_7B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
             "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32,
             "num_key_value_heads": 32, "vocab_size": 32000, "max_position_embeddings": 4096,
             "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    binary = pathlib.Path(sys.argv[1]).resolve()
    worker = binary / "stemma-worker"
    if "--worker" in sys.argv:
        worker = pathlib.Path(sys.argv[sys.argv.index("--worker") + 1]).resolve()
    failures = []

    def expect(cond, what, out=""):
        if not cond:
            failures.append(f"{what}\n    got: {out.strip()[:1500]}")

    with tempfile.TemporaryDirectory(prefix="stemma-memrefuse.") as tmp_name:
        tmp = pathlib.Path(tmp_name)
        model = tmp / "storage" / "models" / "llama-2-7b"
        model.mkdir(parents=True)
        (model / "config.json").write_text(json.dumps(LLAMA2_7B))
        (tmp / "storage" / "tokens").mkdir()
        addr = f"127.0.0.1:{free_port()}"
        procs = [subprocess.Popen([str(binary / "stemma-coordinator"), "--listen", addr, "--data",
                                   str(tmp / "coord")], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)]
        try:
            # A HOME of the test's own: no ~/.config/stemma of the developer's reaches the
            # CLI, and it writes none.
            env = {k: v for k, v in os.environ.items() if not k.startswith("STEMMA_")}
            env["HOME"] = str(tmp)

            def stemma(*args):
                r = subprocess.run([str(binary / "stemma"), "--coordinator", addr, *args],
                                   capture_output=True, text=True, cwd=tmp, env=env)
                return r.returncode, r.stdout + r.stderr
            for _ in range(100):
                if stemma("ls")[0] == 0:
                    break
                time.sleep(0.1)
            procs.append(subprocess.Popen(
                [str(worker), "--coordinator", addr, "--data", str(tmp / "w"),
                 "--gpus", "8", "--cpus", "2", "--memory-mb", "16384", "--storage-root",
                 str(tmp / "storage")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            for _ in range(100):
                rc, out = stemma("workers", "-o", "json")
                if rc == 0 and '"gpus"' in out:
                    break
                time.sleep(0.1)

            train = {"model": str(model), "out": str(tmp / "storage" / "out"),
                     "data": {"datasets": [{"path": str(tmp / "storage" / "tokens")}],
                              "seq_len": 4096},
                     "batch_size": 8, "steps": 10, "device": "cuda", "precision": "bfloat16"}
            job = {"name": "ft-7b", "resources": {"gpus": 8}, "train": train}
            (tmp / "big.json").write_text(json.dumps(job))
            rc, out = stemma("submit", "-f", "big.json")
            expect(rc != 0, "a 7B full fine-tuning job with nothing sharded is refused", out)
            m = re.search(r"needs ~(\d+) GiB per GPU", out)
            expect(m is not None and 120 <= int(m.group(1)) <= 210,
                   "the refusal states the estimate (gpu-scale.md: 146-172 GiB, ±20 %)", out)
            expect("80 GiB" in out, "the refusal names the workers' GPU size", out)
            expect("parallel.shard: " in out and re.search(r"with .*: ~\d+ GiB per GPU", out),
                   "the refusal names the fields that would make it fit and their estimate", out)
            rc, out = stemma("ls", "-o", "json")
            expect("ft-7b" not in out, "nothing was queued", out)

            fixed = dict(job, train=dict(train, parallel={"shard": "full"},
                                         activation_checkpointing=1))
            (tmp / "fixed.json").write_text(json.dumps(fixed))
            rc, out = stemma("submit", "-f", "fixed.json")
            expect(rc == 0, "sharded with every layer recomputed, it is accepted", out)

            exp = {"name": "memplan-refusal", "stages": {"ft": dict(job)}}
            del exp["stages"]["ft"]["name"]
            (tmp / "exp.json").write_text(json.dumps(exp))
            rc, out = stemma("sweep", "-f", "exp.json")
            expect(rc != 0 and "1 job does not fit" in out and "needs ~" in out and
                   "parallel.shard" in out, "an experiment with that job is refused", out)
            rc, out = stemma("plan", "-f", "exp.json")
            expect(rc == 0 and re.search(r"ft \(train.*~\d+ GiB per GPU \(does not fit 80 GiB",
                                         out), "stemma plan shows the stage not fitting", out)
            rc, out = stemma("plan", "-f", "exp.json", "--gpu-memory", "200GiB")
            expect(rc == 0 and "(fits 200 GiB)" in out, "--gpu-memory plans against that size", out)
            rc, out = stemma("plan", "-f", "exp.json", "--gpu-memory", "lots")
            expect(rc != 0 and "--gpu-memory" in out, "a bad --gpu-memory names the flag", out)

            cpu = {"name": "cpu-7b", "resources": {"cpus": 1},
                   "train": dict(train, device="cpu", precision="float32", batch_size=1,
                                 seq_len=None)}
            cpu["train"].pop("seq_len")
            (tmp / "cpu.json").write_text(json.dumps(cpu))
            rc, out = stemma("submit", "-f", "cpu.json")
            expect(rc != 0 and "per CPU process" in out and "largest worker has 16 GiB" in out,
                   "a CPU job larger than every worker's memory is refused", out)
        finally:
            for p in reversed(procs):
                p.terminate()
                p.wait(timeout=30)
    for f in failures:
        print("FAIL:", f)
    print("memory refusals:", "ok" if not failures else f"{len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
