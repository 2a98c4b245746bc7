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

// Forks a child that restricts itself to `ruleset` and creates `path` (a regular file): the
// child's errno (0 when it could).
int CreateInChild(int ruleset, const std::string& path) {
  const pid_t pid = fork();
  if (pid == 0) {
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) _exit(100);
    if (syscall(SYS_landlock_restrict_self, ruleset, 0) != 0) _exit(101);
    const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
    _exit(fd >= 0 ? 0 : errno);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

v1::JobSpec Owned(const std::string& owner, const std::string& out) {
  v1::JobSpec spec;
  (*spec.mutable_labels())["stemma.owner"] = owner;
  if (!out.empty()) spec.mutable_init()->set_out(out);
  return spec;
}

// A symbolic link planted inside bob's own prefix that points into carol's: bob's output
// through it is refused before anything runs, naming the field and the link; so is a prefix
// that is itself a link. Without an owner nothing is checked (no authentication).
TEST_F(JobConfinementTest, AnOutputThroughALinkOutOfTheOwnersPrefixIsRefused) {
  const std::string root = dir_ + "/store";
  std::filesystem::create_directories(root + "/bob");
  std::filesystem::create_directories(root + "/carol/base");
  std::filesystem::create_directory_symlink("../carol", root + "/bob/link");
  absl::StatusOr<OwnedWrites> through = CheckOwnedWrites(Owned("bob", "bob/link/base"), root);
  ASSERT_EQ(through.status().code(), absl::StatusCode::kPermissionDenied) << through.status();
  EXPECT_NE(through.status().message().find("init.out: bob/link/base resolves to " + root +
                                            "/carol/base through a symbolic link"),
            std::string::npos)
      << through.status();
  std::filesystem::create_directory_symlink("carol", root + "/dave");
  absl::StatusOr<OwnedWrites> prefix = CheckOwnedWrites(Owned("dave", "dave/m"), root);
  ASSERT_EQ(prefix.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(prefix.status().message().find("is a symbolic link"), std::string::npos)
      << prefix.status();
  absl::StatusOr<OwnedWrites> fine = CheckOwnedWrites(Owned("bob", "projects/vision/m"), root);
  ASSERT_TRUE(fine.ok()) << fine.status();
  EXPECT_EQ(fine->prefixes, (std::vector<std::string>{"bob", "projects/vision"}));
  EXPECT_TRUE(CheckOwnedWrites(Owned("", "bob/link/base"), root).ok());
}

// The attempt's write rule set: bob's child writes below bob/ (not through a link planted
// there), in its attempt directory and outside the storage root, never into carol/.
TEST_F(JobConfinementTest, AnOwnedChildWritesOnlyBelowItsPrefixesInsideTheRoot) {
  if (LandlockAbi() < 2) GTEST_SKIP() << "no Landlock ABI 2 on this kernel";
  const std::string root = dir_ + "/store";
  std::filesystem::create_directories(root + "/carol");
  std::filesystem::create_directories(root + "/work");
  std::filesystem::create_directories(dir_ + "/elsewhere");
  absl::StatusOr<OwnedWrites> writes = CheckOwnedWrites(Owned("bob", ""), root);
  ASSERT_TRUE(writes.ok()) << writes.status();
  absl::StatusOr<int> ruleset = MakeWriteRuleset(*writes, root, root + "/work");
  ASSERT_TRUE(ruleset.ok()) << ruleset.status();
  ASSERT_GE(*ruleset, 0);
  ASSERT_TRUE(std::filesystem::is_directory(root + "/bob"));  // made for the attempt
  std::filesystem::create_directory_symlink("../carol", root + "/bob/link");
  EXPECT_EQ(CreateInChild(*ruleset, root + "/bob/model"), 0);
  EXPECT_EQ(CreateInChild(*ruleset, root + "/work/spec"), 0);
  EXPECT_EQ(CreateInChild(*ruleset, dir_ + "/elsewhere/x"), 0);
  EXPECT_EQ(CreateInChild(*ruleset, root + "/carol/evil"), EACCES);
  EXPECT_EQ(CreateInChild(*ruleset, root + "/bob/link/evil"), EACCES);
  EXPECT_EQ(CreateInChild(*ruleset, root + "/newdir-file"), EACCES);
  EXPECT_FALSE(std::filesystem::exists(root + "/carol/evil"));
  close(*ruleset);
  EXPECT_EQ(*MakeWriteRuleset(OwnedWrites(), root, root + "/work"), -1);  // no owner
}

TEST(TakeEnvironmentSecret, RemovesTheVariableAndReturnsItsValue) {
  ::setenv("STEMMA_TEST_SECRET", "stm_x", 1);
  EXPECT_EQ(TakeEnvironmentSecret("STEMMA_TEST_SECRET"), "stm_x");
  EXPECT_EQ(::getenv("STEMMA_TEST_SECRET"), nullptr);
  EXPECT_EQ(TakeEnvironmentSecret("STEMMA_TEST_SECRET"), "");
}

}  // namespace
}  // namespace stemma::worker
