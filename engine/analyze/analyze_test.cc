// stemma-engine analyze, the real command on tiny models rigged so that the answer is known
// (a neuron that fires only on one language's tokens, a router that sends one language to
// one expert), weight drift of known size, alignment of identical sentences, and bad inputs
// that must fail with a clear error and leave no output behind. The statistics alone are
// analyze_stats_test.cc.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/analyze/lape.h"
#include "engine/analyze/routing.h"
#include "engine/model/causal_lm.h"
#include "engine/model/checkpoint.h"
#include "engine/model/config.h"
#include "nlohmann/json.hpp"

namespace stemma::engine::analyze {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// The Python checks need the venv (scripts/setup --engine); without it they are skipped.
bool HavePython() { return std::string(STEMMA_PYTHON).size() > 0; }

struct RunResult {
  int rc = -1;
  std::string out, err;
};

std::string ReadAll(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void WriteText(const fs::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

class AnalyzeCommand : public testing::Test {
 protected:
  void SetUp() override {
    const auto* info = testing::UnitTest::GetInstance()->current_test_info();
    dir_ =
        fs::path(testing::TempDir()) / absl::StrCat("analyze_test_", info->name(), "_", getpid());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }

  // `env` is prefixed to the command line ("STEMMA_CPUS=1 ").
  RunResult Run(const json& spec, const std::string& env = "") {
    const fs::path spec_path = dir_ / "spec.json";
    WriteText(spec_path, spec.dump(2));
    const fs::path out = dir_ / "stdout", err = dir_ / "stderr";
    const std::string cmd =
        absl::StrCat(env, STEMMA_ENGINE_BIN, " analyze --spec ", spec_path.string(), " >",
                     out.string(), " 2>", err.string());
    RunResult r;
    const int status = std::system(cmd.c_str());
    r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.out = ReadAll(out);
    r.err = ReadAll(err);
    return r;
  }

  // Every stdout line is a JSON event; returns them.
  static std::vector<json> Events(const RunResult& r) {
    std::vector<json> events;
    std::istringstream lines(r.out);
    std::string line;
    while (std::getline(lines, line)) {
      json e = json::parse(line, nullptr, false);
      EXPECT_FALSE(e.is_discarded()) << "not JSON on stdout: " << line;
      if (!e.is_discarded()) {
        EXPECT_TRUE(e.contains("event")) << line;
        events.push_back(e);
      }
    }
    return events;
  }

  json ReadJson(const fs::path& path) { return json::parse(ReadAll(path)); }

  // The spec's list forms from a mapping (sorted by language, as nlohmann iterates):
  // languages [{language, <source>...}] and alignment texts [{language, path}].
  static json Langs(const json& by_language) {
    json list = json::array();
    for (const auto& [lang, source] : by_language.items()) {
      json entry = source;
      entry["language"] = lang;
      list.push_back(entry);
    }
    return list;
  }
  static json Texts(const json& by_language) {
    json list = json::array();
    for (const auto& [lang, path] : by_language.items())
      list.push_back({{"language", lang}, {"path", path}});
    return list;
  }

  // A tiny model with the byte tokenizer (ids 0..255 are bytes), random weights for `seed`.
  model::CausalLM TinyModel(model::Arch arch, int64_t top_k = 0) {
    json config = model::PresetConfigJson(arch, "tiny").value();
    config["vocab_size"] = 259;
    config["bos_token_id"] = 256;
    config["eos_token_id"] = 257;
    config["pad_token_id"] = 258;
    config["stemma_tokenizer"] = {{"type", "bytes"}};
    if (top_k > 0) config["num_experts_per_tok"] = top_k;
    auto parsed = model::ParseModelConfig(config);
    EXPECT_TRUE(parsed.ok()) << parsed.status();
    return model::InitModel(*parsed, /*seed=*/11).value();
  }

  void Save(model::CausalLM& lm, const fs::path& path) {
    auto status = model::SaveModel(lm, path.string());
    ASSERT_TRUE(status.ok()) << status;
  }

  // Lines of random letters drawn from [first, last], about `chars` in all.
  std::string Letters(char first, char last, int chars, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int> letter(first, last), len(3, 12);
    std::string text;
    while (static_cast<int>(text.size()) < chars) {
      const int n = len(rng);
      for (int i = 0; i < n; ++i) text += static_cast<char>(letter(rng));
      text += '\n';  // lines are tokenized apart: no newline token reaches the model
    }
    return text;
  }

  // Hidden dimension 0 carries the language: +4 in the embedding of the bytes in
  // [plus_first, plus_last], -4 for every other letter.
  static void MarkLanguage(model::CausalLM& lm, char plus_first, char plus_last) {
    torch::NoGradGuard no_grad;
    auto embed = lm->model->embed_tokens->weight;  // [V, H]
    for (int c = 'a'; c <= 'z'; ++c) {
      embed[c][0] = (c >= plus_first && c <= plus_last) ? 4.0f : -4.0f;
    }
  }

  fs::path dir_;
};

TEST_F(AnalyzeCommand, LapeFindsThePlantedNeuronOfEachLanguage) {
  model::CausalLM lm = TinyModel(model::Arch::kLlama);
  MarkLanguage(lm, 'a', 'm');  // "aa" letters a..m: +4, "bb" letters n..z: -4
  {
    torch::NoGradGuard no_grad;
    // Only the planted neurons read dim 0, and they write nothing back, so that no other
    // neuron can tell the languages apart (attention and up_proj would otherwise carry the
    // sign of dim 0 into every neuron's input).
    for (int64_t l = 0; l < 2; ++l) {
      auto* layer = lm->model->layers[l]->as<model::DecoderLayerImpl>();
      for (auto* proj : {&layer->self_attn->q_proj, &layer->self_attn->k_proj,
                         &layer->self_attn->v_proj, &layer->mlp->gate_proj, &layer->mlp->up_proj}) {
        (*proj)->weight.select(1, 0).zero_();
      }
    }
    auto plant = [&](int64_t l, int64_t neuron, float sign) {
      auto* mlp = lm->model->layers[l]->as<model::DecoderLayerImpl>()->mlp.get();
      mlp->gate_proj->weight[neuron].zero_();
      mlp->gate_proj->weight[neuron][0] = sign;
      mlp->down_proj->weight.select(1, neuron).zero_();
    };
    plant(1, 7, 1.0f);   // layer 1, neuron 7: fires where dim 0 > 0, i.e. on "aa"
    plant(0, 3, -1.0f);  // layer 0, neuron 3: fires on "bb"
  }
  Save(lm, dir_ / "model");
  WriteText(dir_ / "aa.txt", Letters('a', 'm', 4000, 1));
  // "bb" as JSONL records, to read that input kind too.
  std::string jsonl;
  std::istringstream lines(Letters('n', 'z', 4000, 2));
  for (std::string line; std::getline(lines, line);) jsonl += json{{"text", line}}.dump() + "\n";
  WriteText(dir_ / "bb.jsonl", jsonl);

  json spec = {
      {"model", (dir_ / "model").string()},
      {"out", (dir_ / "out").string()},
      {"seq_len", 64},
      {"batch_size", 4},
      {"languages", Langs({{"aa", {{"text", (dir_ / "aa.txt").string()}}},
                           {"bb", {{"jsonl", (dir_ / "bb.jsonl").string()}, {"field", "text"}}}})},
      {"lape", {{"top_rate", 0.01}}}};
  RunResult r = Run(spec);
  ASSERT_EQ(r.rc, 0) << r.err;
  std::vector<json> events = Events(r);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.front()["event"], "start");
  EXPECT_EQ(events.back()["event"], "done");
  bool output_event = false;
  for (const auto& e : events) {
    output_event |= e["event"] == "output" && e["name"] == "mask" && e["type"] == "file" &&
                    e["operation"] == "analyze" &&
                    e["path"] == (dir_ / "out" / "neuron_mask.json").string();
  }
  EXPECT_TRUE(output_event);

  json mask = ReadJson(dir_ / "out" / "neuron_mask.json");
  EXPECT_EQ(mask["format"], "stemma.neuron_mask/1");
  EXPECT_EQ(mask["num_layers"], 2);
  EXPECT_EQ(mask["intermediate_size"], 128);
  auto has = [&](const std::string& lang, int layer, int neuron) {
    for (const auto& j : mask["languages"][lang][layer]) {
      if (j == neuron) return true;
    }
    return false;
  };
  EXPECT_TRUE(has("aa", 1, 7)) << mask["languages"].dump();
  EXPECT_FALSE(has("bb", 1, 7)) << mask["languages"].dump();
  EXPECT_TRUE(has("bb", 0, 3)) << mask["languages"].dump();
  EXPECT_FALSE(has("aa", 0, 3)) << mask["languages"].dump();
  // counts agree with the lists, and every list is sorted.
  for (const auto& lang : {"aa", "bb"}) {
    for (int l = 0; l < 2; ++l) {
      const json& list = mask["languages"][lang][l];
      EXPECT_EQ(mask["counts"][lang][l], list.size());
      EXPECT_TRUE(std::is_sorted(list.begin(), list.end()));
    }
  }
  EXPECT_EQ(mask["params"]["num_selected"], 3);  // round(2 · 128 · 0.01)

  // The profile: every neuron's activation probability per language and its entropy.
  const json& profile = mask["profile"];
  ASSERT_EQ(profile["probability"]["aa"].size(), 2u);
  ASSERT_EQ(profile["probability"]["aa"][1].size(), 128u);
  EXPECT_GT(profile["probability"]["aa"][1][7].get<double>(), 0.9);
  EXPECT_EQ(profile["probability"]["bb"][1][7].get<double>(), 0.0);
  EXPECT_EQ(profile["entropy"][1][7].get<double>(), 0.0);
  EXPECT_EQ(profile["tokens"], mask["params"]["tokens"]);

  // The random baseline: the same number of neurons per language and layer.
  json random = ReadJson(dir_ / "out" / "random_mask.json");
  EXPECT_EQ(random["params"]["method"], "random");
  EXPECT_EQ(random["counts"], mask["counts"]);
  bool random_output = false;
  for (const auto& e : events)
    random_output |= e["event"] == "output" && e["name"] == "random_mask";
  EXPECT_TRUE(random_output);

  // Re-selected from the saved profile, without the model: the same neurons; with a larger
  // top_rate, more, the planted ones among them.
  RunResult again = Run({{"out", (dir_ / "out_again").string()},
                         {"lape", {{"profile", (dir_ / "out" / "neuron_mask.json").string()}}}});
  ASSERT_EQ(again.rc, 0) << again.err;
  json same = ReadJson(dir_ / "out_again" / "neuron_mask.json");
  EXPECT_EQ(same["languages"], mask["languages"]);
  EXPECT_EQ(same["params"]["reselected_from"], (dir_ / "out" / "neuron_mask.json").string());
  RunResult wider = Run({{"out", (dir_ / "out_wider").string()},
                         {"lape",
                          {{"profile", (dir_ / "out" / "neuron_mask.json").string()},
                           {"top_rate", 0.05},
                           {"random_mask", false}}}});
  ASSERT_EQ(wider.rc, 0) << wider.err;
  json more = ReadJson(dir_ / "out_wider" / "neuron_mask.json");
  EXPECT_EQ(more["params"]["num_selected"], 13);  // round(256 · 0.05)
  EXPECT_FALSE(fs::exists(dir_ / "out_wider" / "random_mask.json"));
  bool found = false;
  for (const auto& j : more["languages"]["aa"][1]) found |= j == 7;
  EXPECT_TRUE(found) << more["languages"].dump();
}

TEST_F(AnalyzeCommand, RoutingGivesTheRiggedLanguageLowestEntropyAndItsExpertTheLargestGap) {
  model::CausalLM lm = TinyModel(model::Arch::kOlmoe, /*top_k=*/1);
  MarkLanguage(lm, 'a', 'h');  // "aa": a..h at +4; "bb" (i..q) and "cc" (r..z) at -4
  {
    torch::NoGradGuard no_grad;
    for (int64_t l = 0; l < 2; ++l) {
      auto router = lm->model->layers[l]->as<model::DecoderLayerImpl>()->moe->gate->weight;
      router.select(1, 0).zero_();
      router[0][0] = 2.0f;  // expert 0 wins by far on "aa" and is never chosen otherwise
    }
  }
  Save(lm, dir_ / "moe");
  WriteText(dir_ / "aa.txt", Letters('a', 'h', 3000, 3));
  WriteText(dir_ / "bb.txt", Letters('i', 'q', 3000, 4));
  WriteText(dir_ / "cc.txt", Letters('r', 'z', 3000, 5));
  // "cc" as a token dataset (one document per line: the same stream as a text source).
  const std::string tokenize =
      absl::StrCat(STEMMA_ENGINE_BIN, " tokenize --tokenizer ", (dir_ / "moe").string(),
                   " --input ", (dir_ / "cc.txt").string(), " --format text --line-docs",
                   " --language cc --out ", (dir_ / "cc_tokens").string(), " >/dev/null");
  ASSERT_EQ(std::system(tokenize.c_str()), 0) << tokenize;
  json spec = {{"model", (dir_ / "moe").string()},
               {"out", (dir_ / "out").string()},
               {"seq_len", 64},
               {"languages", Langs({{"aa", {{"text", (dir_ / "aa.txt").string()}}},
                                    {"bb", {{"text", (dir_ / "bb.txt").string()}}},
                                    {"cc", {{"dataset", (dir_ / "cc_tokens").string()}}}})},
               {"routing", {{"select", {{"alpha", 0.05}, {"shared_k", {1, 2}}}}}}};
  RunResult r = Run(spec, "STEMMA_CPUS=1 ");
  ASSERT_EQ(r.rc, 0) << r.err;
  const json start = Events(r).front();
  EXPECT_EQ(start["threads"], 1);  // no threads in the spec: the job's CPUs
  EXPECT_EQ(start["select_layers"], "the last two MoE layers of 2");
  json stats = ReadJson(dir_ / "out" / "routing.json");
  ASSERT_EQ(stats["layers"].size(), 2u);
  for (const auto& layer : stats["layers"]) {
    const json& h = layer["entropy"];
    EXPECT_LT(h["aa"].get<double>(), h["bb"].get<double>()) << h.dump();
    EXPECT_LT(h["aa"].get<double>(), h["cc"].get<double>()) << h.dump();
    EXPECT_NEAR(layer["usage"]["aa"][0].get<double>(), 1.0, 1e-12);
    // aa's distribution is disjoint from the others': JSD ln 2.
    EXPECT_NEAR(layer["jsd"][0][1].get<double>(), std::log(2.0), 1e-9);
  }
  // Disjoint letters: no shared token ids between languages.
  EXPECT_EQ(stats["vocab_overlap"][0][1], 0.0);
  EXPECT_EQ(stats["vocab_overlap"][1][1], 1.0);

  json sel = ReadJson(dir_ / "out" / "expert_selection.json");
  for (const std::string layer : {"0", "1"}) {
    const json& gaps = sel["_meta"]["gaps"][layer];
    const double gap0 = gaps["0"]["gap"].get<double>();
    EXPECT_EQ(gaps["0"]["language"], "aa");
    for (const auto& [expert, g] : gaps.items()) {
      if (expert != "0") EXPECT_LT(g["gap"].get<double>(), gap0) << gaps.dump();
    }
    EXPECT_EQ(sel["aa"]["seft"][layer][0], 0) << sel.dump();
    ASSERT_TRUE(sel["shared_experts"]["k2"][layer].is_array());
    EXPECT_EQ(sel["shared_experts"]["k2"][layer].size(), 2u);
    EXPECT_TRUE(sel["aa"]["ssft_k1"][layer].is_array());
  }
  bool entropy_metric = false;
  for (const auto& e : Events(r)) {
    entropy_metric |= e["event"] == "metric" && e["name"] == "routing/entropy";
  }
  EXPECT_TRUE(entropy_metric);

  // One layer by the layer-range convention; aa as the target of the other two (anchors).
  spec["out"] = (dir_ / "out_layer1").string();
  spec["routing"]["select"] = {{"layers", "1:"}, {"targets", {"aa"}}};
  r = Run(spec);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(Events(r).front()["select_layers"],
            "1");  // one layer, written as the convention writes it
  sel = ReadJson(dir_ / "out_layer1" / "expert_selection.json");
  EXPECT_EQ(sel["_meta"]["layers"], json::parse("[1]"));
  EXPECT_EQ(sel["_meta"]["high_resource"], json::parse(R"(["bb", "cc"])"));
  EXPECT_EQ(sel["aa"]["seft"]["1"][0], 0) << sel.dump();  // aa's expert, against bb and cc
  // The model's experts (tiny olmoe) set the defaults.
  const int64_t experts = sel["_meta"]["num_experts"];
  EXPECT_EQ(sel["_meta"]["shared_k"], json(DefaultSharedK(experts)));
  EXPECT_DOUBLE_EQ(sel["_meta"]["alpha"].get<double>(), DefaultAlpha(experts));
}

TEST_F(AnalyzeCommand, HelpListsEveryFieldAndExitsZero) {
  const std::string cmd =
      absl::StrCat(STEMMA_ENGINE_BIN, " analyze --help >", (dir_ / "help").string());
  const int status = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  const std::string text = ReadAll(dir_ / "help");
  for (const char* field : {"usage: stemma-engine analyze", "languages[].dataset", "lape.profile",
                            "lape.exclusive", "routing.select.targets", "drift.mask", "threads"}) {
    EXPECT_NE(text.find(field), std::string::npos) << field;
  }
}

TEST_F(AnalyzeCommand, DriftMeasuresKnownChangesPerModuleAndTheAsymmetry) {
  model::CausalLM lm = TinyModel(model::Arch::kLlama);
  Save(lm, dir_ / "base");
  {
    torch::NoGradGuard no_grad;
    auto* layer = lm->model->layers[1]->as<model::DecoderLayerImpl>();
    layer->mlp->gate_proj->weight.mul_(1.01);  // relative change 0.01
    layer->mlp->up_proj->weight.mul_(1.03);    // 0.03
    layer->mlp->down_proj->weight.mul_(1.2);   // 0.2 -> asymmetry 0.2 / 0.02 = 10
  }
  Save(lm, dir_ / "trained");
  json spec = {
      {"out", (dir_ / "out").string()},
      {"drift", {{"base", (dir_ / "base").string()}, {"trained", (dir_ / "trained").string()}}}};
  RunResult r = Run(spec);
  ASSERT_EQ(r.rc, 0) << r.err;
  json drift = ReadJson(dir_ / "out" / "drift.json");
  ASSERT_EQ(drift["layers"].size(), 2u);
  const json& l0 = drift["layers"][0];
  const json& l1 = drift["layers"][1];
  EXPECT_EQ(l0["all"], 0.0);
  EXPECT_TRUE(l0["asymmetry"].is_null());  // nothing moved: no ratio
  EXPECT_NEAR(l1["modules"]["mlp.gate_proj"].get<double>(), 0.01, 1e-6);
  EXPECT_NEAR(l1["modules"]["mlp.up_proj"].get<double>(), 0.03, 1e-6);
  EXPECT_NEAR(l1["down"].get<double>(), 0.2, 1e-6);
  EXPECT_NEAR(l1["asymmetry"].get<double>(), 10.0, 1e-4);
  EXPECT_EQ(l1["attention"], 0.0);
  EXPECT_EQ(drift["other"]["model.embed_tokens"], 0.0);

  // A sparse change: only neurons 5 and 9 of layer 1 (rows of gate/up, columns of down),
  // each by 10%. Over the whole tensors that is diluted; over the mask it is 0.1 exactly.
  model::CausalLM sparse = TinyModel(model::Arch::kLlama);
  {
    torch::NoGradGuard no_grad;
    auto* mlp = sparse->model->layers[1]->as<model::DecoderLayerImpl>()->mlp.get();
    for (int64_t j : {5, 9}) {
      mlp->gate_proj->weight[j].mul_(1.1);
      mlp->up_proj->weight[j].mul_(1.1);
      mlp->down_proj->weight.select(1, j).mul_(1.1);
    }
  }
  Save(sparse, dir_ / "sparse");
  WriteText(dir_ / "mask.json",
            json{{"format", "stemma.neuron_mask/1"},
                 {"num_layers", 2},
                 {"intermediate_size", 128},
                 {"languages", {{"sw", {json::array(), {5, 9}}}, {"yo", {json::array(), {9}}}}}}
                .dump());
  spec = {{"out", (dir_ / "out_sparse").string()},
          {"drift",
           {{"base", (dir_ / "base").string()},
            {"trained", (dir_ / "sparse").string()},
            {"mask", (dir_ / "mask.json").string()},
            {"mask_languages", {"sw"}}}}};
  r = Run(spec);
  ASSERT_EQ(r.rc, 0) << r.err;
  json sd = ReadJson(dir_ / "out_sparse" / "drift.json");
  const json& masked = sd["layers"][1]["masked"];
  EXPECT_EQ(masked["neurons"], 2);
  for (const char* g : {"gate", "up", "down", "all"})
    EXPECT_NEAR(masked[g].get<double>(), 0.1, 1e-6) << g;
  EXPECT_NEAR(masked["asymmetry"].get<double>(), 1.0, 1e-5);
  EXPECT_LT(sd["layers"][1]["mlp"].get<double>(), 0.05);  // diluted by the 126 untouched neurons
  EXPECT_NEAR(sd["masked_total"].get<double>(), 0.1, 1e-6);
  EXPECT_FALSE(sd["layers"][0].contains("masked"));  // no masked neurons in layer 0

  // A checkpoint of another shape: the error names the tensor.
  json config = model::PresetConfigJson(model::Arch::kLlama, "tiny").value();
  config["intermediate_size"] = 96;
  model::CausalLM other = model::InitModel(model::ParseModelConfig(config).value(), 1).value();
  Save(other, dir_ / "other");
  spec["drift"]["trained"] = (dir_ / "other").string();
  spec["out"] = (dir_ / "out2").string();
  r = Run(spec);
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("stemma-engine: error: drift: tensor lm_head.weight has shape [256, 64]"),
            std::string::npos)
      << r.err;
  EXPECT_FALSE(fs::exists(dir_ / "out2" / "drift.json"));
}

TEST_F(AnalyzeCommand, AlignmentOfIdenticalSentencesIsOne) {
  model::CausalLM lm = TinyModel(model::Arch::kLlama);
  Save(lm, dir_ / "model");
  std::string parallel;
  const std::vector<std::pair<std::string, std::string>> pairs = {
      {"the cat sleeps", "paka analala"},
      {"good morning", "habari za asubuhi"},
      {"water is cold", "maji ni baridi"}};
  for (const auto& [en, sw] : pairs) {
    parallel += json{{"en", en}, {"copy", en}, {"sw", sw}}.dump() + "\n";
  }
  WriteText(dir_ / "parallel.jsonl", parallel);
  json spec = {{"model", (dir_ / "model").string()},
               {"out", (dir_ / "out").string()},
               {"alignment", {{"file", (dir_ / "parallel.jsonl").string()}, {"batch_size", 2}}}};
  RunResult r = Run(spec);
  ASSERT_EQ(r.rc, 0) << r.err;
  json a = ReadJson(dir_ / "out" / "alignment.json");
  EXPECT_EQ(a["languages"], json::parse(R"(["copy", "en", "sw"])"));
  EXPECT_EQ(a["sentences"], 3);
  EXPECT_EQ(a["add_bos"], true);  // the byte tokenizer has a BOS
  ASSERT_EQ(a["pairs"].size(), 3u);
  for (const auto& pair : a["pairs"]) {
    ASSERT_EQ(pair["cosine"].size(), 2u);
    for (const auto& c : pair["cosine"]) {
      if (pair["languages"] == json::parse(R"(["copy", "en"])")) {
        EXPECT_NEAR(c.get<double>(), 1.0, 1e-5);  // same text, same activations
      } else {
        EXPECT_LT(c.get<double>(), 0.9999);
        EXPECT_GT(c.get<double>(), -1.0);
      }
    }
  }

  // The same sentences as line-aligned text files give the same numbers.
  std::string en_text, sw_text;
  for (const auto& [en, sw] : pairs) {
    en_text += en + "\n";
    sw_text += sw + "\n";
  }
  WriteText(dir_ / "en.txt", en_text);
  WriteText(dir_ / "sw.txt", sw_text);
  spec["out"] = (dir_ / "out_texts").string();
  spec["alignment"] = {{"texts", Texts({{"en", (dir_ / "en.txt").string()},
                                        {"copy", (dir_ / "en.txt").string()},
                                        {"sw", (dir_ / "sw.txt").string()}})},
                       {"batch_size", 3}};
  r = Run(spec);
  ASSERT_EQ(r.rc, 0) << r.err;
  json t = ReadJson(dir_ / "out_texts" / "alignment.json");
  ASSERT_EQ(t["pairs"].size(), a["pairs"].size());
  for (size_t p = 0; p < a["pairs"].size(); ++p) {
    EXPECT_EQ(t["pairs"][p]["languages"], a["pairs"][p]["languages"]);
    for (size_t l = 0; l < 2; ++l) {
      EXPECT_NEAR(t["pairs"][p]["cosine"][l].get<double>(),
                  a["pairs"][p]["cosine"][l].get<double>(), 1e-5);
    }
  }

  // Files of different lengths are refused, naming both.
  WriteText(dir_ / "sw.txt", sw_text + "moja zaidi\n");
  spec["out"] = (dir_ / "out_bad").string();
  r = Run(spec);
  EXPECT_EQ(r.rc, 4);  // bad input: kExitBadInput
  EXPECT_NE(r.err.find("has 4 lines but"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir_ / "out_bad"));
}

// The same counting done by transformers with forward hooks (tests/engine/analyze_hf.py) on a
// checkpoint that transformers wrote: the LAPE selection, τ, and every routing count agree.
TEST_F(AnalyzeCommand, MatchesTransformersOnTheSameWindows) {
  if (!HavePython()) GTEST_SKIP() << "no STEMMA_PYTHON";
  const std::string script = absl::StrCat(STEMMA_SOURCE_DIR, "/tests/engine/analyze_hf.py");
  auto python = [&](const std::string& args) {
    const std::string cmd = absl::StrCat(STEMMA_PYTHON, " ", script, " ", args, " >",
                                         (dir_ / "python.log").string(), " 2>&1");
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd << "\n" << ReadAll(dir_ / "python.log");
  };
  WriteText(dir_ / "aa.txt", Letters('a', 'm', 3000, 1));
  WriteText(dir_ / "bb.txt", Letters('e', 'z', 3000, 2));  // overlapping alphabets
  const std::string sources =
      absl::StrCat("aa=", (dir_ / "aa.txt").string(), " bb=", (dir_ / "bb.txt").string());
  const json languages = Langs({{"aa", {{"text", (dir_ / "aa.txt").string()}}},
                                {"bb", {{"text", (dir_ / "bb.txt").string()}}}});

  // Creates dir_/llama and dir_/olmoe and counts with transformers, in one Python process.
  python(absl::StrCat("parity --seq-len 64 --batch 4 --out ", dir_.string(), " ", sources));
  RunResult r = Run({{"model", (dir_ / "llama").string()},
                     {"out", (dir_ / "out_lape").string()},
                     {"seq_len", 64},
                     {"batch_size", 4},
                     {"languages", languages},
                     {"lape", json::object()}});
  ASSERT_EQ(r.rc, 0) << r.err;
  json hf = ReadJson(dir_ / "hf_lape.json");
  json mask = ReadJson(dir_ / "out_lape" / "neuron_mask.json");
  EXPECT_EQ(mask["languages"], hf["languages"]);
  EXPECT_DOUBLE_EQ(mask["params"]["filter_threshold"].get<double>(), hf["tau"].get<double>());
  EXPECT_EQ(mask["params"]["tokens"], hf["tokens"]);

  r = Run({{"model", (dir_ / "olmoe").string()},
           {"out", (dir_ / "out_routing").string()},
           {"seq_len", 64},
           {"batch_size", 4},
           {"languages", languages},
           {"routing", json::object()}});
  ASSERT_EQ(r.rc, 0) << r.err;
  hf = ReadJson(dir_ / "hf_routing.json");
  json stats = ReadJson(dir_ / "out_routing" / "routing.json");
  ASSERT_EQ(stats["layers"].size(), 2u);
  for (const auto& layer : stats["layers"]) {
    const int64_t l = layer["layer"].get<int64_t>();
    for (const std::string lang : {"aa", "bb"}) {
      EXPECT_EQ(layer["counts"][lang], hf["counts"][lang][l]) << lang << " layer " << l;
    }
  }
  EXPECT_GT(stats["vocab_overlap"][0][1].get<double>(), 0.0);  // shared letters e..m
  EXPECT_LT(stats["vocab_overlap"][0][1].get<double>(), 1.0);
}

TEST_F(AnalyzeCommand, BadInputsFailWithAClearErrorAndNoOutput) {
  model::CausalLM dense = TinyModel(model::Arch::kLlama);
  Save(dense, dir_ / "dense");
  model::CausalLM moe = TinyModel(model::Arch::kOlmoe);
  Save(moe, dir_ / "moe");
  WriteText(dir_ / "aa.txt", Letters('a', 'm', 500, 1));
  WriteText(dir_ / "empty.txt", "\n\n");
  WriteText(dir_ / "bb.jsonl", "{\"text\": \"abc\"}\n{\"body\": \"no text field\"}\n");
  const std::string out = (dir_ / "out").string();
  auto languages = [&](const json& second) {
    return Langs(json{{"aa", {{"text", (dir_ / "aa.txt").string()}}}, {"bb", second}});
  };
  struct Case {
    const char* what;
    json spec;
    std::string error;
  };
  const std::vector<Case> cases = {
      {"JSONL record without its field",
       {{"model", (dir_ / "dense").string()},
        {"out", out},
        {"languages", languages({{"jsonl", (dir_ / "bb.jsonl").string()}})},
        {"lape", json::object()}},
       absl::StrCat((dir_ / "bb.jsonl").string(), ":2: field 'text' missing")},
      {"an empty language",
       {{"model", (dir_ / "dense").string()},
        {"out", out},
        {"languages", languages({{"text", (dir_ / "empty.txt").string()}})},
        {"lape", json::object()}},
       "languages.bb: no tokens"},
      {"routing on a dense checkpoint",
       {{"model", (dir_ / "dense").string()},
        {"out", out},
        {"languages", languages({{"text", (dir_ / "aa.txt").string()}})},
        {"routing", json::object()}},
       "routing: " + (dir_ / "dense").string() + " (model_type llama) has no MoE layers"},
      {"LAPE on an MoE checkpoint",
       {{"model", (dir_ / "moe").string()},
        {"out", out},
        {"languages", languages({{"text", (dir_ / "aa.txt").string()}})},
        {"lape", json::object()}},
       "has MoE layers; LAPE profiles the neurons of dense FFN layers"},
      {"a language source without a file",
       {{"model", (dir_ / "dense").string()},
        {"out", out},
        {"languages", languages({{"field", "text"}})},
        {"lape", json::object()}},
       "languages[1]: give exactly one of dataset, text or jsonl for 'bb'"},
      {"an unknown field",
       {{"model", (dir_ / "dense").string()},
        {"out", out},
        {"languages", languages({{"text", (dir_ / "aa.txt").string()}})},
        {"lape", {{"top_rat", 0.1}}}},
       "lape.top_rat: unknown field"},
      {"a missing model",
       {{"model", (dir_ / "nope").string()},
        {"out", out},
        {"languages", languages({{"text", (dir_ / "aa.txt").string()}})},
        {"lape", json::object()}},
       (dir_ / "nope").string()},
      {"a language file that is not there",
       {{"model", (dir_ / "dense").string()},
        {"out", out},
        {"languages", languages({{"text", (dir_ / "missing.txt").string()}})},
        {"lape", json::object()}},
       "languages.bb.text: " + (dir_ / "missing.txt").string() + ": no such file"},
      {"a selection layer range past the model",
       {{"model", (dir_ / "moe").string()},
        {"out", out},
        {"languages", languages({{"text", (dir_ / "aa.txt").string()}})},
        {"routing", {{"select", {{"layers", "1:5"}}}}}},
       "routing.select.layers"},
      {"a parallel line without a language",
       {{"model", (dir_ / "dense").string()},
        {"out", out},
        {"alignment", {{"file", (dir_ / "bb.jsonl").string()}, {"languages", {"text", "x"}}}}},
       absl::StrCat((dir_ / "bb.jsonl").string(), ":1: field 'x' missing")},
  };
  for (const Case& c : cases) {
    RunResult r = Run(c.spec);
    EXPECT_EQ(r.rc, 4) << c.what << " (kExitBadInput: the worker does not retry it)";
    EXPECT_NE(r.err.find("stemma-engine: error: "), std::string::npos) << c.what << ": " << r.err;
    EXPECT_NE(r.err.find(c.error), std::string::npos) << c.what << ": " << r.err;
    for (const auto& e : Events(r)) EXPECT_NE(e["event"], "done") << c.what;
    EXPECT_FALSE(fs::exists(out)) << c.what << ": output written";
  }
}

}  // namespace
}  // namespace stemma::engine::analyze
