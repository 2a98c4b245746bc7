// stemma-engine <command> [args...]: one job attempt (or one tool invocation) per process.
// Only composes: one table names every command (each lives in its own file and returns the
// exit code; spec commands run through RunSpecCommand, engine/commands.h). Any exception
// that escapes a command (c10::Error from LibTorch, std::exception from the rest) becomes
// one line on stderr and exit 1, so a worker sees a clear failed attempt.
#include <c10/util/Exception.h>

#include <cstdio>
#include <exception>
#include <string>
#include <string_view>

#include "common/engine_contract.h"
#include "engine/analyze/commands.h"
#include "engine/build_info.h"
#include "engine/commands.h"
#include "engine/data/commands.h"
#include "engine/eval/commands.h"
#include "engine/io/commands.h"
#include "engine/merge/commands.h"
#include "engine/train/commands.h"

namespace stemma::engine {
namespace {

struct Command {
  std::string_view name;
  CommandFn run;
  std::string_view summary;  // its line in `stemma-engine --help`, after the name
};

// Every command, in the order of --help. One line each (so that adding one is a one-line
// change); the names several share run one implementation, which reads argv[0].
// clang-format off
constexpr Command kCommands[] = {
    {"init", RunInit, "--out DIR [--arch A] [--preset tiny|small] [--hidden-size N] ... (init --help)"},
    {"logits", RunLogits, "--model DIR --tokens 1,2,3 [--out FILE]"},
    {"inspect", RunInspect, "DIR|FILE.safetensors   tensors, dtypes, shapes, shards, manifest status"},
    {"verify", RunVerify, "DIR                    check every file against the stemma.json manifest"},
    {"tokenize", RunTokenize, "--tokenizer DIR --input FILE... --format text|jsonl --language L --out DIR"},
    {"prepare", RunPrepare, "--spec FILE            corpus from gettext catalogues and text (docs/corpus.md)"},
    {"train", RunTrain, "--spec FILE            continued pretraining (docs/train.md)"},
    {"merge", RunMerge, "--spec FILE            soup, task arithmetic, TIES, DARE (docs/merge.md)"},
    {"revert", RunMerge, "--spec FILE            checkpoint algebra: layers back to the base (docs/merge.md)"},
    {"interpolate", RunMerge, "--spec FILE         checkpoint algebra (docs/merge.md)"},
    {"graft", RunMerge, "--spec FILE            checkpoint algebra (docs/merge.md)"},
    {"upcycle", RunMerge, "--spec FILE            checkpoint algebra: dense to MoE (docs/merge.md)"},
    {"eval", RunEval, "--spec FILE            perplexity, k-shot choice, translation (docs/eval.md)"},
    {"analyze", RunAnalyze, "--spec FILE            LAPE, routing, weight drift, alignment (docs/eval.md)"},
};
// clang-format on

void PrintUsage(std::FILE* out) {
  std::fputs("usage: stemma-engine <command> [args]\ncommands:\n", out);
  for (const Command& c : kCommands) {
    std::fprintf(out, "  %-8s %.*s\n", std::string(c.name).c_str(),
                 static_cast<int>(c.summary.size()), c.summary.data());
  }
  std::fputs(
      "every command that takes a spec: --spec FILE, --<field> VALUE, --help (stemma explain)\n",
      out);
}

int Dispatch(int argc, char** argv) {
  if (argc < 2) {
    PrintUsage(stderr);
    return engine_contract::kExitUsage;
  }
  const std::string_view name = argv[1];
  if (name == "--version") {  // build, torch, CUDA, collectives (engine/build_info.h)
    std::fputs(BuildInfo().c_str(), stdout);
    return engine_contract::kExitOk;
  }
  if (name == "-h" || name == "--help" || name == "help") {
    PrintUsage(stdout);
    return engine_contract::kExitOk;
  }
  for (const Command& c : kCommands) {
    // Commands see their own argv: argv[0] is the command name.
    if (c.name == name) return c.run(argc - 1, argv + 1);
  }
  std::fprintf(stderr, "%sunknown command '%s' (try stemma-engine --help)\n",
               std::string(engine_contract::kErrorPrefix).c_str(), argv[1]);
  return engine_contract::kExitUsage;
}

}  // namespace
}  // namespace stemma::engine

int main(int argc, char** argv) {
  const std::string prefix(stemma::engine_contract::kErrorPrefix);
  try {
    return stemma::engine::Dispatch(argc, argv);
  } catch (const c10::Error& e) {
    // what_without_backtrace: the message, not a C++ stack dump.
    std::fprintf(stderr, "%s%s\n", prefix.c_str(), e.what_without_backtrace());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s%s\n", prefix.c_str(), e.what());
  }
  return stemma::engine_contract::kExitFailed;
}
