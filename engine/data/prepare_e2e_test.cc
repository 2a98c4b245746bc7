// End to end on this machine's real text: `stemma-engine prepare` over /usr/share/locale with
// configs/corpus/languages.yaml, then `stemma-engine eval` of a tiny `init` model on one
// translation_choice suite, one continuation suite, the general suite and the translation
// pairs: eval reads the corpus's layouts and names each suite with its version and the
// corpus's content hash. Skipped (with the reason) when the catalogues are not installed.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct EngineRun {
  int exit_code = -1;
  std::string out, err;
};

EngineRun Engine(const std::string& args, const std::string& dir, const std::string& name) {
  const std::string out = dir + "/" + name + ".stdout", err = dir + "/" + name + ".stderr";
  const std::string command = absl::StrCat(STEMMA_ENGINE_BIN, " ", args, " >", out, " 2>", err);
  const int status = std::system(command.c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, Read(out), Read(err)};
}

TEST(PrepareEndToEnd, RealCataloguesToSuitesThatEvalReads) {
  const fs::path dir =
      fs::temp_directory_path() / ("stemma_prepare_e2e_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string corpus = (dir / "corpus").string();
  const std::string spec = std::string(STEMMA_SOURCE_DIR) + "/configs/corpus/languages.yaml";
  EngineRun prepare =
      Engine(absl::StrCat("prepare --spec ", spec, " --out ", corpus), dir.string(), "prepare");
  if (prepare.exit_code == 4 &&
      prepare.err.find("LC_MESSAGES: no such directory") != std::string::npos) {
    fs::remove_all(dir);
    GTEST_SKIP()
        << "this machine lacks gettext catalogues that configs/corpus/languages.yaml reads "
           "(scripts/setup --engine installs them): "
        << prepare.err;
  }
  ASSERT_EQ(prepare.exit_code, 0) << prepare.err;
  const Json manifest = Json::parse(Read(corpus + "/manifest.json"));
  EXPECT_EQ(manifest["format"], "stemma.corpus/1");
  // Every language has text; every held-in one trains, every held-out one does not.
  for (const auto& l : manifest["languages"]) {
    const std::string code = l["code"];
    EXPECT_GT(fs::file_size(corpus + "/heldout/" + code + ".txt"), 0u) << code;
    EXPECT_EQ(fs::exists(corpus + "/train/" + code + ".txt"), l["role"] != "held_out") << code;
  }
  // The output event names the corpus and its manifest hash.
  bool output = false;
  std::istringstream lines(prepare.out);
  for (std::string line; std::getline(lines, line);) {
    const Json event = Json::parse(line);
    if (event["event"] != "output") continue;
    output = true;
    EXPECT_EQ(event["type"], "corpus");
    EXPECT_EQ(event["name"], "corpus");
    EXPECT_EQ(event["path"], corpus);
    EXPECT_EQ(event["manifest_sha256"].get<std::string>().size(), 64u);
  }
  EXPECT_TRUE(output);

  const std::string model = (dir / "model").string();
  EngineRun init = Engine(absl::StrCat("init --arch llama --preset tiny --seed 1 --out ", model),
                          dir.string(), "init");
  ASSERT_EQ(init.exit_code, 0) << init.err;
  const std::string results = (dir / "results.json").string();
  const std::string eval_spec = (dir / "eval.yaml").string();
  std::ofstream(eval_spec)
      << "model: " << model << "\nout: " << results << "\ntasks:\n"
      << "  - {type: choice, format: belebele, language: uk, limit: 4, k: 1, data: " << corpus
      << "/suites/translation_choice_uk.jsonl}\n"
      << "  - {type: choice, format: global_piqa, language: de, limit: 4, data: " << corpus
      << "/suites/continuation_de.jsonl}\n"
      << "  - {type: choice, format: global_piqa, language: en, limit: 4, data: " << corpus
      << "/suites/general_en.jsonl}\n"
      << "  - {type: translation, source_language: en, language: uk, limit: 2, max_new_tokens: 4, "
         "data: "
      << corpus << "/pairs/en-uk.jsonl}\n";
  EngineRun eval = Engine("eval --spec " + eval_spec, dir.string(), "eval");
  ASSERT_EQ(eval.exit_code, 0) << eval.err;
  const Json r = Json::parse(Read(results));
  ASSERT_EQ(r["tasks"].size(), 4u);
  const std::vector<std::pair<std::string, std::string>> want = {
      {"translation_choice_uk", "translation_choice@1"},
      {"continuation_de", "continuation@1"},
      {"general_en", "general@1"},
      {"pairs_en-uk", "pairs@1"}};
  for (size_t i = 0; i < want.size(); ++i) {
    const Json& task = r["tasks"][i];
    ASSERT_TRUE(task.contains("suite")) << task.dump();
    EXPECT_EQ(task["suite"]["name"], want[i].first);
    EXPECT_EQ(task["suite"]["version"], want[i].second);
    EXPECT_EQ(task["suite"]["corpus_content_hash"], manifest["content_hash"]);
    EXPECT_EQ(task["examples"], i < 3 ? 4 : 2);
  }
  const double acc = r["tasks"][0]["metrics"]["acc"];
  EXPECT_TRUE(acc >= 0 && acc <= 1);
  EXPECT_TRUE(r["tasks"][3]["metrics"].contains("chrf"));
  EXPECT_EQ(r["checkpoint"]["sha256"].get<std::string>().size(), 64u)
      << "the checkpoint's manifest hash stays";
  // Metric events carry the suite too (names unchanged: acc/<task>).
  int named = 0;
  std::istringstream events(eval.out);
  for (std::string line; std::getline(events, line);) {
    const Json event = Json::parse(line);
    if (event["event"] == "metric" && event.contains("suite")) {
      ++named;
      EXPECT_EQ(event["name"].get<std::string>().find('/') != std::string::npos, true);
    }
  }
  EXPECT_EQ(named, 3 * 3 + 2);  // acc, acc_norm, acc_bytes per choice task; chrf, chrf++
  fs::remove_all(dir);
}

}  // namespace
