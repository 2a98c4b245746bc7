// stemma-engine init and logits (engine/commands.h).
#include "engine/commands.h"

#include <c10/util/Exception.h>
#include <torch/types.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/engine_contract.h"
#include "common/engine_spec.h"
#include "common/status.h"
#include "engine/events.h"
#include "engine/io/safetensors.h"
#include "engine/model/checkpoint.h"
#include "engine/model/config.h"
#include "engine/tokenizer/tokenizer.h"
#include "stemma/v1/specs/model.pb.h"

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

constexpr char kInitUsage[] =
    "stemma-engine init [--spec FILE] --out DIR [--arch llama|qwen2|gemma3|olmoe] "
    "[--preset tiny|small]\n"
    "         [--tokenizer bytes|DIR] [--seed S] [--hidden-size N] [--num-layers N] "
    "[--num-heads N] [--num-kv-heads N]\n"
    "         [--head-dim N] [--intermediate-size N] [--tie-embeddings true|false]\n"
    "         [--max-position-embeddings N] [--vocab-size N] [--num-experts N] "
    "[--experts-per-token K]";

template <typename T>
std::optional<T> Opt(bool has, T value) {
  return has ? std::optional<T>(value) : std::nullopt;
}

absl::Status Init(const v1::InitSpec& spec, const std::string& where) {
  ASSIGN_OR_RETURN(model::Arch arch, model::ArchFromName(spec.arch()));
  ASSIGN_OR_RETURN(nlohmann::json config_json, model::PresetConfigJson(arch, spec.preset()));
  // The tokenizer first: its vocabulary is the default vocab_size and the floor of any other.
  int64_t tokenizer_vocab = 0;
  model::SaveOptions options;
  if (spec.tokenizer() == "bytes") {
    // The byte tokenizer (engine/tokenizer/tokenizer.h): bytes 0..255, BOS 256, EOS 257,
    // PAD 258; config.json names it, so `tokenize`, `train` and `eval` find it in the model.
    tokenizer_vocab = 259;
    config_json["bos_token_id"] = 256;
    config_json["eos_token_id"] = 257;
    config_json["pad_token_id"] = 258;
    config_json["stemma_tokenizer"] = {{"type", "bytes"}};
  } else {
    std::string dir = spec.tokenizer();
    if (!std::filesystem::path(dir).is_absolute()) {
      const char* root = std::getenv(std::string(engine_contract::kEnvStorageRoot).c_str());
      dir = (std::filesystem::path(root != nullptr && *root != '\0' ? root : ".") / dir)
                .lexically_normal()
                .string();
    }
    auto tok = tokenizer::Tokenizer::Load(dir);
    if (!tok.ok()) {
      return absl::Status(tok.status().code(),
                          absl::StrCat(where, ": tokenizer: ", tok.status().message()));
    }
    tokenizer_vocab = (*tok)->vocab_size();
    for (auto [key, id] :
         {std::pair{"bos_token_id", (*tok)->bos_id()}, std::pair{"eos_token_id", (*tok)->eos_id()},
          std::pair{"pad_token_id", (*tok)->pad_id()}}) {
      if (id.has_value()) {
        config_json[key] = *id;
      } else {
        config_json.erase(key);
      }
    }
    // The byte tokenizer lives in config.json; any other's files are copied beside the model.
    if ((*tok)->kind() == "bytes") config_json["stemma_tokenizer"] = {{"type", "bytes"}};
    options.source_dir = dir;
  }
  config_json["vocab_size"] = tokenizer_vocab;
  if (spec.has_vocab_size() && spec.vocab_size() < tokenizer_vocab) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": vocab_size: ", spec.vocab_size(),
                                                   " is less than the tokenizer's ",
                                                   tokenizer_vocab, " ids"));
  }
  model::ModelSizes sizes;
  sizes.hidden_size = Opt(spec.has_hidden_size(), spec.hidden_size());
  sizes.num_layers = Opt(spec.has_num_layers(), spec.num_layers());
  sizes.num_heads = Opt(spec.has_num_heads(), spec.num_heads());
  sizes.num_kv_heads = Opt(spec.has_num_kv_heads(), spec.num_kv_heads());
  sizes.head_dim = Opt(spec.has_head_dim(), spec.head_dim());
  sizes.intermediate_size = Opt(spec.has_intermediate_size(), spec.intermediate_size());
  sizes.max_position_embeddings =
      Opt(spec.has_max_position_embeddings(), spec.max_position_embeddings());
  sizes.vocab_size = Opt(spec.has_vocab_size(), spec.vocab_size());
  sizes.num_experts = Opt(spec.has_num_experts(), spec.num_experts());
  sizes.experts_per_token = Opt(spec.has_experts_per_token(), spec.experts_per_token());
  sizes.tie_embeddings = Opt(spec.has_tie_embeddings(), spec.tie_embeddings());
  absl::Status sized = model::ApplyModelSizes(arch, sizes, &config_json);
  if (!sized.ok()) return absl::InvalidArgumentError(absl::StrCat(where, ": ", sized.message()));
  auto config = model::ParseModelConfig(config_json);
  if (!config.ok())
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", config.status().message()));
  const uint64_t seed = spec.seed();
  if (std::error_code ec;
      !std::filesystem::create_directories(std::filesystem::path(spec.out()).parent_path(), ec) &&
      ec) {
    return absl::FailedPreconditionError(absl::StrCat(
        where, ": out: cannot create the directory of ", spec.out(), ": ", ec.message()));
  }
  ASSIGN_OR_RETURN(CausalLM lm, model::InitModel(*config, seed));
  options.producer.command = "init";
  options.producer.params = nlohmann::json::parse(SpecToJson(spec), nullptr, false);
  if (const char* job = std::getenv(std::string(engine_contract::kEnvJobId).c_str()))
    options.producer.job = job;
  if (const char* attempt = std::getenv(std::string(engine_contract::kEnvAttemptId).c_str())) {
    options.producer.attempt = attempt;
  }
  RETURN_IF_ERROR(model::SaveModel(lm, spec.out(), options));
  int64_t count = 0;
  for (const auto& p : lm->parameters()) count += p.numel();
  const auto& c = *config;
  std::fprintf(stderr, "init: wrote %s (%s, preset %s, seed %llu, %lld parameters)\n",
               spec.out().c_str(), spec.arch().c_str(), spec.preset().c_str(),
               static_cast<unsigned long long>(seed), static_cast<long long>(count));
  // stdout carries only events (docs/engine-events.md).
  EventDetails done = {{"arch", spec.arch()},
                       {"preset", spec.preset()},
                       {"parameters", count},
                       {"hidden_size", c.hidden_size},
                       {"num_layers", c.num_hidden_layers},
                       {"num_heads", c.num_attention_heads},
                       {"num_kv_heads", c.num_key_value_heads},
                       {"head_dim", c.head_dim},
                       {"intermediate_size", c.intermediate_size},
                       {"tie_embeddings", c.tie_word_embeddings},
                       {"max_position_embeddings", c.max_position_embeddings},
                       {"vocab_size", c.vocab_size}};
  if (c.is_moe()) {
    done["num_experts"] = c.num_experts;
    done["experts_per_token"] = c.num_experts_per_tok;
  }
  EventWriter events;
  events.Emit(OutputEventOrBare("model", spec.out(), kOutputCheckpoint, "init"));
  events.Emit(CommandEvent(engine_contract::kEventDone, "init", done));
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
  SpecCommand init;
  init.usage = kInitUsage;
  init.run = [](const SpecCall& call) -> absl::StatusOr<int> {
    RETURN_IF_ERROR(Guarded([&] { return Init(call.Get<v1::InitSpec>(), call.source); }));
    return engine_contract::kExitOk;
  };
  return RunSpecCommand(init, argc, argv);
}

int RunLogits(int argc, char** argv) {
  absl::Status status = Guarded([&] { return Logits(argc, argv); });
  return status.ok() ? 0 : Fail("logits", status);
}

}  // namespace stemma::engine
