// stemma-engine eval over several ranks and on a device: two rank processes (RANK,
// WORLD_SIZE, MASTER_ADDR, MASTER_PORT, as torchrun and the worker start them) give exactly
// the results of one process, rank 0 alone writes them; an unknown device, or CUDA where
// there is none, fails as a bad spec naming `device`.
//
// STEMMA_TEST_DEVICE (tests/gpu/run sets cuda) adds the check that the eval on that device
// equals the CPU's within float tolerance.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "engine/train/rank_processes.h"

namespace stemma::engine::eval {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string Root() {
  static const std::string root = [] {
    auto dir = fs::temp_directory_path() / ("eval_ranks_test_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
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

int Shell(const std::string& command) {
  const int status = std::system(command.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// A tiny random Llama (byte tokenizer), a tokenized text, and files for the three task types.
struct Inputs {
  std::string model, dataset, piqa, pairs;
};

const Inputs& Fixture() {
  static const Inputs inputs = [] {
    Inputs in;
    const std::string engine = STEMMA_ENGINE_BIN;
    in.model = Root() + "/model";
    EXPECT_EQ(Shell(engine + " init --arch llama --preset tiny --seed 5 --out " + in.model +
                    " >/dev/null"),
              0);
    std::string text;
    for (int d = 0; d < 30; ++d) {
      text += "Document " + std::to_string(d) + ": the quick brown fox ";
      for (int k = 0; k < d % 5; ++k) text += "jumps over ";
      text += "the lazy dog.\n\n";
    }
    Write(Root() + "/text/en.txt", text);
    in.dataset = Root() + "/en";
    EXPECT_EQ(Shell(engine + " tokenize --tokenizer " + in.model + " --input " + Root() +
                    "/text/en.txt --format text --language en --out " + in.dataset + " >/dev/null"),
              0);
    std::string piqa, pairs;
    for (int i = 0; i < 7; ++i) {
      piqa += json({{"goal", "How do I open jar " + std::to_string(i) + "?"},
                    {"sol1", "Twist the lid."},
                    {"sol2", "Pour water on the floor " + std::to_string(i) + " times."},
                    {"label", i % 2}})
                  .dump() +
              "\n";
      pairs += json({{"src", "Sentence " + std::to_string(i) + "."},
                     {"tgt", "Речення " + std::to_string(i) + "."}})
                   .dump() +
               "\n";
    }
    in.piqa = Root() + "/piqa.jsonl";
    in.pairs = Root() + "/pairs.jsonl";
    Write(in.piqa, piqa);
    Write(in.pairs, pairs);
    return in;
  }();
  return inputs;
}

// An eval spec with one task of each type; `extra` adds top-level fields.
std::string Spec(const std::string& name, const json& extra = json::object()) {
  const Inputs& in = Fixture();
  json spec = {
      {"model", in.model},
      {"batch_size", 2},
      {"threads", 1},
      {"out", Root() + "/" + name + ".results.json"},
      {"tasks",
       {{{"type", "perplexity"},
         {"language", "en"},
         {"data", in.dataset},
         {"split", "all"},
         {"seq_len", 24}},
        {{"type", "choice"}, {"format", "piqa"}, {"language", "en"}, {"data", in.piqa}, {"k", 1}},
        {{"type", "translation"},
         {"source_language", "en"},
         {"language", "uk"},
         {"data", in.pairs},
         {"k", 1},
         {"max_new_tokens", 6}}}}};
  spec.update(extra);
  const std::string path = Root() + "/" + name + ".json";
  Write(path, spec.dump());
  return path;
}

struct EngineRun {
  int exit_code = -1;
  std::string out, err;
};

// Starts `ranks` engine processes on `spec` and waits for all; returns each rank's run.
std::vector<EngineRun> RunRanks(const std::string& spec, int ranks) {
  const int port = train::FreePort();
  std::string script;
  for (int r = 0; r < ranks; ++r) {
    const std::string base = spec + ".rank" + std::to_string(r);
    script += "(RANK=" + std::to_string(r) + " LOCAL_RANK=" + std::to_string(r) +
              " WORLD_SIZE=" + std::to_string(ranks) +
              " MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(port) +
              " STEMMA_DDP_TIMEOUT_S=120 " + STEMMA_ENGINE_BIN + " eval --spec " + spec + " >" +
              base + ".out 2>" + base + ".err; echo $? >" + base + ".rc) & ";
  }
  Shell("sh -c '" + script + "wait'");
  std::vector<EngineRun> runs(ranks);
  for (int r = 0; r < ranks; ++r) {
    const std::string base = spec + ".rank" + std::to_string(r);
    runs[r].exit_code = std::atoi(Read(base + ".rc").c_str());
    runs[r].out = Read(base + ".out");
    runs[r].err = Read(base + ".err");
  }
  return runs;
}

EngineRun RunOne(const std::string& spec) {
  EngineRun run;
  run.exit_code = Shell(std::string(STEMMA_ENGINE_BIN) + " eval --spec " + spec + " >" + spec +
                        ".out 2>" + spec + ".err");
  run.out = Read(spec + ".out");
  run.err = Read(spec + ".err");
  return run;
}

// What must not depend on how the work was split: every task's per-item values and metrics.
json Essence(const json& results) {
  json essence = json::array();
  for (const auto& task : results["tasks"]) {
    json t = {{"name", task["name"]}, {"metrics", task["metrics"]}};
    for (const char* key : {"nll", "tokens", "bytes", "windows", "docs", "segments"}) {
      if (task.contains(key)) t[key] = task[key];
    }
    essence.push_back(std::move(t));
  }
  return essence;
}

// Max relative difference over every number in two JSON values of one shape.
double MaxRelDiff(const json& a, const json& b) {
  if (a.is_number() && b.is_number()) {
    const double x = a.get<double>(), y = b.get<double>();
    return std::abs(x - y) / std::max(1e-12, std::abs(y));
  }
  double worst = 0;
  if (a.is_structured() && b.is_structured() && a.size() == b.size()) {
    if (a.is_object()) {
      for (auto it = a.begin(); it != a.end(); ++it) {
        worst = std::max(worst, b.contains(it.key()) ? MaxRelDiff(*it, b[it.key()]) : 1e9);
      }
    } else {
      for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, MaxRelDiff(a[i], b[i]));
    }
    return worst;
  }
  return a == b ? 0.0 : 1e9;
}

TEST(EvalRanks, TwoRanksGiveTheSingleProcessResultsExactly) {
  const std::string single = Spec("single");
  const EngineRun one = RunOne(single);
  ASSERT_EQ(one.exit_code, 0) << one.err;
  const json expected = json::parse(Read(Root() + "/single.results.json"));
  EXPECT_EQ(expected["ranks"], 1);

  const std::string split = Spec("split");
  const auto runs = RunRanks(split, 2);
  for (int r = 0; r < 2; ++r)
    ASSERT_EQ(runs[r].exit_code, 0) << "rank " << r << ": " << runs[r].err;
  const json got = json::parse(Read(Root() + "/split.results.json"));
  EXPECT_EQ(got["ranks"], 2);
  EXPECT_EQ(Essence(got), Essence(expected));  // bit for bit: same batches, same order
  EXPECT_EQ(got["metrics"], expected["metrics"]);
  // Rank 0 reports the output; rank 1 computed its share and wrote nothing.
  EXPECT_NE(runs[0].out.find("\"event\":\"output\""), std::string::npos) << runs[0].out;
  EXPECT_EQ(runs[1].out.find("\"event\":\"output\""), std::string::npos) << runs[1].out;
}

TEST(EvalRanks, ThreeRanksTooWithMoreRanksThanSomeTasksHaveBatches) {
  const std::string single = Spec("single3", {{"batch_size", 64}});  // one perplexity batch
  ASSERT_EQ(RunOne(single).exit_code, 0);
  const std::string split = Spec("split3", {{"batch_size", 64}});
  const auto runs = RunRanks(split, 3);
  for (int r = 0; r < 3; ++r)
    ASSERT_EQ(runs[r].exit_code, 0) << "rank " << r << ": " << runs[r].err;
  EXPECT_EQ(Essence(json::parse(Read(Root() + "/split3.results.json"))),
            Essence(json::parse(Read(Root() + "/single3.results.json"))));
}

// A rank's device: an unknown name, or CUDA on a machine or build without it, is a bad spec
// (exit 4, the worker does not retry) naming the field, before any work.
TEST(EvalDevice, BadDeviceIsABadSpecNamingTheField) {
  std::vector<std::pair<std::string, std::string>> cases = {{"tpu", "device: 'tpu'"},
                                                            {"cuda:x", "device: 'cuda:x'"}};
  if (Shell("nvidia-smi >/dev/null 2>&1") != 0) {
    cases.push_back({"cuda", "device: 'cuda' but no CUDA device is visible"});
  }
  for (const auto& [device, expected] : cases) {
    const std::string spec = Spec("bad_device", {{"device", device}});
    fs::remove(Root() + "/bad_device.results.json");
    const EngineRun run = RunOne(spec);
    EXPECT_EQ(run.exit_code, 4) << device << ": " << run.err;
    EXPECT_NE(run.err.find(expected), std::string::npos) << run.err;
    EXPECT_FALSE(fs::exists(Root() + "/bad_device.results.json"));
  }
}

// With STEMMA_TEST_DEVICE (tests/gpu/run: cuda) the eval there equals the CPU's to float
// tolerance; in float32 the log-likelihoods agree to ~1e-5 relative.
TEST(EvalDevice, DeviceEqualsCpu) {
  const char* device = std::getenv("STEMMA_TEST_DEVICE");
  const std::string name = device != nullptr && *device != '\0' ? device : "cpu";
  const EngineRun cpu = RunOne(Spec("on_cpu"));
  ASSERT_EQ(cpu.exit_code, 0) << cpu.err;
  const EngineRun dev = RunOne(Spec("on_device", {{"device", name}}));
  ASSERT_EQ(dev.exit_code, 0) << dev.err;
  const json a = json::parse(Read(Root() + "/on_device.results.json"));
  const json b = json::parse(Read(Root() + "/on_cpu.results.json"));
  EXPECT_EQ(a["device"].get<std::string>().substr(0, name.size()), name);
  json ea = Essence(a), eb = Essence(b);
  for (auto* e : {&ea, &eb}) {  // greedy text (and so chrF) may flip on a near tie
    (*e)[2].erase("segments");
    (*e)[2].erase("metrics");
  }
  const double diff = MaxRelDiff(ea, eb);
  std::printf("eval on %s vs cpu: max relative difference %.3g\n", name.c_str(), diff);
  EXPECT_LT(diff, 1e-4);
}

// `stemma-engine --version` says what the engine can use on a GPU cluster. This build's
// LibTorch (the pinned CUDA wheel) has CUDA and the wheel's nccl.h, so NCCL is compiled in.
TEST(EngineVersion, NamesTorchCudaAndCollectives) {
  const std::string out = Root() + "/version.txt";
  ASSERT_EQ(Shell(std::string(STEMMA_ENGINE_BIN) + " --version >" + out), 0);
  const std::string text = Read(out);
  for (const char* line : {"build: ", "torch: 2.", "cuda: ", "collectives: ring"}) {
    EXPECT_NE(text.find(line), std::string::npos) << line << " in:\n" << text;
  }
  if (text.find("cuda: yes") != std::string::npos) {
    EXPECT_NE(text.find("nccl: yes"), std::string::npos) << text;
  }
}

}  // namespace
}  // namespace stemma::engine::eval
