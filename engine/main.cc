// stemma-engine <command> [args...]: one job attempt (or one tool invocation) per process.
// Only composes: each command lives in its own file and returns the exit code. Any
// exception that escapes a command (c10::Error from LibTorch, std::exception from the rest)
// becomes one line on stderr and exit 1, so a worker sees a clear failed attempt.
#include <c10/util/Exception.h>

#include <cstdio>
#include <cstring>
#include <exception>
#include <string_view>

#include "engine/analyze/commands.h"
#include "engine/commands.h"
#include "engine/data/commands.h"
#include "engine/eval/commands.h"
#include "engine/io/commands.h"
#include "engine/merge/commands.h"
#include "engine/train/commands.h"

namespace {

constexpr const char* kUsage =
    "usage: stemma-engine <command> [args]\n"
    "commands:\n"
    "  init     --out DIR [--arch A] [--preset tiny|small] [--hidden-size N] ... (init --help)\n"
    "  logits   --model DIR --tokens 1,2,3 [--out FILE]\n"
    "  inspect  DIR|FILE.safetensors   tensors, dtypes, shapes, shards, manifest status\n"
    "  verify   DIR                    check every file against the stemma.json manifest\n"
    "  tokenize --tokenizer DIR --input FILE... --format text|jsonl --language L --out DIR\n"
    "  every command that takes a spec: --spec FILE, --<field> VALUE, --help (stemma explain)\n"
    "  prepare  --spec FILE            corpus from gettext catalogues and text (docs/corpus.md)\n"
    "  train    --spec FILE            continued pretraining (docs/train.md)\n"
    "  merge    --spec FILE            soup, task arithmetic, TIES, DARE (docs/merge.md)\n"
    "  revert | interpolate | graft | upcycle --spec FILE   checkpoint algebra (docs/merge.md)\n"
    "  eval     --spec FILE            perplexity, k-shot choice, translation (docs/eval.md)\n"
    "  analyze  --spec FILE            LAPE, routing, weight drift, alignment (docs/eval.md)\n";

int Dispatch(int argc, char** argv) {
  if (argc < 2) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  std::string_view command = argv[1];
  // Commands see their own argv: argv[0] is the command name.
  int sub_argc = argc - 1;
  char** sub_argv = argv + 1;
  if (command == "-h" || command == "--help" || command == "help") {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (command == "init") return stemma::engine::RunInit(sub_argc, sub_argv);
  if (command == "logits") return stemma::engine::RunLogits(sub_argc, sub_argv);
  if (command == "train") return stemma::engine::RunTrain(sub_argc, sub_argv);
  // One implementation; argv[0] (the command name) selects the operation.
  if (command == "merge" || command == "revert" || command == "interpolate" || command == "graft" ||
      command == "upcycle") {
    return stemma::engine::RunMerge(sub_argc, sub_argv);
  }
  if (command == "eval") return stemma::engine::RunEval(sub_argc, sub_argv);
  if (command == "analyze") return stemma::engine::RunAnalyze(sub_argc, sub_argv);
  if (command == "inspect") return stemma::engine::RunInspect(sub_argc, sub_argv);
  if (command == "tokenize") return stemma::engine::RunTokenize(sub_argc, sub_argv);
  if (command == "prepare") return stemma::engine::RunPrepare(sub_argc, sub_argv);
  if (command == "verify") return stemma::engine::RunVerify(sub_argc, sub_argv);
  std::fprintf(stderr, "stemma-engine: error: unknown command '%s' (try stemma-engine --help)\n",
               argv[1]);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return Dispatch(argc, argv);
  } catch (const c10::Error& e) {
    // what_without_backtrace: the message, not a C++ stack dump.
    std::fprintf(stderr, "stemma-engine: error: %s\n", e.what_without_backtrace());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "stemma-engine: error: %s\n", e.what());
  }
  return 1;
}
