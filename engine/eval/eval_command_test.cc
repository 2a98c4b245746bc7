// stemma-engine eval end to end on a tiny random Llama with the byte tokenizer: the
// reported perplexity, multiple-choice log-likelihoods and translations equal a direct
// computation from the model's logits, the results name the checkpoint's manifest hash,
// stdout is event lines only, and bad input fails with a clear error and no results file.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "engine/data/dataset.h"
#include "engine/data/loader.h"
#include "engine/eval/chrf.h"
#include "engine/io/sha256.h"
#include "engine/model/checkpoint.h"
#include "engine/model/config.h"
#include "engine/tokenizer/tokenizer.h"

namespace stemma::engine::eval {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr int32_t kBos = 256, kEos = 257;

// Never freed: the exit handler below reads it after static strings are destroyed.
const std::string* g_root = nullptr;

std::string Root() {
  static const std::string root = [] {
    // Named by this process's pid: anything already there was left by an earlier process
    // with the same pid (pids are reused), and a stale model/ makes SaveModel refuse.
    auto dir = fs::temp_directory_path() / ("eval_command_test_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
    g_root = new std::string(dir.string());
    std::atexit([] {
      std::error_code ec;
      fs::remove_all(*g_root, ec);
    });
    return dir.string();
  }();
  return root;
}

void Write(const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path) << text;
}

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct EngineRun {
  int exit_code = -1;
  std::string out, err;
  std::vector<json> events;
};

// `env` is prefixed to the command line ("STEMMA_CPUS=1 ").
EngineRun Engine(const std::string& spec_path, const std::string& env = "",
                 const std::string& args = "") {
  const std::string out = spec_path + ".stdout", err = spec_path + ".stderr";
  const std::string command = env + std::string(STEMMA_ENGINE_BIN) + " eval --spec " + spec_path +
                              args + " >" + out + " 2>" + err;
  EngineRun run;
  const int status = std::system(command.c_str());
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  run.out = Read(out);
  run.err = Read(err);
  std::istringstream lines(run.out);
  for (std::string line; std::getline(lines, line);) {
    run.events.push_back(json::parse(line));  // throws (fails the test) on a non-JSON line
    EXPECT_EQ(line.rfind("{\"event\":", 0), 0u) << line;
  }
  return run;
}

// The tiny model: Llama, byte vocabulary (259 ids), random weights large enough that
// predictions differ between choices.
model::CausalLM& Model() {
  static model::CausalLM lm = [] {
    json config = {{"model_type", "llama"},
                   {"architectures", {"LlamaForCausalLM"}},
                   {"vocab_size", 259},
                   {"hidden_size", 64},
                   {"intermediate_size", 128},
                   {"num_hidden_layers", 2},
                   {"num_attention_heads", 4},
                   {"num_key_value_heads", 2},
                   {"head_dim", 16},
                   {"max_position_embeddings", 512},
                   {"initializer_range", 0.3},
                   {"hidden_act", "silu"},
                   {"rms_norm_eps", 1e-5},
                   {"rope_theta", 10000.0},
                   {"tie_word_embeddings", false},
                   {"torch_dtype", "float32"},
                   {"bos_token_id", kBos},
                   {"eos_token_id", kEos},
                   {"pad_token_id", 258},
                   {"stemma_tokenizer", {{"type", "bytes"}}}};
    auto parsed = model::ParseModelConfig(config);
    EXPECT_TRUE(parsed.ok()) << parsed.status();
    auto lm = model::InitModel(*parsed, 11);
    EXPECT_TRUE(lm.ok()) << lm.status();
    EXPECT_TRUE(model::SaveModel(*lm, Root() + "/model").ok());
    (*lm)->eval();
    return *lm;
  }();
  return lm;
}

std::string ModelDir() {
  Model();
  return Root() + "/model";
}

// Σ log p(ids[i] | ids[<i]) for i in [from, ids.size()), from one full forward pass.
double DirectLogLikelihood(const std::vector<int32_t>& ids, size_t from) {
  torch::NoGradGuard no_grad;
  std::vector<int64_t> wide(ids.begin(), ids.end());
  auto input = torch::tensor(wide).unsqueeze(0);
  auto log_probs = torch::log_softmax(Model()->forward(input).logits[0].to(torch::kFloat64), -1);
  double total = 0;
  for (size_t i = from; i < ids.size(); ++i) total += log_probs[i - 1][ids[i]].item<double>();
  return total;
}

std::vector<int32_t> ByteIds(const std::string& text) {
  std::vector<int32_t> ids;
  for (unsigned char c : text) ids.push_back(c);
  return ids;
}

std::string TokenizedDataset() {
  static const std::string dir = [] {
    std::string text;
    for (int d = 0; d < 40; ++d) {
      text += "Document " + std::to_string(d) + ": the quick brown fox, ";
      for (int k = 0; k < d % 7; ++k) text += "jumps over ";
      text += "the lazy dog. Ще трохи тексту українською.\n\n";
    }
    Write(Root() + "/text/uk.txt", text);
    const std::string out = Root() + "/uk";
    const std::string command = std::string(STEMMA_ENGINE_BIN) + " tokenize --tokenizer " +
                                ModelDir() + " --input " + Root() + "/text/uk.txt --format text" +
                                " --language uk --out " + out + " >/dev/null";
    EXPECT_EQ(std::system(command.c_str()), 0);
    return out;
  }();
  return dir;
}

json Results(const EngineRun& run) {
  for (const auto& e : run.events) {
    if (e["event"] == "output" && e["name"] == "results") return json::parse(Read(e["path"]));
  }
  ADD_FAILURE() << "no results output event; stderr: " << run.err;
  return json();
}

TEST(EvalCommand, PerplexityEqualsDirectComputationOverHeldOutWindows) {
  const std::string spec = Root() + "/ppl.json";
  Write(spec, json({{"model", ModelDir()},
                    {"batch_size", 3},
                    {"tasks",
                     {{{"type", "perplexity"},
                       {"language", "uk"},
                       {"data", TokenizedDataset()},
                       {"heldout_fraction", 0.5},
                       {"split_seed", 3},
                       {"seq_len", 48}}}}})
                  .dump());
  const EngineRun run = Engine(spec);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const json results = Results(run);

  // Independent: held-out documents, EOS after each, windows [BOS] + 47 tokens.
  auto dataset = data::Dataset::Open(TokenizedDataset());
  ASSERT_TRUE(dataset.ok());
  std::vector<int32_t> stream;
  int64_t bytes = 0, documents = 0;
  for (int64_t d = 0; d < (*dataset)->num_documents(); ++d) {
    const auto doc = (*dataset)->Document(d);
    if (!data::IsHeldOut(doc, 0.5, 3)) continue;
    ++documents;
    bytes += static_cast<int64_t>(doc.size());  // byte tokenizer: one token per byte
    stream.insert(stream.end(), doc.begin(), doc.end());
    stream.push_back(kEos);
  }
  ASSERT_GT(documents, 5);
  ASSERT_LT(documents, 35);
  double nll = 0;
  for (size_t begin = 0; begin < stream.size(); begin += 47) {
    std::vector<int32_t> window = {kBos};
    window.insert(window.end(), stream.begin() + begin,
                  stream.begin() + std::min(stream.size(), begin + 47));
    nll -= DirectLogLikelihood(window, 1);
  }
  const json& task = results["tasks"][0];
  EXPECT_EQ(task["documents"], documents);
  EXPECT_EQ(task["tokens"], static_cast<int64_t>(stream.size()));
  EXPECT_EQ(task["bytes"], bytes);
  EXPECT_NEAR(task["nll"].get<double>() / nll, 1.0, 1e-6);
  const double ppl = std::exp(nll / stream.size());
  EXPECT_NEAR(results["metrics"]["ppl/uk"].get<double>(), ppl, ppl * 1e-6);
  EXPECT_NEAR(results["metrics"]["bpb/uk"].get<double>(), nll / std::log(2.0) / bytes, 1e-6);

  // Named checkpoint, metric events, output and done.
  EXPECT_EQ(results["checkpoint"]["sha256"], *io::Sha256File(ModelDir() + "/stemma.json"));
  EXPECT_EQ(results["checkpoint"]["hash_of"], "stemma.json");
  bool metric_seen = false;
  for (const auto& e : run.events) {
    if (e["event"] == "metric" && e["name"] == "ppl/uk") {
      metric_seen = true;
      EXPECT_DOUBLE_EQ(e["value"].get<double>(), results["metrics"]["ppl/uk"].get<double>());
    }
  }
  EXPECT_TRUE(metric_seen);
  EXPECT_EQ(run.events.front()["event"], "start");
  EXPECT_EQ(run.events.back()["event"], "done");
  EXPECT_EQ(fs::path(spec).parent_path() / "ppl.results.json",
            fs::path(run.events[run.events.size() - 2]["path"].get<std::string>()));
}

// The training loader's `last` split: the last ceil(fraction·N) documents, in file order.
TEST(EvalCommand, HeldOutByPositionIsTheEndOfTheDataset) {
  const std::string spec = Root() + "/ppl_last.yaml";
  Write(spec, "model: " + ModelDir() +
                  "\ntasks: [{type: perplexity, language: uk, data: " + TokenizedDataset() +
                  ", heldout_fraction: 0.25, heldout_split: last, seq_len: 64}]\n");
  const EngineRun run = Engine(spec);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const json task = Results(run)["tasks"][0];
  auto dataset = data::Dataset::Open(TokenizedDataset());
  ASSERT_TRUE(dataset.ok());
  const int64_t n = (*dataset)->num_documents();
  const int64_t held = (n + 3) / 4;  // ceil(0.25 · n)
  int64_t tokens = 0;
  for (int64_t d = n - held; d < n; ++d)
    tokens += static_cast<int64_t>((*dataset)->Document(d).size()) + 1;  // + EOS
  EXPECT_EQ(task["documents"], held);
  EXPECT_EQ(task["tokens"], tokens);
  EXPECT_EQ(task["heldout_split"], "last");
}

// The same held-out windows through transformers (eager, fp32): tests/bench/eval_hf.py
// re-implements the split and the windows in Python.
TEST(EvalCommand, PerplexityAgreesWithTransformers) {
  const std::string spec = Root() + "/ppl_hf.json";
  Write(spec, json({{"model", ModelDir()},
                    {"batch_size", 3},
                    {"tasks",
                     {{{"type", "perplexity"},
                       {"language", "uk"},
                       {"data", TokenizedDataset()},
                       {"heldout_fraction", 0.5},
                       {"split_seed", 3},
                       {"seq_len", 48}}}}})
                  .dump());
  const EngineRun run = Engine(spec);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const json task = Results(run)["tasks"][0];
  const std::string out = Root() + "/hf_ppl.json";
  const std::string command = std::string(STEMMA_PYTHON) + " " + STEMMA_SOURCE_DIR +
                              "/tests/bench/eval_hf.py ppl --model " + ModelDir() + " --data " +
                              TokenizedDataset() + " --fraction 0.5 --split-seed 3 --seq-len 48" +
                              " --batch-size 3 --threads 1 --attn eager >" + out + " 2>/dev/null";
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  const json hf = json::parse(Read(out));
  EXPECT_EQ(task["tokens"], hf["tokens"]);
  EXPECT_NEAR(task["nll"].get<double>() / hf["nll"].get<double>(), 1.0, 1e-5);
  EXPECT_NEAR(task["metrics"]["ppl"].get<double>() / hf["ppl"].get<double>(), 1.0, 1e-5);
}

std::string BelebeleLine(const std::string& passage, const std::string& question,
                         const std::vector<std::string>& answers, const std::string& correct) {
  return json({{"flores_passage", passage},
               {"question", question},
               {"mc_answer1", answers[0]},
               {"mc_answer2", answers[1]},
               {"mc_answer3", answers[2]},
               {"mc_answer4", answers[3]},
               {"correct_answer_num", correct}})
             .dump() +
         "\n";
}

std::string BelebeleText(const json& doc) {
  std::string q = doc["question"];
  while (!q.empty() && q.back() == ' ') q.pop_back();
  return "P: " + doc["flores_passage"].get<std::string>() + "\nQ: " + q +
         "\nA: " + doc["mc_answer1"].get<std::string>() +
         "\nB: " + doc["mc_answer2"].get<std::string>() +
         "\nC: " + doc["mc_answer3"].get<std::string>() +
         "\nD: " + doc["mc_answer4"].get<std::string>() + "\nAnswer:";
}

TEST(EvalCommand, BelebeleTwoShotLogLikelihoodsEqualDirectComputation) {
  std::string lines;
  const std::vector<std::string> answers = {"a cat", "a dog", "a bird", "a fish"};
  for (int i = 0; i < 5; ++i) {
    lines += BelebeleLine("Passage number " + std::to_string(i) + " about animals.",
                          "Which animal? ", answers, std::to_string(1 + i % 4));
  }
  Write(Root() + "/belebele.jsonl", lines);
  const std::string spec = Root() + "/belebele.yaml";
  Write(spec, "model: " + ModelDir() +
                  "\ntasks:\n  - {type: choice, format: belebele, "
                  "language: uk, data: belebele.jsonl, k: 2}\n");
  const EngineRun run = Engine(spec);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const json results = Results(run);
  std::vector<json> docs;
  std::istringstream in(lines);
  for (std::string line; std::getline(in, line);) docs.push_back(json::parse(line));
  const json& reported = results["tasks"][0]["docs"];
  double correct = 0;
  for (int d = 0; d < 5; ++d) {
    // first_n: docs 0 and 1, or the next ones when evaluating one of them.
    std::vector<int> shots;
    for (int s = 0; s < 5 && shots.size() < 2; ++s) {
      if (s != d) shots.push_back(s);
    }
    std::string context;
    for (int s : shots) {
      const char letter = "ABCD"[std::stoi(docs[s]["correct_answer_num"].get<std::string>()) - 1];
      context += BelebeleText(docs[s]) + " " + letter + "\n\n";
    }
    context += BelebeleText(docs[d]);
    std::vector<int32_t> ctx = {kBos};
    for (int32_t id : ByteIds(context)) ctx.push_back(id);
    std::vector<double> lls;
    for (const char* letter : {" A", " B", " C", " D"}) {
      std::vector<int32_t> ids = ctx;
      for (int32_t id : ByteIds(letter)) ids.push_back(id);
      lls.push_back(DirectLogLikelihood(ids, ctx.size()));
      EXPECT_NEAR(reported[d]["log_likelihoods"][lls.size() - 1].get<double>(), lls.back(), 1e-4)
          << "doc " << d << " choice" << letter;
    }
    const auto best = std::max_element(lls.begin(), lls.end()) - lls.begin();
    correct += best == std::stoi(docs[d]["correct_answer_num"].get<std::string>()) - 1;
  }
  EXPECT_DOUBLE_EQ(results["metrics"]["acc/belebele_uk"].get<double>(), correct / 5);
  // Single-letter choices: acc_norm equals acc, as in lm-eval.
  EXPECT_DOUBLE_EQ(results["metrics"]["acc_norm/belebele_uk"].get<double>(), correct / 5);
}

TEST(EvalCommand, PiqaAccNormDividesByCharactersAndAccBytesByBytes) {
  // Choices whose character and byte lengths rank differently (Cyrillic is 2 bytes/char).
  std::string lines;
  const std::vector<std::pair<std::string, std::string>> sols = {
      {"use a spoon", "використати ложку"}, {"пити воду", "drink some water now"},
      {"open the lid slowly", "так"},       {"ні", "heat the pan first"},
      {"stir it well", "перемішати добре"}, {"ok", "добре зроблено"}};
  for (size_t i = 0; i < sols.size(); ++i) {
    lines += json({{"goal", "How to do task " + std::to_string(i) + "?"},
                   {"sol1", sols[i].first},
                   {"sol2", sols[i].second},
                   {"label", static_cast<int>(i % 2)}})
                 .dump() +
             "\n";
  }
  Write(Root() + "/piqa.jsonl", lines);
  const std::string spec = Root() + "/piqa.json";
  Write(spec, json({{"model", ModelDir()},
                    {"tasks",
                     {{{"type", "choice"},
                       {"format", "piqa"},
                       {"language", "uk"},
                       {"data", "piqa.jsonl"},
                       {"k", 0}}}}})
                  .dump());
  const EngineRun run = Engine(spec);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const json results = Results(run);
  double acc = 0, acc_norm = 0, acc_bytes = 0;
  auto chars = [](const std::string& s) {
    return static_cast<double>(
        std::count_if(s.begin(), s.end(), [](char c) { return (c & 0xc0) != 0x80; }));
  };
  for (size_t i = 0; i < sols.size(); ++i) {
    std::vector<int32_t> ctx = {kBos};
    for (int32_t id : ByteIds("Question: How to do task " + std::to_string(i) + "?\nAnswer:")) {
      ctx.push_back(id);
    }
    double ll[2];
    const std::string choice[2] = {sols[i].first, sols[i].second};
    for (int c = 0; c < 2; ++c) {
      std::vector<int32_t> ids = ctx;
      for (int32_t id : ByteIds(" " + choice[c])) ids.push_back(id);
      ll[c] = DirectLogLikelihood(ids, ctx.size());
      EXPECT_NEAR(results["tasks"][0]["docs"][i]["log_likelihoods"][c].get<double>(), ll[c], 1e-4);
    }
    const int gold = static_cast<int>(i % 2);
    acc += (ll[1] > ll[0] ? 1 : 0) == gold;
    acc_norm += (ll[1] / chars(choice[1]) > ll[0] / chars(choice[0]) ? 1 : 0) == gold;
    acc_bytes += (ll[1] / choice[1].size() > ll[0] / choice[0].size() ? 1 : 0) == gold;
  }
  const double n = static_cast<double>(sols.size());
  EXPECT_DOUBLE_EQ(results["metrics"]["acc/piqa_uk"].get<double>(), acc / n);
  EXPECT_DOUBLE_EQ(results["metrics"]["acc_norm/piqa_uk"].get<double>(), acc_norm / n);
  EXPECT_DOUBLE_EQ(results["metrics"]["acc_bytes/piqa_uk"].get<double>(), acc_bytes / n);
}

TEST(EvalCommand, TranslationIsGreedyUntilNewlineAndScoredWithCorpusChrf) {
  std::string lines;
  const std::vector<std::pair<std::string, std::string>> pairs = {
      {"Good morning.", "Доброго ранку."},
      {"Thank you.", "Дякую."},
      {"The cat sleeps.", "Кіт спить."},
      {"I like tea.", "Я люблю чай."}};
  for (const auto& [src, tgt] : pairs) lines += json({{"src", src}, {"tgt", tgt}}).dump() + "\n";
  Write(Root() + "/flores.jsonl", lines);
  const std::string spec = Root() + "/flores.json";
  Write(spec, json({{"model", ModelDir()},
                    {"tasks",
                     {{{"type", "translation"},
                       {"source_language", "en"},
                       {"language", "uk"},
                       {"source_name", "English"},
                       {"target_name", "Ukrainian"},
                       {"data", "flores.jsonl"},
                       {"k", 1},
                       {"sampler", "first_n"},
                       {"max_new_tokens", 24}}}}})
                  .dump());
  const EngineRun run = Engine(spec);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const json results = Results(run);
  const json& segments = results["tasks"][0]["segments"];
  std::vector<std::string> hyps, refs;
  auto tokenizer = tokenizer::Tokenizer::Load(ModelDir());
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  for (size_t d = 0; d < pairs.size(); ++d) {
    const auto& shot = pairs[d == 0 ? 1 : 0];
    const std::string prompt = "English: " + shot.first + "\nUkrainian: " + shot.second +
                               "\n\nEnglish: " + pairs[d].first + "\nUkrainian:";
    std::vector<int64_t> ids = {kBos};
    for (int32_t id : ByteIds(prompt)) ids.push_back(id);
    const auto out = model::GreedyGenerate(Model(), torch::tensor(ids).unsqueeze(0), 24);
    // The generated ids up to EOS, decoded by the byte tokenizer (invalid UTF-8 -> U+FFFD).
    std::vector<int32_t> generated;
    for (int64_t i = static_cast<int64_t>(ids.size()); i < out.size(1); ++i) {
      const int64_t id = out[0][i].item<int64_t>();
      if (id == kEos) break;
      if (id < 256) generated.push_back(static_cast<int32_t>(id));
    }
    const std::string text = (*tokenizer)->Decode(generated);
    // The stop rule: first newline after leading whitespace, then strip.
    const size_t start = text.find_first_not_of(" \t\r\n");
    std::string hyp = start == std::string::npos ? "" : text.substr(start);
    hyp = hyp.substr(0, hyp.find('\n'));
    const char* kAsciiPythonSpace = " \t\n\r\v\f\x1c\x1d\x1e\x1f";
    hyp.erase(0, std::min(hyp.size(), hyp.find_first_not_of(kAsciiPythonSpace)));
    hyp.erase(hyp.find_last_not_of(kAsciiPythonSpace) + 1);
    EXPECT_EQ(segments[d]["hypothesis"].get<std::string>(), hyp) << "pair " << d;
  }
  for (const auto& s : segments) {
    hyps.push_back(s["hypothesis"]);
    refs.push_back(s["reference"]);
  }
  EXPECT_DOUBLE_EQ(results["metrics"]["chrf/en-uk"].get<double>(), CorpusChrf(hyps, refs, {}));
  EXPECT_DOUBLE_EQ(results["metrics"]["chrf++/en-uk"].get<double>(),
                   CorpusChrf(hyps, refs, ChrfPlusPlusOptions()));
}

// Progress counts forward passes exactly: with 3 windows per batch and a short last window
// (its own pass), the step never passes total_steps and the fraction never passes 1.
TEST(EvalCommand, ProgressNeverOvershoots) {
  for (int batch : {1, 2, 3, 4}) {
    const std::string spec = Root() + "/progress" + std::to_string(batch) + ".json";
    Write(spec, json({{"model", ModelDir()},
                      {"batch_size", batch},
                      {"tasks",
                       {{{"type", "perplexity"},
                         {"language", "uk"},
                         {"data", TokenizedDataset()},
                         {"split", "all"},
                         {"seq_len", 40}}}}})
                    .dump());
    const EngineRun run = Engine(spec);
    ASSERT_EQ(run.exit_code, 0) << run.err;
    int64_t last = 0, total = 0;
    for (const auto& e : run.events) {
      if (e["event"] != "progress") continue;
      total = e["total_steps"];
      EXPECT_LE(e["step"].get<int64_t>(), total) << e.dump();
      EXPECT_LE(e["fraction"].get<double>(), 1.0) << e.dump();
      EXPECT_GT(e["step"].get<int64_t>(), last) << e.dump();
      last = e["step"];
    }
    EXPECT_GT(total, 0);
    EXPECT_EQ(last, total) << "batch " << batch << ": the last progress event is the last pass";
  }
}

// A checkpoint whose stemma.json says a train run with data.seq_len 40 made it: eval's
// perplexity windows default to 40 tokens, and the start event says so.
TEST(EvalCommand, SequenceLengthDefaultsToTheTrainingRuns) {
  const std::string trained = Root() + "/trained";
  fs::remove_all(trained);
  fs::copy(ModelDir(), trained, fs::copy_options::recursive);
  json manifest = json::parse(Read(trained + "/stemma.json"));
  manifest["producer"] = {{"command", "train"},
                          {"job", ""},
                          {"attempt", ""},
                          {"params", {{"spec", {{"data", {{"seq_len", "40"}}}}}}}};
  std::ofstream(trained + "/stemma.json") << manifest.dump(2);
  const std::string spec = Root() + "/trained_ppl.yaml";
  Write(spec, "model: " + trained + "\ntasks: [{type: perplexity, language: uk, data: " +
                  TokenizedDataset() + ", split: all}]\n");
  const EngineRun run = Engine(spec, "STEMMA_CPUS=1 ");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const json& start = run.events.front();
  ASSERT_EQ(start["event"], "start");
  EXPECT_EQ(start["tasks"][0]["seq_len"], 40);
  EXPECT_EQ(start["tasks"][0]["seq_len_source"], "training run (" + trained + ")");
  // threads: none in the spec, so the job's CPUs.
  EXPECT_EQ(start["threads"], 1);
  EXPECT_EQ(start["threads_source"], "job cpus (STEMMA_CPUS)");
  const json task = Results(run)["tasks"][0];
  EXPECT_EQ(task["seq_len"], 40);
  // Windows of [BOS] + 39 tokens: ceil(tokens / 39) of them.
  EXPECT_EQ(task["windows"].get<int64_t>(), (task["tokens"].get<int64_t>() + 38) / 39);

  // The same checkpoint without the training record: the model maximum (512 here).
  const EngineRun hub = Engine(spec, "", " --model " + ModelDir());
  ASSERT_EQ(hub.exit_code, 0) << hub.err;
  EXPECT_EQ(hub.events.front()["tasks"][0]["seq_len"], 512);
  EXPECT_NE(
      hub.events.front()["tasks"][0]["seq_len_source"].get<std::string>().find("model maximum"),
      std::string::npos);
}

TEST(EvalCommand, HelpListsEveryFieldAndExitsZero) {
  const std::string out = Root() + "/help.txt";
  const int status = std::system((std::string(STEMMA_ENGINE_BIN) + " eval --help >" + out).c_str());
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  const std::string text = Read(out);
  for (const char* field : {"usage: stemma-engine eval", "model", "tasks[].heldout_fraction",
                            "tasks[].seq_len", "threads", "docs/engine/eval.md"}) {
    EXPECT_NE(text.find(field), std::string::npos) << field << " in:\n" << text;
  }
}

struct BadCase {
  std::string name, spec, file, file_text, expected;
};
void PrintTo(const BadCase& c, std::ostream* os) { *os << c.name; }

class EvalBadInput : public ::testing::TestWithParam<BadCase> {};

TEST_P(EvalBadInput, FailsNamingTheCauseAndWritesNoResults) {
  const BadCase& c = GetParam();
  const std::string dir = Root() + "/bad_" + c.name;
  fs::create_directories(dir);
  if (!c.file.empty()) Write(dir + "/" + c.file, c.file_text);
  std::string spec_text = c.spec;
  for (size_t p; (p = spec_text.find("$MODEL")) != std::string::npos;) {
    spec_text.replace(p, 6, ModelDir());
  }
  for (size_t p; (p = spec_text.find("$DATA")) != std::string::npos;) {
    spec_text.replace(p, 5, TokenizedDataset());
  }
  Write(dir + "/eval.yaml", spec_text);
  const EngineRun run = Engine(dir + "/eval.yaml");
  EXPECT_EQ(run.exit_code, 4);  // kExitBadInput: the worker does not retry it
  EXPECT_NE(run.err.find("stemma-engine: error: "), std::string::npos) << run.err;
  EXPECT_NE(run.err.find(c.expected), std::string::npos) << run.err;
  EXPECT_FALSE(fs::exists(dir + "/eval.results.json"));
}

INSTANTIATE_TEST_SUITE_P(
    Cases, EvalBadInput,
    ::testing::Values(
        BadCase{"missing_field",
                "model: $MODEL\ntasks: [{type: choice, format: belebele, language: uk, data: "
                "b.jsonl}]\n",
                "b.jsonl",
                "{\"flores_passage\": \"p\", \"question\": \"q\", \"mc_answer1\": \"a\"}\n",
                "b.jsonl:1: field 'mc_answer2' missing"},
        BadCase{
            "piqa_label",
            "model: $MODEL\ntasks: [{type: choice, format: piqa, language: uk, data: p.jsonl}]\n",
            "p.jsonl", "{\"goal\": \"g\", \"sol1\": \"a\", \"sol2\": \"b\", \"label\": 2}\n",
            "p.jsonl:1: field 'label' is 2, outside 0..1"},
        BadCase{"empty_language",
                "model: $MODEL\ntasks: [{type: translation, source_language: en, language: sw, "
                "data: t.jsonl}]\n",
                "t.jsonl", "\n", "t.jsonl: no sentence pairs"},
        BadCase{"empty_target",
                "model: $MODEL\ntasks: [{type: translation, source_language: en, language: sw, "
                "data: t.jsonl}]\n",
                "t.jsonl", "{\"src\": \"hi\", \"tgt\": \" \"}\n",
                "t.jsonl:1: field 'tgt' is empty"},
        BadCase{"empty_heldout",
                "model: $MODEL\ntasks: [{type: perplexity, language: uk, data: $DATA, "
                "heldout_fraction: 0.0000001}]\n",
                "", "", "no tokens to evaluate in the held-out split"},
        BadCase{"missing_language",
                "model: $MODEL\ntasks: [{type: perplexity, data: $DATA, split: all}]\n", "", "",
                "tasks[0].language: is required"},
        BadCase{"unknown_key",
                "model: $MODEL\ntasks: [{type: choice, format: piqa, language: uk, data: x, shots: "
                "2}]\n",
                "", "", "tasks[0].shots: unknown field"},
        BadCase{"k_too_large",
                "model: $MODEL\ntasks: [{type: choice, format: piqa, language: uk, data: p.jsonl, "
                "k: 3}]\n",
                "p.jsonl", "{\"goal\": \"g\", \"sol1\": \"a\", \"sol2\": \"b\", \"label\": 1}\n",
                "k is 3 but the few-shot pool"},
        BadCase{
            "no_dataset",
            "model: $MODEL\ntasks: [{type: perplexity, language: uk, data: nowhere, split: all}]\n",
            "", "", "nowhere"},
        BadCase{
            "not_a_model",
            "model: nomodel\ntasks: [{type: perplexity, language: uk, data: $DATA, split: all}]\n",
            "nomodel/readme", "x", "has no readable config.json"},
        BadCase{"seq_len_past_the_model",
                "model: $MODEL\ntasks: [{type: perplexity, language: uk, data: $DATA, split: all, "
                "seq_len: 513}]\n",
                "", "", "seq_len 513 exceeds the model's max_position_embeddings 512"},
        BadCase{"field_of_another_type",
                "model: $MODEL\ntasks: [{type: perplexity, language: uk, data: $DATA, split: all, "
                "format: piqa}]\n",
                "", "", "line 2: tasks[0].format: does not apply to a perplexity task"}),
    [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace stemma::engine::eval
