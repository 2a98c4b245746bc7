// An eval whose every task is in the per-task cache (docs/eval.md § Per-task cache), answered
// without LibTorch: the path of `stemma-engine eval` in the engine's front (engine/front/
// main.cc), which starts the LibTorch binary only for what this does not answer. Torch-free.
#pragma once

#include <optional>

namespace stemma::engine::eval {

// `argv[0]` is "eval". When STEMMA_EVAL_CACHE names a cache and every task of the spec hits,
// writes what the LibTorch engine writes for such an eval — the start, metric, output and
// done events, the results file (EvalResults) — and returns the exit code. Returns nullopt,
// having written nothing, when the LibTorch engine must run the command: caching off,
// --help, a command line, spec or model directory it does not read cleanly (the engine
// reports those as ever), a device that is not cpu, cuda or cuda:N, a checkpoint without
// stemma.json (its identity hashes every weight: not worth doing twice), or any task not
// served. The tokenizer is not loaded when the entries record its kind (CachedTasks::
// StoredTokenizerKind; its files are in every key); entries written before they did are
// served after loading it, as before, and one it cannot load goes to the LibTorch engine.
// One difference: a served eval on `cuda` does not check that this process sees a GPU (it
// uses none). Every rank of a job decides alike (TaskCache's cutoff).
//
// Sets STEMMA_ENGINE_BUILD_ID, when unset, to the build in the cache's keys, so that the
// LibTorch engine started after it keys tasks as it does.
std::optional<int> ServeCachedEval(int argc, char** argv);

}  // namespace stemma::engine::eval
