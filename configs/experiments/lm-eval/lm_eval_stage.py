#!/usr/bin/env python3
"""lm-evaluation-harness as a Stemma exec stage (docs/experiments.md, "Your own code").

Evaluates one checkpoint with lm_eval's Hugging Face backend on the CPU, offline, on
multiple-choice suites in the Global-PIQA layout (prompt, solution0..N, label) that the study
built itself, and writes the results in Stemma's results format (docs/eval.md,
"stemma-eval-v1") so that the worker registers them and `stemma report` shows them beside
Stemma's own eval of the same items:

  lm_eval_stage.py --model DIR --suite NAME=FILE [--suite ...] [--out FILE] [--limit N]

--out defaults to $STEMMA_OUTPUT_RESULTS (the worker's path for the declared `results`
output). Each suite becomes an lm_eval task named NAME (task YAML written to a temporary
directory, `dataset_path: json` over the file; its language is NAME's last `_` part, as in
continuation_ru): zero-shot, the first --limit documents, the prompt as the context and
" " + each solution as a continuation, the same split of context and continuation tokens as
Stemma's `choice` task with `add_bos: false`. lm_eval's `acc` (argmax of the summed
log-likelihood) is Stemma's `acc`, its `acc_norm` (divided by the continuation's length in
characters) Stemma's `acc_norm` (code points).

Stemma's byte tokenizer (stemma_tokenizer.json {"type": "bytes"}) has no Hugging Face files:
it is rebuilt here as a `tokenizers` byte-level BPE without merges (token id = byte value,
<bos> 256, <eos> 257, <pad> 258), which encodes every text exactly as Stemma does. Any other
checkpoint uses its own tokenizer files.
"""
import argparse
import json
import os
import sys
import tempfile


def byte_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    chars = bytes_to_unicode()
    tok = Tokenizer(models.BPE(vocab={chars[b]: b for b in range(256)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>")


def is_byte_model(model_dir):
    path = os.path.join(model_dir, "stemma_tokenizer.json")
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f).get("type") == "bytes"
    with open(os.path.join(model_dir, "config.json")) as f:
        return (json.load(f).get("stemma_tokenizer") or {}).get("type") == "bytes"


TASK_YAML = """task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {file}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{prompt}}}}"
doc_to_choice: "{{{{[{solutions}]}}}}"
doc_to_target: label
target_delimiter: " "
num_fewshot: 0
metric_list:
  - {{metric: acc, aggregation: mean, higher_is_better: true}}
  - {{metric: acc_norm, aggregation: mean, higher_is_better: true}}
"""


def write_tasks(suites, task_dir):
    names = []
    for name, path in suites:
        lang = name.rsplit("_", 1)[-1]
        with open(path) as f:
            first = json.loads(next(line for line in f if line.strip()))
        n = sum(1 for k in first if k.startswith("solution"))
        with open(os.path.join(task_dir, name + ".yaml"), "w") as f:
            f.write(TASK_YAML.format(name=name, file=json.dumps(os.path.abspath(path)),
                                     solutions=", ".join(f"solution{i}" for i in range(n))))
        names.append((name, lang, path))
    return names


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--suite", action="append", required=True, metavar="NAME=FILE")
    p.add_argument("--out", default=os.environ.get("STEMMA_OUTPUT_RESULTS", ""))
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=1)
    a = p.parse_args()
    if not a.out:
        p.error("--out (or $STEMMA_OUTPUT_RESULTS) is required")
    suites = [tuple(s.split("=", 1)) for s in a.suite]
    work = tempfile.mkdtemp(prefix="lmeval-")
    # Offline: no hub, datasets cached in the attempt's own directory.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ["HF_DATASETS_CACHE"] = os.path.join(work, "datasets")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if os.environ.get("WORLD_SIZE", "1") == "1":
        # One process: the worker's rank variables (RANK=0, WORLD_SIZE=1, ...) would make
        # accelerate start torch.distributed, which then wants MASTER_ADDR.
        for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK"):
            os.environ.pop(var, None)

    import lm_eval
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    task_dir = os.path.join(work, "tasks")
    os.makedirs(task_dir)
    tasks = write_tasks(suites, task_dir)
    tokenizer = byte_tokenizer() if is_byte_model(a.model) else None
    lm = HFLM(pretrained=a.model, tokenizer=tokenizer, device="cpu", dtype="float32",
              batch_size=a.batch_size, add_bos_token=False)
    out = lm_eval.simple_evaluate(
        model=lm, tasks=[t[0] for t in tasks], num_fewshot=0, limit=a.limit,
        task_manager=TaskManager(include_path=task_dir), random_seed=0, numpy_random_seed=0,
        torch_random_seed=0, fewshot_random_seed=0, log_samples=False)
    results = {"format": "stemma-eval-v1",
               "checkpoint": {"path": os.path.abspath(a.model)},
               "producer": {"name": "lm-evaluation-harness",
                            "version": getattr(lm_eval, "__version__", "")},
               "tasks": [], "metrics": {}}
    manifest = os.path.join(a.model, "stemma.json")
    if os.path.exists(manifest):
        import hashlib
        with open(manifest, "rb") as f:
            results["checkpoint"]["sha256"] = hashlib.sha256(f.read()).hexdigest()
        results["checkpoint"]["hash_of"] = "stemma.json"
    for name, lang, path in tasks:
        r = out["results"][name]
        metrics = {m: float(r[m + ",none"]) for m in ("acc", "acc_norm") if m + ",none" in r}
        # The metric names of Stemma's eval task of the same name: acc/continuation_ru.
        results["tasks"].append({"name": name, "type": "choice", "language": lang,
                                 "data": os.path.abspath(path), "metrics": metrics,
                                 "docs": int(out.get("n-samples", {}).get(name, {})
                                             .get("effective", 0))})
        for m, v in metrics.items():
            results["metrics"][f"{m}/{name}"] = v
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    tmp = a.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(results, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, a.out)
    print(json.dumps(results["metrics"], sort_keys=True))


if __name__ == "__main__":
    sys.exit(main())
