// The durability door (engine/io/durable.h): publish and replace a directory, write a file,
// refuse to overwrite what Stemma did not write, and crash safety: a process killed at each
// step of a publish leaves the old directory or the new one, complete, never none.
#include "engine/io/durable.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "engine/io/fs.h"

namespace stemma::engine::io {
namespace {

namespace fs = std::filesystem;

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

class DurableTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (fs::temp_directory_path() / ("stemma-durable-" + std::to_string(::getpid()))).string();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }

  // A directory as a Stemma writer leaves it: weights plus a stemma.json manifest.
  void MakeStemmaDir(const std::string& path, const std::string& tag) {
    fs::create_directories(path);
    ASSERT_TRUE(WriteFileSynced(path + "/model.safetensors", "weights " + tag).ok());
    ASSERT_TRUE(
        WriteFileSynced(
            path + "/stemma.json",
            "{\"format\": 1, \"files\": {}, \"type\": \"checkpoint\", \"tag\": \"" + tag + "\"}")
            .ok());
  }

  // A fresh staging directory for `out` holding the "new" version.
  std::string Stage(const std::string& out, bool overwrite) {
    auto staging = CreateStagingDir(out, overwrite);
    EXPECT_TRUE(staging.ok()) << staging.status();
    if (!staging.ok()) return "";
    EXPECT_TRUE(WriteFileSynced(*staging + "/model.safetensors", "weights new").ok());
    EXPECT_TRUE(WriteFileSynced(*staging + "/stemma.json", "{\"format\": 1, \"files\": {}}").ok());
    return *staging;
  }

  std::string dir_;
};

TEST_F(DurableTest, PublishesANewDirectoryAndRefusesAnExistingOne) {
  const std::string out = dir_ + "/ckpt";
  std::string staging = Stage(out, false);
  ASSERT_TRUE(PublishDir(staging, out, false).ok());
  EXPECT_EQ(Slurp(out + "/model.safetensors"), "weights new");
  EXPECT_FALSE(PathExists(staging));
  auto again = CreateStagingDir(out, false);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_NE(again.status().message().find(out), std::string::npos);
}

TEST_F(DurableTest, OverwriteReplacesACheckpointStemmaWrote) {
  const std::string out = dir_ + "/ckpt";
  MakeStemmaDir(out, "old");
  std::string staging = Stage(out, true);
  ASSERT_TRUE(PublishDir(staging, out, true).ok());
  EXPECT_EQ(Slurp(out + "/model.safetensors"), "weights new");
  EXPECT_FALSE(PathExists(staging));  // the old directory, swapped there, is gone
}

TEST_F(DurableTest, OverwriteRefusesWhatStemmaDidNotWrite) {
  // An arbitrary directory (someone's home, a data folder) and a regular file.
  const std::string plain = dir_ + "/notes";
  fs::create_directories(plain);
  ASSERT_TRUE(WriteFileSynced(plain + "/thesis.tex", "precious").ok());
  auto s = CreateStagingDir(plain, true);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.status().message().find("Stemma did not write it"), std::string::npos) << s.status();
  EXPECT_EQ(Slurp(plain + "/thesis.tex"), "precious");

  const std::string file = dir_ + "/file.bin";
  ASSERT_TRUE(WriteFileSynced(file, "x").ok());
  s = CreateStagingDir(file, true);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("is a file"), std::string::npos) << s.status();

  // A stemma.json that is not a manifest does not count.
  const std::string fake = dir_ + "/fake";
  fs::create_directories(fake);
  ASSERT_TRUE(WriteFileSynced(fake + "/stemma.json", "[1, 2]").ok());
  EXPECT_FALSE(CheckReplaceable(fake).ok());
  // A token dataset (its manifest is index.json) does.
  const std::string data = dir_ + "/tokens";
  fs::create_directories(data);
  ASSERT_TRUE(WriteFileSynced(data + "/index.json", "{\"format\": \"stemma-tokens-v1\"}").ok());
  EXPECT_TRUE(CheckReplaceable(data).ok());
}

TEST_F(DurableTest, PublishChecksAgainWhenTheTargetAppearedMeanwhile) {
  const std::string out = dir_ + "/ckpt";
  std::string staging = Stage(out, true);
  fs::create_directories(out);  // not Stemma's: appears while the job runs
  ASSERT_TRUE(WriteFileSynced(out + "/mine.txt", "keep").ok());
  absl::Status s = PublishDir(staging, out, true);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ(Slurp(out + "/mine.txt"), "keep");
}

TEST_F(DurableTest, WriteFileAtomicReplacesTheWholeFile) {
  const std::string path = dir_ + "/state.json";
  ASSERT_TRUE(WriteFileAtomic(path, "first").ok());
  ASSERT_TRUE(WriteFileAtomic(path, "second").ok());
  EXPECT_EQ(Slurp(path), "second");
  EXPECT_FALSE(PathExists(path + ".tmp-" + std::to_string(::getpid())));
}

TEST_F(DurableTest, MappedFileSeesTheBytes) {
  ASSERT_TRUE(WriteFileSynced(dir_ + "/f", "hello").ok());
  auto m = MappedFile::Open(dir_ + "/f");
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ((*m)->size(), 5u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>((*m)->data()), 5), "hello");
  auto missing = MappedFile::Open(dir_ + "/nope");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
}

// Runs `body` in a child process with STEMMA_IO_CRASH_AT=point; returns its wait status.
template <typename F>
int RunChildCrashingAt(const char* point, F body) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setenv("STEMMA_IO_CRASH_AT", point, 1);
    body();
    ::_exit(0);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return status;
}

TEST_F(DurableTest, AKilledReplaceLeavesTheOldOrTheNewNeverNone) {
  for (const char* point : {"publish:before-rename", "publish:after-swap"}) {
    SCOPED_TRACE(point);
    const std::string out = dir_ + "/ckpt-" + std::string(point).substr(8);
    MakeStemmaDir(out, "old");
    const int status = RunChildCrashingAt(point, [&] {
      auto staging = CreateStagingDir(out, true);
      if (!staging.ok()) ::_exit(10);
      if (!WriteFileSynced(*staging + "/model.safetensors", "weights new").ok()) ::_exit(11);
      if (!WriteFileSynced(*staging + "/stemma.json", "{\"format\": 1, \"files\": {}}").ok())
        ::_exit(12);
      (void)PublishDir(*staging, out, true);
      ::_exit(13);  // not reached: the crash point kills the process
    });
    ASSERT_TRUE(WIFSIGNALED(status)) << "child exited with " << WEXITSTATUS(status);
    ASSERT_TRUE(PathExists(out + "/model.safetensors"));
    const std::string weights = Slurp(out + "/model.safetensors");
    if (std::string(point) == "publish:before-rename") {
      EXPECT_EQ(weights, "weights old");
    } else {
      EXPECT_EQ(weights, "weights new");
    }
    EXPECT_TRUE(PathExists(out + "/stemma.json"));
    // The next writer for `out` removes what the dead one left beside it.
    std::string staging = Stage(out, true);
    ASSERT_TRUE(PublishDir(staging, out, true).ok());
    int leftovers = 0;
    for (const auto& e : fs::directory_iterator(dir_)) {
      leftovers += e.path().filename().string().find(".tmp-") != std::string::npos;
    }
    EXPECT_EQ(leftovers, 0);
  }
}

TEST_F(DurableTest, AKilledFileWriteLeavesTheOldFile) {
  const std::string path = dir_ + "/state.json";
  ASSERT_TRUE(WriteFileAtomic(path, "old").ok());
  const int status = RunChildCrashingAt("write-file:before-rename", [&] {
    (void)WriteFileAtomic(path, "new and longer");
    ::_exit(13);
  });
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(Slurp(path), "old");
}

}  // namespace
}  // namespace stemma::engine::io
