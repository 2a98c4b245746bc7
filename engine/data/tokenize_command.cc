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
  data::TokenizeOptions options;
  options.tokenizer_dir = spec.tokenizer();
  options.inputs.assign(spec.input().begin(), spec.input().end());
  options.format = spec.format() == "jsonl" ? data::InputFormat::kJsonl : data::InputFormat::kText;
  options.field = spec.field();
  options.line_docs = spec.line_docs();
  options.language = spec.language();
  options.out_dir = spec.out();
  options.shard_tokens = spec.shard_tokens();
  options.append_eos = spec.eos();
  options.overwrite = spec.overwrite();

  // docs/engine/tokenize.md, "Events".
  Emit({{"event", std::string(engine_contract::kEventStart)},
        {"command", "tokenize"},
        {"spec", inv->spec_file.empty() ? "command line" : inv->spec_file},
        {"inputs", options.inputs},
        {"format", spec.format()},
        {"line_docs", options.line_docs},
        {"language", options.language},
        {"out", options.out_dir}});
  if (std::error_code ec; !std::filesystem::create_directories(
                              std::filesystem::path(options.out_dir).parent_path(), ec) &&
                          ec) {
    return ReportEngineFailure(absl::FailedPreconditionError(
        absl::StrCat("out: cannot create the directory of ", options.out_dir, ": ", ec.message())));
  }
  absl::StatusOr<data::TokenizeSummary> summary = data::TokenizeFiles(options);
  if (!summary.ok()) return ReportEngineFailure(summary.status());
  const std::string hint = data::LineDocsHint(options, *summary);
  if (!hint.empty()) std::fprintf(stderr, "stemma-engine tokenize: hint: %s\n", hint.c_str());
  absl::StatusOr<Event> output = OutputEvent("dataset", options.out_dir, "tokenize");
  if (!output.ok()) {
    output = Event{{"event", "output"},
                   {"name", "dataset"},
                   {"path", options.out_dir},
                   {"type", "dataset"},
                   {"operation", "tokenize"}};
  }
  Emit(*output);
  nlohmann::ordered_json done = {{"event", std::string(engine_contract::kEventDone)},
                                 {"command", "tokenize"},
                                 {"out", options.out_dir},
                                 {"language", options.language},
                                 {"documents", summary->num_documents},
                                 {"tokens", summary->num_tokens},
                                 {"shards", summary->num_shards},
                                 {"largest_document_bytes", summary->largest_document_bytes}};
  if (!hint.empty()) done["hint"] = hint;
  Emit(done);
  return engine_contract::kExitOk;
}

}  // namespace stemma::engine
