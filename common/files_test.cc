// The files door (common/files.h) and the SHA-256 door (common/sha256.h) on a real temporary
// directory: what a caller sees (contents, errors naming the path, atomic replacement).
#include "common/files.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "common/sha256.h"

namespace stemma::files {
namespace {

namespace fs = std::filesystem;

class FilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (fs::temp_directory_path() / ("stemma-files-" + std::to_string(::getpid()))).string();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }
  std::string dir_;
};

TEST_F(FilesTest, WritesAndReadsBackAWholeFile) {
  const std::string path = dir_ + "/a.txt";
  std::string big(300000, 'x');
  big[12345] = '\n';
  ASSERT_TRUE(WriteFileSynced(path, big).ok());
  auto text = ReadFile(path);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, big);
  ASSERT_TRUE(WriteFileSynced(path, "").ok());
  EXPECT_EQ(*ReadFile(path), "");
}

TEST_F(FilesTest, AMissingFileIsNotFoundNamingThePath) {
  auto text = ReadFile(dir_ + "/missing.json");
  ASSERT_FALSE(text.ok());
  EXPECT_EQ(text.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(text.status().message(),
            "cannot read " + dir_ + "/missing.json: No such file or directory");
  auto fd = Open(dir_ + "/missing.json", O_RDONLY);
  ASSERT_FALSE(fd.ok());
  EXPECT_EQ(fd.status().message(), "open " + dir_ + "/missing.json: No such file or directory");
}

TEST_F(FilesTest, UniqueFdClosesOnceAndMoves) {
  ASSERT_TRUE(WriteFileSynced(dir_ + "/f", "abc").ok());
  auto opened = Open(dir_ + "/f", O_RDONLY);
  ASSERT_TRUE(opened.ok());
  const int raw = opened->get();
  UniqueFd moved = std::move(*opened);
  EXPECT_FALSE(opened->valid());
  EXPECT_EQ(moved.get(), raw);
  EXPECT_EQ(*ReadAll(moved.get(), "f"), "abc");
  EXPECT_TRUE(moved.Close("f").ok());
  EXPECT_FALSE(moved.valid());
  EXPECT_EQ(::fcntl(raw, F_GETFD), -1);  // closed
  { UniqueFd scoped(::open((dir_ + "/f").c_str(), O_RDONLY | O_CLOEXEC)); }
  UniqueFd released(::open((dir_ + "/f").c_str(), O_RDONLY | O_CLOEXEC));
  const int kept = released.release();
  EXPECT_NE(::fcntl(kept, F_GETFD), -1);  // still open: release gave up ownership
  ::close(kept);
}

TEST_F(FilesTest, AtomicWriteReplacesTheFileAndLeavesNoTemporary) {
  const std::string path = dir_ + "/config.json";
  ASSERT_TRUE(WriteFileAtomic(path, "old").ok());
  ASSERT_TRUE(WriteFileAtomic(path, "new", 0600).ok());
  EXPECT_EQ(*ReadFile(path), "new");
  int entries = 0;
  for (const auto& e : fs::directory_iterator(dir_)) {
    (void)e;
    ++entries;
  }
  EXPECT_EQ(entries, 1);
  auto s = WriteFileAtomic(dir_ + "/no-such-dir/x", "y");
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_NE(s.message().find(dir_ + "/no-such-dir/x.tmp-"), absl::string_view::npos) << s;
}

TEST_F(FilesTest, AtomicWriteKilledBeforeTheRenameLeavesTheOldFile) {
  const std::string path = dir_ + "/state";
  ASSERT_TRUE(WriteFileAtomic(path, "old").ok());
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::setenv("STEMMA_IO_CRASH_AT", "write-file:before-rename", 1);
    (void)WriteFileAtomic(path, "new");
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(*ReadFile(path), "old");
}

TEST_F(FilesTest, PublishDirRenamesAndRefusesAnExistingNameWithoutACheck) {
  const std::string staging = dir_ + "/out.tmp-1", out = dir_ + "/out";
  fs::create_directories(staging);
  ASSERT_TRUE(WriteFileSynced(staging + "/a", "one").ok());
  ASSERT_TRUE(PublishDir(staging, out).ok());
  EXPECT_EQ(*ReadFile(out + "/a"), "one");
  EXPECT_FALSE(PathExists(staging));

  fs::create_directories(staging);
  ASSERT_TRUE(WriteFileSynced(staging + "/a", "two").ok());
  absl::Status s = PublishDir(staging, out);
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(s.message(), out + ": already exists");
  s = PublishDir(staging, out, [](const std::string& o) {
    return absl::FailedPreconditionError(o + ": not mine");
  });
  EXPECT_EQ(s.message(), out + ": not mine");
  EXPECT_EQ(*ReadFile(out + "/a"), "one");

  std::string checked;
  ASSERT_TRUE(PublishDir(staging + "/", out, [&](const std::string& o) {
                checked = o;
                return absl::OkStatus();
              }).ok());
  EXPECT_EQ(checked, out);
  EXPECT_EQ(*ReadFile(out + "/a"), "two");
  EXPECT_FALSE(PathExists(staging));  // the old directory, swapped there, is removed
}

TEST_F(FilesTest, CopyAndRemove) {
  ASSERT_TRUE(WriteFileSynced(dir_ + "/from", "bytes").ok());
  ASSERT_TRUE(CopyFileSynced(dir_ + "/from", dir_ + "/to").ok());
  EXPECT_EQ(*ReadFile(dir_ + "/to"), "bytes");
  fs::create_directories(dir_ + "/tree/sub");
  ASSERT_TRUE(RemoveTree(dir_ + "/tree").ok());
  EXPECT_FALSE(PathExists(dir_ + "/tree"));
  EXPECT_TRUE(RemoveTree(dir_ + "/tree").ok());  // already gone
  EXPECT_EQ(CopyFileSynced(dir_ + "/none", dir_ + "/to").code(), absl::StatusCode::kNotFound);
}

TEST(PathNames, ParentAndBase) {
  EXPECT_EQ(ParentDir("/a/b/c"), "/a/b");
  EXPECT_EQ(ParentDir("/a/b/c/"), "/a/b");
  EXPECT_EQ(ParentDir("c"), ".");
  EXPECT_EQ(ParentDir("/c"), "/");
  EXPECT_EQ(BaseName("/a/b/c"), "c");
  EXPECT_EQ(BaseName("/a/b/c//"), "c");
  EXPECT_EQ(BaseName("c"), "c");
}

TEST_F(FilesTest, Sha256OfStringsAndFilesAgree) {
  EXPECT_EQ(Sha256Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  ASSERT_TRUE(WriteFileSynced(dir_ + "/abc", "abc").ok());
  uint64_t bytes = 0;
  auto sha = Sha256File(dir_ + "/abc", &bytes);
  ASSERT_TRUE(sha.ok()) << sha.status();
  EXPECT_EQ(*sha, Sha256Hex("abc"));
  EXPECT_EQ(bytes, 3u);
  Sha256 h;
  h.Update("a");
  h.Update("bc");
  EXPECT_EQ(h.HexDigest(), *sha);
  auto missing = Sha256File(dir_ + "/none");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find(dir_ + "/none"), absl::string_view::npos);
}

}  // namespace
}  // namespace stemma::files
