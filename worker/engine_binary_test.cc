// FindEngine and EngineBuildId (worker/engine_binary.h): the binary the executor runs is the
// one whose id goes into cache keys.
#include "worker/engine_binary.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "common/engine_front.h"
#include "common/files.h"
#include "common/sha256.h"

namespace stemma::worker {
namespace {

namespace fs = std::filesystem;

class EngineBinaryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("stemma-engine-bin-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "bin");
    if (const char* p = std::getenv("PATH")) old_path_ = p;
  }
  void TearDown() override {
    ::setenv("PATH", old_path_.c_str(), 1);
    fs::remove_all(dir_);
  }
  std::string Write(const std::string& name, const std::string& bytes, mode_t mode) {
    const std::string path = (dir_ / name).string();
    EXPECT_TRUE(files::WriteFileSynced(path, bytes).ok());
    ::chmod(path.c_str(), mode);
    return path;
  }
  fs::path dir_;
  std::string old_path_;
};

TEST_F(EngineBinaryTest, AGivenEngineIsUsedOnlyWhenExecutable) {
  const std::string engine = Write("bin/stemma-engine", "#!/bin/sh\n", 0755);
  EXPECT_EQ(FindEngine(engine), engine);
  const std::string plain = Write("plain", "data", 0644);
  ::setenv("PATH", (dir_ / "bin").c_str(), 1);
  // Not executable: refused, and no other binary (on PATH) stands in for it.
  EXPECT_EQ(FindEngine(plain), "");
  EXPECT_EQ(FindEngine((dir_ / "missing").string()), "");
}

TEST_F(EngineBinaryTest, WithoutAFlagTheEngineIsFoundOnPath) {
  // With the engine built, bin/ holds stemma-engine beside this test: that one comes first.
  const fs::path beside = fs::read_symlink("/proc/self/exe").parent_path() / "stemma-engine";
  if (::access(beside.c_str(), X_OK) == 0) {
    EXPECT_EQ(FindEngine(""), beside.string());
    return;
  }
  const std::string engine = Write("bin/stemma-engine", "#!/bin/sh\n", 0755);
  ::setenv("PATH", ("/nonexistent:" + (dir_ / "bin").string()).c_str(), 1);
  EXPECT_EQ(FindEngine(""), engine);
  ::setenv("PATH", "/nonexistent", 1);
  EXPECT_EQ(FindEngine(""), "");
}

TEST_F(EngineBinaryTest, TheBuildIdHashesTheBinarysMiBBlocks) {
  std::string bytes((1 << 20) + 10, 'a');
  bytes[5] = 'b';
  const std::string engine = Write("engine", bytes, 0755);
  const std::string blocks = Sha256Hex(bytes.substr(0, 1 << 20)) + Sha256Hex(bytes.substr(1 << 20));
  EXPECT_EQ(EngineBuildId(engine), "sha256:" + Sha256Hex(blocks).substr(0, 16));
  EXPECT_EQ(EngineBuildId(""), "");
  EXPECT_EQ(EngineBuildId((dir_ / "missing").string()), "");
}

// A front (its bytes carry the marker) needs stemma-engine-torch, executable, beside its
// resolved path; any other engine needs nothing beside it.
TEST_F(EngineBinaryTest, AFrontWithoutItsLibTorchEngineIsRefused) {
  const std::string front =
      Write("bin/stemma-engine", std::string("#!/bin/sh\n# ") + engine_front::kFrontMarker, 0755);
  const std::string torch = (fs::canonical(dir_) / "bin/stemma-engine-torch").string();
  absl::Status s = CheckEngine(front);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find(torch + " does not exist"), std::string::npos) << s;
  Write("bin/stemma-engine-torch", "#!/bin/sh\n", 0644);
  s = CheckEngine(front);
  EXPECT_NE(s.message().find(torch + " is not an executable file"), std::string::npos) << s;
  ::chmod(torch.c_str(), 0755);
  EXPECT_TRUE(CheckEngine(front).ok());
  // Looked for beside the resolved path, where the front looks.
  fs::create_directories(dir_ / "link");
  fs::create_symlink(front, dir_ / "link/stemma-engine");
  EXPECT_TRUE(CheckEngine((dir_ / "link/stemma-engine").string()).ok());
  fs::remove(torch);
  Write("link/stemma-engine-torch", "#!/bin/sh\n", 0755);
  EXPECT_EQ(CheckEngine((dir_ / "link/stemma-engine").string()).code(),
            absl::StatusCode::kFailedPrecondition);
  // Not a front, or no engine: nothing to check.
  EXPECT_TRUE(CheckEngine(Write("bin/single", "#!/bin/sh\nexit 0\n", 0755)).ok());
  EXPECT_TRUE(CheckEngine("").ok());
}

TEST_F(EngineBinaryTest, TheBuiltFrontCarriesTheMarker) {
  const fs::path beside = fs::read_symlink("/proc/self/exe").parent_path() / "stemma-engine";
  if (::access(beside.c_str(), X_OK) != 0) GTEST_SKIP() << "no engine built beside this test";
  EXPECT_TRUE(CheckEngine(beside.string()).ok());  // stemma-engine-torch is beside it
  const std::string alone = (dir_ / "bin/stemma-engine").string();
  fs::copy_file(beside, alone);
  const absl::Status s = CheckEngine(alone);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("stemma-engine-torch does not exist"), std::string::npos) << s;
}

}  // namespace
}  // namespace stemma::worker
