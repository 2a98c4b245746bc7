// The merge commands' contract beyond their arithmetic: bad input refused naming the
// problem with nothing written, --help, identical bytes for identical inputs, and kill -9
// at any point publishing nothing half-written (engine/io/durable.h). The operations
// themselves: merge_test.cc.
#include "engine/merge/merge_test_fixture.h"

namespace stemma::engine::merge {
namespace {

TEST_F(MergeTest, BadInputsFailNamingTheProblemAndWriteNothing) {
  WriteModel(P("a"), RandomModel(70, Dtype::kBF16), TinyConfig());
  Model b = RandomModel(71, Dtype::kBF16);
  b["model.layers.1.mlp.up_proj.weight"].shape = {16, 32};  // transposed
  WriteModel(P("b"), b, TinyConfig());
  json bad_config = TinyConfig();
  bad_config["hidden_act"] = "gelu";
  WriteModel(P("c"), RandomModel(72, Dtype::kBF16), bad_config);
  Model d = RandomModel(73, Dtype::kBF16);
  d.erase("lm_head.weight");
  WriteModel(P("d"), d, TinyConfig());
  struct Case {
    std::string command;
    json spec;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {"merge",
       {{"models", Paths({P("a"), P("b")})}, {"out", P("o")}},
       "model.layers.1.mlp.up_proj.weight [32, 16] vs [16, 32]"},
      {"merge",
       {{"models", Paths({P("a"), P("c")})}, {"out", P("o")}},
       "hidden_act \"silu\" vs \"gelu\""},
      {"merge", {{"models", Paths({P("a"), P("d")})}, {"out", P("o")}}, "lm_head.weight"},
      {"merge", {{"models", Paths({P("a")})}, {"out", P("o")}, {"wieght", 1}}, "wieght"},
      {"merge",
       {{"models", {{{"path", P("a")}, {"weight", 1}}, {{"path", P("a")}, {"weight", -1}}}},
        {"out", P("o")}},
       "weights sum to 0"},
      {"merge",
       {{"method", "ties"},
        {"base", P("a")},
        {"models", {{{"path", P("a")}, {"density", 0}}}},
        {"out", P("o")}},
       "density"},
      {"merge",
       {{"method", "ties"}, {"models", Paths({P("a")})}, {"out", P("o")}},
       "base: is required by method ties"},
      {"merge", {{"models", Paths({P("nope")})}, {"out", P("o")}}, P("nope")},
      {"revert",
       {{"base", P("a")}, {"model", P("a")}, {"out", P("o")}, {"layers", {"2:9"}}},
       "layers[0]: layers '2:9' reach past the model's 4 layers"},
      {"interpolate",
       {{"base", P("a")}, {"model", P("a")}, {"alphas", {0.5}}, {"out_pattern", P("x")}},
       "{alpha}"},
      {"upcycle", {{"model", P("a")}, {"out", P("o")}, {"experts", 2}, {"top_k", 3}}, "top_k"},
      {"merge", {{"models", Paths({P("a")})}, {"out", P("a")}}, "already exists"},
      // overwrite replaces only what Stemma wrote: P("a") has no stemma.json.
      {"merge",
       {{"models", Paths({P("b")})}, {"out", P("a")}, {"overwrite", true}},
       "Stemma did not write it"},
      // The one layer-range convention: strings, half-open; a bare integer is refused.
      {"revert",
       {{"base", P("a")}, {"model", P("a")}, {"out", P("o")}, {"layers", {2}}},
       "write layer ranges as strings"},
      {"merge",
       {{"models", Paths({P("a")})}, {"out", P("o")}, {"shard_size", "5XB"}},
       "shard_size: '5XB' is not a byte count"},
  };
  for (const Case& c : cases) {
    Result r = Run(c.command, c.spec);
    // 4: a bad spec or bad input, which the worker does not retry (common/engine_contract.h).
    EXPECT_EQ(r.code, 4) << c.spec.dump() << "\n" << r.err;
    EXPECT_NE(r.err.find("stemma-engine: error: "), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(c.expect), std::string::npos)
        << "want \"" << c.expect << "\" in: " << r.err;
    EXPECT_FALSE(fs::exists(P("o"))) << c.spec.dump();
  }
  for (const auto& entry : fs::directory_iterator(dir_)) {
    EXPECT_EQ(entry.path().filename().string().find(".tmp-"), std::string::npos) << entry.path();
  }
}

TEST_F(MergeTest, HelpListsTheSpecFields) {
  for (const std::string command : {"merge", "revert", "interpolate", "graft", "upcycle"}) {
    const std::string cmd =
        absl::StrCat(EngineBin(), " ", command, " --help >", P("help"), " 2>&1");
    const int status = std::system(cmd.c_str());
    ASSERT_TRUE(WIFEXITED(status)) << command;
    EXPECT_EQ(WEXITSTATUS(status), 0) << command;
    const std::string help = ReadText(P("help"));
    EXPECT_NE(help.find("usage: stemma-engine " + command), std::string::npos) << help;
    EXPECT_NE(help.find("  out  (path (written)"), std::string::npos) << help;
    EXPECT_NE(help.find("docs/engine/" + command + ".md"), std::string::npos) << help;
  }
}

TEST_F(MergeTest, SameInputsGiveIdenticalBytes) {
  WriteModel(P("a"), RandomModel(80, Dtype::kBF16), TinyConfig());
  WriteModel(P("b"), RandomModel(81, Dtype::kF32), TinyConfig(), 2);
  auto spec = [&](const std::string& out) {
    return json{{"method", "ties"},
                {"base", P("a")},
                {"models", {{{"path", P("b")}, {"density", 0.4}}}},
                {"out", P(out)},
                {"shard_size", 4000}};
  };
  ASSERT_EQ(Run("merge", spec("x"), "SOURCE_DATE_EPOCH=1700000000").code, 0);
  ASSERT_EQ(Run("merge", spec("y"), "SOURCE_DATE_EPOCH=1700000000").code, 0);
  // Buffered writes (direct_io: false) give the same bytes as O_DIRECT ones.
  json buffered = spec("z");
  buffered["direct_io"] = false;
  ASSERT_EQ(Run("merge", buffered, "SOURCE_DATE_EPOCH=1700000000").code, 0);
  int files = 0;
  for (const auto& entry : fs::directory_iterator(P("x"))) {
    const std::string name = entry.path().filename().string();
    if (name == "stemma.json") continue;
    EXPECT_EQ(ReadText(P("x/" + name)), ReadText(P("y/" + name))) << name;
    EXPECT_EQ(ReadText(P("x/" + name)), ReadText(P("z/" + name))) << name;
    ++files;
  }
  EXPECT_GE(files, 4);  // shards, index, config
  json mx = json::parse(ReadText(P("x/stemma.json"))),
       my = json::parse(ReadText(P("y/stemma.json")));
  EXPECT_EQ(mx["files"], my["files"]);
  EXPECT_EQ(mx["created_ms"], 1700000000000);
}

TEST_F(MergeTest, KillDuringMergePublishesNothingAndRerunGivesTheSameBytes) {
  WriteModel(P("a"), RandomModel(90, Dtype::kBF16), TinyConfig());
  WriteModel(P("b"), RandomModel(91, Dtype::kBF16), TinyConfig());
  const json spec = {{"models", Paths({P("a"), P("b")})}, {"out", P("soup")}, {"shard_size", 2000}};
  const std::string spec_path = SpecFile(spec);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::setenv("STEMMA_MERGE_TEST_PAUSE_S", "60", 1);
    std::freopen(P("kill-stderr").c_str(), "w", stderr);
    std::freopen("/dev/null", "w", stdout);
    ::execl(EngineBin(), EngineBin(), "merge", "--spec", spec_path.c_str(), nullptr);
    ::_exit(127);
  }
  // Wait until the first shard is on disk (the engine says so), then kill -9.
  bool paused = false;
  for (int i = 0; i < 600 && !paused; ++i) {
    paused = ReadText(P("kill-stderr")).find("test pause") != std::string::npos;
    if (!paused) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(paused);
  ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_FALSE(fs::exists(P("soup")));
  const std::string staging = P(absl::StrCat("soup.tmp-", pid));
  EXPECT_TRUE(fs::exists(staging)) << "the killed writer's staging directory";
  ASSERT_EQ(Run("merge", spec).code, 0);
  EXPECT_FALSE(fs::exists(staging)) << "a rerun removes a dead writer's staging directory";
  ASSERT_EQ(
      Run("merge", {{"models", Paths({P("a"), P("b")})}, {"out", P("again")}, {"shard_size", 2000}})
          .code,
      0);
  int shards = 0;
  for (const auto& entry : fs::directory_iterator(P("soup"))) {
    const std::string name = entry.path().filename().string();
    if (name.find(".safetensors") == std::string::npos) continue;
    EXPECT_EQ(ReadText(P("soup/" + name)), ReadText(P("again/" + name))) << name;
    ++shards;
  }
  EXPECT_GT(shards, 2);
  EXPECT_TRUE(io::VerifyCheckpoint(P("soup")).ok());
}

// overwrite through the durability door: a merge replacing its own earlier output, killed
// before or after the atomic swap, leaves the old checkpoint or the new one, complete.
TEST_F(MergeTest, OverwriteKilledAtEachStepLeavesTheOldOrTheNewCheckpoint) {
  WriteModel(P("a"), RandomModel(95, Dtype::kBF16), TinyConfig());
  WriteModel(P("b"), RandomModel(96, Dtype::kBF16), TinyConfig());
  auto soup = [&](double weight_b) {
    return json{{"models", {{{"path", P("a")}}, {{"path", P("b")}, {"weight", weight_b}}}},
                {"out", P("soup")},
                {"overwrite", true}};
  };
  ASSERT_EQ(Run("merge", soup(1)).code, 0);
  const std::string first = ReadText(P("soup/model.safetensors"));
  ASSERT_EQ(Run("merge", soup(3)).code, 0);  // a plain overwrite
  const std::string second = ReadText(P("soup/model.safetensors"));
  ASSERT_NE(first, second);
  EXPECT_TRUE(io::VerifyCheckpoint(P("soup")).ok());

  Result r = Run("merge", soup(1), "STEMMA_IO_CRASH_AT=publish:before-rename");
  // SIGKILL: the shell reports 128 + 9, or the wait status is a signal (-1 here).
  EXPECT_TRUE(r.code == 137 || r.code == -1)
      << "killed by the crash point, got " << r.code << ": " << r.err;
  EXPECT_EQ(ReadText(P("soup/model.safetensors")), second) << "killed before the swap: the old one";
  EXPECT_TRUE(io::VerifyCheckpoint(P("soup")).ok());
  r = Run("merge", soup(1), "STEMMA_IO_CRASH_AT=publish:after-swap");
  EXPECT_TRUE(r.code == 137 || r.code == -1) << r.code << ": " << r.err;
  EXPECT_EQ(ReadText(P("soup/model.safetensors")), first) << "killed after the swap: the new one";
  EXPECT_TRUE(io::VerifyCheckpoint(P("soup")).ok());
  ASSERT_EQ(Run("merge", soup(3)).code, 0);  // and the next run cleans up what the dead left
  for (const auto& entry : fs::directory_iterator(dir_)) {
    EXPECT_EQ(entry.path().filename().string().find(".tmp-"), std::string::npos) << entry.path();
  }
}

}  // namespace
}  // namespace stemma::engine::merge
