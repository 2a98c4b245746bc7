// `stemma-engine tokenize` (docs/engine/tokenize.md): the spec stemma.v1.TokenizeSpec from
// --spec FILE and/or flags, through the one engine command-line parser.
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/engine_cli.h"
#include "common/engine_contract.h"
#include "common/status.h"
#include "engine/commands.h"
#include "engine/data/commands.h"
#include "engine/data/tokenize.h"
#include "engine/events.h"
#include "nlohmann/json.hpp"
#include "stemma/v1/specs/data.pb.h"

namespace stemma::engine {
namespace {

constexpr char kUsage[] =
    "stemma-engine tokenize --tokenizer DIR --input FILE... --format text|jsonl [--field text]\n"
    "         [--line-docs] --language L --out DIR [--shard-tokens N] [--eos] [--overwrite]\n"
    "       stemma-engine tokenize --spec FILE";

// `--input a b c` (every argument up to the next flag, as documented) becomes the one
// `--input ["a","b","c"]` the spec parser reads as a list.
std::vector<std::string> GatherInputs(int argc, char** argv) {
  std::vector<std::string> args;
  for (int i = 0; i < argc; ++i) {
    std::string arg = argv[i];
    std::vector<std::string> files;
    if (arg.rfind("--input=", 0) == 0) {
      std::string value = arg.substr(8);
      if (!value.empty() && value[0] == '[') {
        args.push_back(arg);
        continue;
      }
      files.push_back(value);
    } else if (arg == "--input") {
      if (i + 1 < argc && argv[i + 1][0] == '[') {
        args.push_back(arg);
        continue;
      }
      while (i + 1 < argc && std::string(argv[i + 1]).rfind("--", 0) != 0)
        files.push_back(argv[++i]);
    } else {
      args.push_back(arg);
      continue;
    }
    args.push_back("--input");
    args.push_back(nlohmann::json(files).dump());
  }
  return args;
}

void Emit(const v1::EngineEvent& event) { EventWriter().Emit(event); }

absl::StatusOr<int> Tokenize(const SpecCall& call) {
  const auto& spec = call.Get<v1::TokenizeSpec>();
  // docs/engine/tokenize.md, "Events".
  Emit(CommandEvent(engine_contract::kEventStart, "tokenize",
                    {{"spec", call.source},
                     {"inputs", std::vector<std::string>(spec.input().begin(), spec.input().end())},
                     {"format", spec.format()},
                     {"line_docs", spec.line_docs()},
                     {"language", spec.language()},
                     {"out", spec.out()}}));
  if (std::error_code ec;
      !std::filesystem::create_directories(std::filesystem::path(spec.out()).parent_path(), ec) &&
      ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("out: cannot create the directory of ", spec.out(), ": ", ec.message()));
  }
  ASSIGN_OR_RETURN(data::TokenizeSummary summary, data::TokenizeFiles(spec));
  const std::string hint = data::LineDocsHint(spec, summary);
  if (!hint.empty()) std::fprintf(stderr, "stemma-engine tokenize: hint: %s\n", hint.c_str());
  Emit(OutputEventOrBare("dataset", spec.out(), kOutputDataset, "tokenize"));
  EventDetails done = {{"out", spec.out()},
                       {"language", spec.language()},
                       {"documents", summary.num_documents},
                       {"tokens", summary.num_tokens},
                       {"shards", summary.num_shards},
                       {"largest_document_bytes", summary.largest_document_bytes}};
  if (!hint.empty()) done["hint"] = hint;
  Emit(CommandEvent(engine_contract::kEventDone, "tokenize", done));
  return engine_contract::kExitOk;
}

}  // namespace

int RunTokenize(int argc, char** argv) {
  std::vector<std::string> args = GatherInputs(argc, argv);
  std::vector<char*> pointers;
  for (std::string& a : args) pointers.push_back(a.data());
  return RunSpecCommand({kUsage, {}, Tokenize}, static_cast<int>(pointers.size()), pointers.data());
}

}  // namespace stemma::engine
