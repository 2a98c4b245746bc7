// Landlock confinement of job children, in real forked children: the secret file cannot be
// read, its neighbours can, and the parent's /proc entries are out of reach.
#include "worker/job_confinement.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <string>

namespace stemma::worker {
namespace {

class JobConfinementTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/stemma-confine.XXXXXX";
    dir_ = ::mkdtemp(tmpl);
    std::filesystem::create_directories(dir_ + "/secrets");
    std::ofstream(dir_ + "/secrets/token") << "stm_secret\n";
    std::ofstream(dir_ + "/secrets/neighbour") << "fine\n";
    std::filesystem::create_directories(dir_ + "/store");
    std::ofstream(dir_ + "/store/data") << "fine\n";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Forks a child that restricts itself to `ruleset` and opens `path` for reading: the
  // child's errno (0 when it could).
  static int OpenInChild(int ruleset, const std::string& path) {
    const pid_t pid = fork();
    if (pid == 0) {
      if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) _exit(100);
      if (syscall(SYS_landlock_restrict_self, ruleset, 0) != 0) _exit(101);
      const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
      _exit(fd >= 0 ? 0 : errno);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

  std::string dir_;
};

TEST_F(JobConfinementTest, TheSecretFileIsUnreadableAndEverythingElseReadable) {
  if (LandlockAbi() < 1) GTEST_SKIP() << "no Landlock on this kernel";
  absl::StatusOr<int> ruleset =
      MakeJobRuleset(dir_ + "/secrets/token", {{"--data", dir_ + "/store"}});
  ASSERT_TRUE(ruleset.ok()) << ruleset.status();
  EXPECT_EQ(OpenInChild(*ruleset, dir_ + "/secrets/token"), EACCES);
  EXPECT_EQ(OpenInChild(*ruleset, dir_ + "/secrets/neighbour"), 0);
  EXPECT_EQ(OpenInChild(*ruleset, dir_ + "/store/data"), 0);
  EXPECT_EQ(OpenInChild(*ruleset, "/etc/passwd"), 0);
  // The parent's memory and working directory, through /proc (its environ stays readable
  // here: the worker scrubs its token from it, TakeEnvironmentSecret).
  const std::string parent = "/proc/" + std::to_string(getpid());
  EXPECT_EQ(OpenInChild(*ruleset, parent + "/mem"), EACCES);
  EXPECT_EQ(OpenInChild(*ruleset, parent + "/cwd"), EACCES);
  close(*ruleset);

  // Without a secret file, only /proc of the worker is shielded.
  ruleset = MakeJobRuleset("", {});
  ASSERT_TRUE(ruleset.ok()) << ruleset.status();
  EXPECT_EQ(OpenInChild(*ruleset, dir_ + "/secrets/token"), 0);
  EXPECT_EQ(OpenInChild(*ruleset, parent + "/mem"), EACCES);
  EXPECT_EQ(OpenInChild(*ruleset, parent + "/cwd"), EACCES);
  close(*ruleset);
}

TEST_F(JobConfinementTest, ASecretInsideADirectoryJobsReadIsRefusedNamingTheFlag) {
  absl::StatusOr<int> ruleset = MakeJobRuleset(dir_ + "/secrets/token", {{"--storage-root", dir_}});
  ASSERT_FALSE(ruleset.ok());
  EXPECT_EQ(ruleset.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(ruleset.status().message().find("--storage-root"), std::string::npos);
  EXPECT_NE(ruleset.status().message().find(dir_ + "/secrets/token"), std::string::npos);
}

TEST(TakeEnvironmentSecret, RemovesTheVariableAndReturnsItsValue) {
  ::setenv("STEMMA_TEST_SECRET", "stm_x", 1);
  EXPECT_EQ(TakeEnvironmentSecret("STEMMA_TEST_SECRET"), "stm_x");
  EXPECT_EQ(::getenv("STEMMA_TEST_SECRET"), nullptr);
  EXPECT_EQ(TakeEnvironmentSecret("STEMMA_TEST_SECRET"), "");
}

}  // namespace
}  // namespace stemma::worker
