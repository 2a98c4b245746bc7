// stemma-engine init and logits (engine/commands.h).
#include "engine/commands.h"

#include <c10/util/Exception.h>
#include <torch/types.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status.h"
#include "engine/io/safetensors.h"
#include "engine/model/checkpoint.h"
#include "engine/model/config.h"

namespace stemma::engine {
namespace {

using model::CausalLM;

// `--key value` and `--key=value` after argv[0] (the command name); only `allowed` keys.
absl::StatusOr<std::map<std::string, std::string>> ParseFlags(
    int argc, char** argv, const std::vector<std::string>& allowed) {
  std::map<std::string, std::string> flags;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (!absl::StartsWith(arg, "--")) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", arg, "'"));
    }
    std::string key = arg.substr(2), value;
    if (auto eq = key.find('='); eq != std::string::npos) {
      value = key.substr(eq + 1);
      key = key.substr(0, eq);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      return absl::InvalidArgumentError(absl::StrCat("flag --", key, " needs a value"));
    }
    if (std::find(allowed.begin(), allowed.end(), key) == allowed.end()) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", key));
    }
    flags[key] = value;
  }
  return flags;
}

absl::StatusOr<std::string> Required(const std::map<std::string, std::string>& flags,
                                     const std::string& key) {
  auto it = flags.find(key);
  if (it == flags.end() || it->second.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("missing --", key));
  }
  return it->second;
}

int Fail(const char* command, const absl::Status& status) {
  std::fprintf(stderr, "stemma-engine %s: error: %s\n", command,
               std::string(status.message()).c_str());
  return 1;
}

// Turns exceptions from LibTorch into a Status, so every failure is one line.
template <typename Fn>
absl::Status Guarded(Fn&& fn) {
  try {
    return fn();
  } catch (const c10::Error& e) {
    return absl::InternalError(e.what_without_backtrace());
  } catch (const std::exception& e) {
    return absl::InternalError(e.what());
  }
}

absl::Status Init(int argc, char** argv) {
  ASSIGN_OR_RETURN(auto flags,
                   ParseFlags(argc, argv, {"arch", "preset", "seed", "out", "tokenizer"}));
  ASSIGN_OR_RETURN(std::string arch_name, Required(flags, "arch"));
  ASSIGN_OR_RETURN(std::string out, Required(flags, "out"));
  const std::string preset = flags.count("preset") ? flags["preset"] : "tiny";
  uint64_t seed = 0;
  if (flags.count("seed") && !absl::SimpleAtoi(flags["seed"], &seed)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--seed must be a non-negative integer, got '", flags["seed"], "'"));
  }
  ASSIGN_OR_RETURN(model::Arch arch, model::ArchFromName(arch_name));
  ASSIGN_OR_RETURN(nlohmann::json config_json, model::PresetConfigJson(arch, preset));
  if (flags.count("tokenizer")) {
    if (flags["tokenizer"] != "bytes") {
      return absl::InvalidArgumentError(
          absl::StrCat("--tokenizer must be 'bytes', got '", flags["tokenizer"], "'"));
    }
    // The byte tokenizer (engine/tokenizer/tokenizer.h): bytes 0..255, BOS 256, EOS 257,
    // PAD 258; config.json names it, so `tokenize`, `train` and `eval` find it in the model.
    config_json["vocab_size"] = 259;
    config_json["bos_token_id"] = 256;
    config_json["eos_token_id"] = 257;
    config_json["pad_token_id"] = 258;
    config_json["stemma_tokenizer"] = {{"type", "bytes"}};
  }
  ASSIGN_OR_RETURN(model::ModelConfig config, model::ParseModelConfig(config_json));
  ASSIGN_OR_RETURN(CausalLM lm, model::InitModel(config, seed));
  model::SaveOptions options;
  options.producer.command = "init";
  options.producer.params = {{"arch", arch_name}, {"preset", preset}, {"seed", seed}};
  if (flags.count("tokenizer")) options.producer.params["tokenizer"] = flags["tokenizer"];
  RETURN_IF_ERROR(model::SaveModel(lm, out, options));
  int64_t count = 0;
  for (const auto& p : lm->parameters()) count += p.numel();
  std::fprintf(stderr, "init: wrote %s (%s, preset %s, seed %llu, %lld parameters)\n",
               out.c_str(), arch_name.c_str(), preset.c_str(),
               static_cast<unsigned long long>(seed), static_cast<long long>(count));
  // stdout carries only events (docs/engine-events.md).
  nlohmann::json output = {{"event", "output"}, {"name", "model"}, {"path", out}};
  nlohmann::json done = {{"event", "done"}, {"command", "init"}, {"arch", arch_name},
                         {"preset", preset}, {"parameters", count}};
  std::printf("%s\n%s\n", output.dump().c_str(), done.dump().c_str());
  std::fflush(stdout);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int64_t>> ParseTokens(const std::string& text, int64_t vocab) {
  std::vector<int64_t> tokens;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    int64_t id;
    if (!absl::SimpleAtoi(part, &id) || id < 0 || id >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("--tokens: '", part, "' is not a token id in [0, ", vocab, ")"));
    }
    tokens.push_back(id);
  }
  return tokens;
}

absl::Status Logits(int argc, char** argv) {
  ASSIGN_OR_RETURN(auto flags, ParseFlags(argc, argv, {"model", "tokens", "out"}));
  ASSIGN_OR_RETURN(std::string dir, Required(flags, "model"));
  ASSIGN_OR_RETURN(std::string token_text, Required(flags, "tokens"));
  ASSIGN_OR_RETURN(CausalLM lm, model::LoadModel(dir));
  ASSIGN_OR_RETURN(std::vector<int64_t> tokens, ParseTokens(token_text, lm->config().vocab_size));
  torch::Tensor logits;
  RETURN_IF_ERROR(Guarded([&] {
    torch::NoGradGuard no_grad;
    auto ids = torch::tensor(tokens, torch::kInt64).unsqueeze(0);                    // [1, T]
    logits = lm->forward(ids).logits.to(torch::kCPU, torch::kFloat32).contiguous();  // [1,T,V]
    return absl::OkStatus();
  }));
  if (flags.count("out")) {
    io::TensorToWrite t;
    t.name = "logits";
    t.dtype = io::Dtype::kF32;
    t.shape = logits.sizes().vec();
    t.data = logits.data_ptr<float>();
    t.nbytes = logits.numel() * sizeof(float);
    return io::WriteSafetensors(flags["out"], {t}).status();
  }
  // No file: one line per position, its argmax and the logit there.
  auto [values, argmax] = logits[0].max(-1);
  for (int64_t i = 0; i < logits.size(1); ++i) {
    std::printf("%lld\t%lld\t%.6f\n", static_cast<long long>(tokens[i]),
                static_cast<long long>(argmax[i].item<int64_t>()), values[i].item<float>());
  }
  return absl::OkStatus();
}

}  // namespace

int RunInit(int argc, char** argv) {
  absl::Status status = Guarded([&] { return Init(argc, argv); });
  return status.ok() ? 0 : Fail("init", status);
}

int RunLogits(int argc, char** argv) {
  absl::Status status = Guarded([&] { return Logits(argc, argv); });
  return status.ok() ? 0 : Fail("logits", status);
}

}  // namespace stemma::engine
