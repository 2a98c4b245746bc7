// `stemma-engine init` as a researcher sizes a model (issue 16 point 1): every size as a flag,
// --help, the presets' table in docs/engine/init.md equal to the code, and `tokenize --help`.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "engine/model/config.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace stemma::engine {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string ReadText(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class InitTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / absl::StrCat("stemma_init_test_", getpid());
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }

  // Runs `stemma-engine <args>`; returns the exit code, stdout and stderr in out/err.
  int Engine(const std::string& args, std::string* out = nullptr, std::string* err = nullptr) {
    const fs::path o = root_ / "stdout", e = root_ / "stderr";
    const int status = std::system(
        absl::StrCat(STEMMA_ENGINE_BIN, " ", args, " > ", o.string(), " 2> ", e.string()).c_str());
    if (out != nullptr) *out = ReadText(o);
    if (err != nullptr) *err = ReadText(e);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

  fs::path root_;
};

TEST_F(InitTest, EverySizeIsAFlag) {
  const fs::path out = root_ / "sized";
  std::string stdout_text, stderr_text;
  ASSERT_EQ(
      Engine(absl::StrCat("init --arch llama --preset small --hidden-size 96 --num-layers 3 "
                          "--num-heads 6 --num-kv-heads 2 --intermediate-size 200 --tie-embeddings "
                          "--max-position-embeddings 1024 --vocab-size 300 --seed 5 --out ",
                          out.string()),
             &stdout_text, &stderr_text),
      0)
      << stderr_text;
  json config = json::parse(ReadText(out / "config.json"));
  EXPECT_EQ(config["hidden_size"], 96);
  EXPECT_EQ(config["num_hidden_layers"], 3);
  EXPECT_EQ(config["num_attention_heads"], 6);
  EXPECT_EQ(config["num_key_value_heads"], 2);
  EXPECT_EQ(config["head_dim"], 16);  // 96 / 6
  EXPECT_EQ(config["intermediate_size"], 200);
  EXPECT_EQ(config["tie_word_embeddings"], true);
  EXPECT_EQ(config["max_position_embeddings"], 1024);
  EXPECT_EQ(config["vocab_size"], 300);
  // The done event reports the dimensions; the manifest records the spec.
  json done = json::parse(stdout_text.substr(stdout_text.rfind("{\"event\":\"done\"")));
  EXPECT_EQ(done["num_layers"], 3);
  EXPECT_EQ(done["head_dim"], 16);
  json manifest = json::parse(ReadText(out / "stemma.json"));
  EXPECT_EQ(manifest["producer"]["params"]["hidden_size"], "96") << manifest["producer"].dump();
  // A spec file gives the same fields; a flag after it wins.
  std::ofstream(root_ / "init.yaml")
      << "arch: olmoe\nnum_experts: 8\nexperts_per_token: 3\nnum_layers: 1\n";
  ASSERT_EQ(Engine(absl::StrCat("init --spec ", (root_ / "init.yaml").string(),
                                " --num-layers 2 --out ", (root_ / "moe").string()),
                   nullptr, &stderr_text),
            0)
      << stderr_text;
  config = json::parse(ReadText(root_ / "moe" / "config.json"));
  EXPECT_EQ(config["num_experts"], 8);
  EXPECT_EQ(config["num_experts_per_tok"], 3);
  EXPECT_EQ(config["num_hidden_layers"], 2);
  // Gemma3's layer pattern follows the depth.
  ASSERT_EQ(Engine(absl::StrCat("init --arch gemma3 --num-layers 7 --out ", (root_ / "g").string()),
                   nullptr, &stderr_text),
            0)
      << stderr_text;
  config = json::parse(ReadText(root_ / "g" / "config.json"));
  ASSERT_EQ(config["layer_types"].size(), 7u);
  EXPECT_EQ(config["layer_types"][5], "full_attention");
  EXPECT_EQ(config["layer_types"][6], "sliding_attention");
}

// --tokenizer DIR: the vocabulary and special ids follow that tokenizer; the model can be
// tokenized with. A relative DIR is under STEMMA_STORAGE_ROOT.
TEST_F(InitTest, TokenizerFromADirectory) {
  std::string err;
  ASSERT_EQ(Engine(absl::StrCat("init --out ", (root_ / "first").string()), nullptr, &err), 0)
      << err;
  ASSERT_EQ(Engine(absl::StrCat("init --arch qwen2 --tokenizer first --out second"), nullptr, &err),
            4);
  EXPECT_TRUE(absl::StrContains(err, "tokenizer"))
      << err;  // relative to the current directory: none there
  ASSERT_EQ(Engine(absl::StrCat("init --arch qwen2 --tokenizer first --out ",
                                (root_ / "second").string()),
                   nullptr, &err),
            4)
      << err;
  const std::string env = absl::StrCat("STEMMA_STORAGE_ROOT=", root_.string(), " ");
  const int status = std::system(absl::StrCat(env, STEMMA_ENGINE_BIN,
                                              " init --arch qwen2 --tokenizer first --out ",
                                              (root_ / "second").string(), " > /dev/null 2>&1")
                                     .c_str());
  ASSERT_EQ(WEXITSTATUS(status), 0);
  json config = json::parse(ReadText(root_ / "second" / "config.json"));
  EXPECT_EQ(config["vocab_size"], 259);
  EXPECT_EQ(config["eos_token_id"], 257);
  EXPECT_EQ(config["stemma_tokenizer"]["type"], "bytes");
  std::ofstream(root_ / "a.txt") << "hello\n";
  ASSERT_EQ(Engine(absl::StrCat("tokenize --tokenizer ", (root_ / "second").string(), " --input ",
                                (root_ / "a.txt").string(), " --format text --language xx --out ",
                                (root_ / "ds").string()),
                   nullptr, &err),
            0)
      << err;
}

TEST_F(InitTest, BadSizesAreBadInput) {
  std::string err;
  EXPECT_EQ(
      Engine(absl::StrCat("init --num-heads 5 --out ", (root_ / "x").string()), nullptr, &err), 4);
  EXPECT_TRUE(absl::StrContains(err, "stemma-engine: error: ")) << err;
  EXPECT_TRUE(absl::StrContains(err, "num_heads")) << err;
  EXPECT_EQ(
      Engine(absl::StrCat("init --vocab-size 100 --out ", (root_ / "x").string()), nullptr, &err),
      4);
  EXPECT_TRUE(absl::StrContains(err, "vocab_size: 100 is less than the tokenizer's 259")) << err;
  EXPECT_EQ(
      Engine(absl::StrCat("init --hidden-sise 100 --out ", (root_ / "x").string()), nullptr, &err),
      4);
  EXPECT_TRUE(absl::StrContains(err, "unknown flag --hidden-sise")) << err;
  EXPECT_FALSE(fs::exists(root_ / "x"));
}

TEST_F(InitTest, HelpOnInitAndTokenize) {
  std::string out;
  ASSERT_EQ(Engine("init --help", &out), 0);
  for (const char* needle : {"usage: stemma-engine init", "hidden_size", "num_kv_heads",
                             "experts_per_token", "default tiny"}) {
    EXPECT_TRUE(absl::StrContains(out, needle)) << needle << "\n" << out;
  }
  ASSERT_EQ(Engine("tokenize --help", &out), 0);
  for (const char* needle : {"usage: stemma-engine tokenize", "line_docs", "shard_tokens"}) {
    EXPECT_TRUE(absl::StrContains(out, needle)) << needle << "\n" << out;
  }
}

// docs/engine/init.md's preset table is what PresetConfigJson builds.
TEST(InitDocs, PresetTableMatchesTheCode) {
  const std::string page = ReadText(fs::path(STEMMA_SOURCE_DIR) / "docs" / "engine" / "init.md");
  int rows = 0;
  for (absl::string_view line : absl::StrSplit(page, '\n')) {
    if (!absl::StartsWith(line, "| tiny |") && !absl::StartsWith(line, "| small |")) continue;
    std::vector<std::string> cells;
    for (absl::string_view cell : absl::StrSplit(line, '|')) {
      cells.emplace_back(absl::StripAsciiWhitespace(cell));
    }
    // "", preset, arch, hidden, layers, heads, kv, head_dim, inter, tie, max_pos, experts, ""
    ASSERT_EQ(cells.size(), 13u) << line;
    SCOPED_TRACE(std::string(line));
    auto arch = model::ArchFromName(cells[2]);
    ASSERT_TRUE(arch.ok()) << arch.status();
    auto preset = model::PresetConfigJson(*arch, cells[1]);
    ASSERT_TRUE(preset.ok()) << preset.status();
    const json& j = *preset;
    const int64_t hidden = j["hidden_size"], heads = j["num_attention_heads"];
    EXPECT_EQ(cells[3], std::to_string(hidden));
    EXPECT_EQ(cells[4], std::to_string(j["num_hidden_layers"].get<int64_t>()));
    EXPECT_EQ(cells[5], std::to_string(heads));
    EXPECT_EQ(cells[6], std::to_string(j["num_key_value_heads"].get<int64_t>()));
    EXPECT_EQ(cells[7], std::to_string(j.value("head_dim", hidden / heads)));
    EXPECT_EQ(cells[8], std::to_string(j["intermediate_size"].get<int64_t>()));
    EXPECT_EQ(cells[9], j["tie_word_embeddings"].get<bool>() ? "true" : "false");
    EXPECT_EQ(cells[10], std::to_string(j["max_position_embeddings"].get<int64_t>()));
    const std::string experts = j.contains("num_experts")
                                    ? absl::StrCat(j["num_experts"].get<int64_t>(), " (",
                                                   j["num_experts_per_tok"].get<int64_t>(), ")")
                                    : "—";
    EXPECT_EQ(cells[11], experts);
    // Applying no sizes changes nothing (the table is what `init` writes).
    json applied = j;
    ASSERT_TRUE(model::ApplyModelSizes(*arch, {}, &applied).ok());
    EXPECT_EQ(applied, j);
    ++rows;
  }
  EXPECT_EQ(rows, 8);  // two presets × four architectures
}

}  // namespace
}  // namespace stemma::engine
