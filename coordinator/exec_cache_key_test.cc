// ExecCacheKey (exec_cache_key.h): what an exec job's memoization key depends on. Inputs are
// identified by the manifest the engine jobs' keys read (ReadArtifactManifest), code by its
// content; jobs that are not memoized get no key.
#include "coordinator/exec_cache_key.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace stemma::coordinator {
namespace {

namespace fs = std::filesystem;

class ExecCacheKeyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("stemma_exec_cache_key_test_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }

  std::string Write(const std::string& rel, const std::string& text) const {
    const fs::path path = root_ / rel;
    fs::create_directories(path.parent_path());
    std::ofstream(path, std::ios::binary) << text;
    return path.string();
  }
  std::string Path(const std::string& rel) const { return (root_ / rel).string(); }

  // An exec job reading `input` and running `code`, with one declared output.
  static v1::JobSpec Job(const std::string& input, const std::string& code) {
    v1::JobSpec spec;
    v1::ExecSpec* e = spec.mutable_exec();
    e->add_argv("python3");
    e->add_argv("run.py");
    e->add_inputs(input);
    if (!code.empty()) e->add_code(code);
    (*e->mutable_outputs())["model"].set_path("out/model");
    return spec;
  }

  fs::path root_;
};

TEST_F(ExecCacheKeyTest, OnlyMemoizedExecJobsHaveAKey) {
  v1::JobSpec spec = Job(Path("data"), "");
  EXPECT_TRUE(IsMemoizedExec(spec));
  EXPECT_NE(ExecCacheKey(spec), "");
  v1::JobSpec off = spec;
  off.mutable_exec()->set_cache(false);
  EXPECT_FALSE(IsMemoizedExec(off));
  EXPECT_EQ(ExecCacheKey(off), "");
  v1::JobSpec no_outputs = spec;
  no_outputs.mutable_exec()->clear_outputs();
  EXPECT_EQ(ExecCacheKey(no_outputs), "");
  v1::JobSpec wired = Job("${{ prep.outputs.data }}", "");
  EXPECT_EQ(ExecCacheKey(wired), "");
  EXPECT_EQ(ExecCacheKey(v1::JobSpec()), "");
}

TEST_F(ExecCacheKeyTest, AnInputDirectoryIsItsManifestAsEngineJobsReadIt) {
  // A checkpoint: stemma.json stands for it, whatever else the directory holds.
  Write("ckpt/stemma.json", R"({"files": {}})");
  Write("ckpt/notes.txt", "a");
  const std::string ckpt = ExecCacheKey(Job(Path("ckpt"), ""));
  Write("ckpt/notes.txt", "b");
  EXPECT_EQ(ExecCacheKey(Job(Path("ckpt"), "")), ckpt);
  Write("ckpt/stemma.json", R"({"files": {"x": {}}})");
  EXPECT_NE(ExecCacheKey(Job(Path("ckpt"), "")), ckpt);

  // A token dataset without stemma.json: its index.json, which lists every shard's sha256.
  Write("tokens/index.json", R"({"format": "stemma-tokens-v1", "shards": []})");
  Write("tokens/shard-00000.bin", "1234");
  const std::string tokens = ExecCacheKey(Job(Path("tokens"), ""));
  Write("tokens/shard-00000.bin", "5678");
  EXPECT_EQ(ExecCacheKey(Job(Path("tokens"), "")), tokens);
  Write("tokens/index.json", R"({"format": "stemma-tokens-v1", "shards": [{}]})");
  EXPECT_NE(ExecCacheKey(Job(Path("tokens"), "")), tokens);

  // A directory without a manifest is its content.
  Write("plain/a.txt", "a");
  const std::string plain = ExecCacheKey(Job(Path("plain"), ""));
  Write("plain/a.txt", "b");
  EXPECT_NE(ExecCacheKey(Job(Path("plain"), "")), plain);
}

TEST_F(ExecCacheKeyTest, CodeIsItsContentAndAnUnreadablePathItsSpelling) {
  Write("src/run.py", "print(1)");
  const std::string one = ExecCacheKey(Job(Path("data"), Path("src")));
  EXPECT_EQ(ExecCacheKey(Job(Path("data"), Path("src"))), one);
  Write("src/run.py", "print(2)");
  EXPECT_NE(ExecCacheKey(Job(Path("data"), Path("src"))), one);
  // Paths that cannot be read here still give a key, one per spelling.
  EXPECT_NE(ExecCacheKey(Job(Path("missing-a"), "")), "");
  EXPECT_NE(ExecCacheKey(Job(Path("missing-a"), "")), ExecCacheKey(Job(Path("missing-b"), "")));
}

}  // namespace
}  // namespace stemma::coordinator
