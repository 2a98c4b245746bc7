#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "absl/strings/numbers.h"
#include "engine/data/commands.h"
#include "engine/data/tokenize.h"
#include "nlohmann/json.hpp"

namespace stemma::engine {
namespace {

constexpr const char* kTokenizeUsage =
    "usage: stemma-engine tokenize --tokenizer DIR --input FILE... --format text|jsonl\n"
    "         [--field text] [--line-docs] --language L --out DIR [--shard-tokens N] [--eos]\n"
    "         [--overwrite]\n";

int Fail(const std::string& message) {
  std::fprintf(stderr, "stemma-engine tokenize: error: %s\n", message.c_str());
  return 1;
}

int Usage(const std::string& message) {
  std::fprintf(stderr, "stemma-engine tokenize: error: %s\n%s", message.c_str(), kTokenizeUsage);
  return 2;
}

}  // namespace

int RunTokenize(int argc, char** argv) {
  data::TokenizeOptions options;
  bool have_format = false;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    auto value = [&](std::string* out) {
      if (i + 1 >= argc) return false;
      *out = argv[++i];
      return true;
    };
    std::string v;
    if (arg == "-h" || arg == "--help") {
      std::fputs(kTokenizeUsage, stdout);
      return 0;
    } else if (arg == "--tokenizer") {
      if (!value(&options.tokenizer_dir)) return Usage("--tokenizer needs a directory");
    } else if (arg == "--input") {
      // One or more files, up to the next flag.
      while (i + 1 < argc && std::string_view(argv[i + 1]).substr(0, 2) != "--") {
        options.inputs.push_back(argv[++i]);
      }
      if (options.inputs.empty()) return Usage("--input needs at least one file");
    } else if (arg == "--format") {
      if (!value(&v)) return Usage("--format needs text or jsonl");
      if (v == "text") {
        options.format = data::InputFormat::kText;
      } else if (v == "jsonl") {
        options.format = data::InputFormat::kJsonl;
      } else {
        return Usage("--format: '" + v + "', expected text or jsonl");
      }
      have_format = true;
    } else if (arg == "--field") {
      if (!value(&options.field)) return Usage("--field needs a name");
    } else if (arg == "--line-docs") {
      options.line_docs = true;
    } else if (arg == "--language") {
      if (!value(&options.language)) return Usage("--language needs a code");
    } else if (arg == "--out") {
      if (!value(&options.out_dir)) return Usage("--out needs a directory");
    } else if (arg == "--shard-tokens") {
      if (!value(&v) || !absl::SimpleAtoi(v, &options.shard_tokens) || options.shard_tokens <= 0) {
        return Usage("--shard-tokens needs a positive integer");
      }
    } else if (arg == "--eos") {
      options.append_eos = true;
    } else if (arg == "--overwrite") {
      options.overwrite = true;
    } else {
      return Usage("unknown argument '" + std::string(arg) + "'");
    }
  }
  if (options.tokenizer_dir.empty()) return Usage("--tokenizer is required");
  if (options.inputs.empty()) return Usage("--input is required");
  if (!have_format) return Usage("--format is required");
  if (options.language.empty()) return Usage("--language is required");
  if (options.out_dir.empty()) return Usage("--out is required");
  if (options.line_docs && options.format != data::InputFormat::kText) {
    return Usage("--line-docs applies to --format text only");
  }
  absl::StatusOr<data::TokenizeSummary> summary = data::TokenizeFiles(options);
  if (!summary.ok()) return Fail(std::string(summary.status().message()));
  // docs/engine-events.md: the dataset as an output, then a summary.
  nlohmann::json output = {{"event", "output"}, {"name", "dataset"}, {"path", options.out_dir}};
  std::printf("%s\n", output.dump().c_str());
  nlohmann::json out = {{"event", "done"},
                        {"out", options.out_dir},
                        {"language", options.language},
                        {"documents", summary->num_documents},
                        {"tokens", summary->num_tokens},
                        {"shards", summary->num_shards}};
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

}  // namespace stemma::engine
