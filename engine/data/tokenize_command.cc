// `stemma-engine tokenize` (docs/engine/tokenize.md): the spec stemma.v1.TokenizeSpec from
// --spec FILE and/or flags, through the one engine command-line parser.
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/engine_cli.h"
#include "common/engine_contract.h"
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

void Emit(const Event& event) { EventWriter().Emit(event); }

}  // namespace

int RunTokenize(int argc, char** argv) {
  std::vector<std::string> args = GatherInputs(argc, argv);
  std::vector<char*> pointers;
  for (std::string& a : args) pointers.push_back(a.data());
  absl::StatusOr<EngineInvocation> inv =
      ParseEngineCommandLine("tokenize", static_cast<int>(pointers.size()), pointers.data(), {});
  if (!inv.ok()) return ReportEngineFailure(inv.status());
  if (inv->help) {
    std::fputs(EngineHelp("tokenize", kUsage).c_str(), stdout);
    return engine_contract::kExitOk;
  }
  const auto& spec = static_cast<const v1::TokenizeSpec&>(*inv->spec);
  // docs/engine/tokenize.md, "Events".
  Emit({{"event", std::string(engine_contract::kEventStart)},
        {"command", "tokenize"},
        {"spec", inv->spec_file.empty() ? "command line" : inv->spec_file},
        {"inputs", std::vector<std::string>(spec.input().begin(), spec.input().end())},
        {"format", spec.format()},
        {"line_docs", spec.line_docs()},
        {"language", spec.language()},
        {"out", spec.out()}});
  if (std::error_code ec;
      !std::filesystem::create_directories(std::filesystem::path(spec.out()).parent_path(), ec) &&
      ec) {
    return ReportEngineFailure(absl::FailedPreconditionError(
        absl::StrCat("out: cannot create the directory of ", spec.out(), ": ", ec.message())));
  }
  absl::StatusOr<data::TokenizeSummary> summary = data::TokenizeFiles(spec);
  if (!summary.ok()) return ReportEngineFailure(summary.status());
  const std::string hint = data::LineDocsHint(spec, *summary);
  if (!hint.empty()) std::fprintf(stderr, "stemma-engine tokenize: hint: %s\n", hint.c_str());
  absl::StatusOr<Event> output = OutputEvent("dataset", spec.out(), "tokenize");
  if (!output.ok()) {
    output = Event{{"event", "output"},
                   {"name", "dataset"},
                   {"path", spec.out()},
                   {"type", "dataset"},
                   {"operation", "tokenize"}};
  }
  Emit(*output);
  nlohmann::ordered_json done = {{"event", std::string(engine_contract::kEventDone)},
                                 {"command", "tokenize"},
                                 {"out", spec.out()},
                                 {"language", spec.language()},
                                 {"documents", summary->num_documents},
                                 {"tokens", summary->num_tokens},
                                 {"shards", summary->num_shards},
                                 {"largest_document_bytes", summary->largest_document_bytes}};
  if (!hint.empty()) done["hint"] = hint;
  Emit(done);
  return engine_contract::kExitOk;
}

}  // namespace stemma::engine
