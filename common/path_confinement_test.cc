// Confined paths (common/path_confinement.h): the pure check on a real temporary directory
// tree with symlinks, no processes.
#include "common/path_confinement.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "stemma/v1/specs/data.pb.h"
#include "stemma/v1/specs/train.pb.h"

namespace stemma {
namespace {

namespace fs = std::filesystem;

class Confinement : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/stemma-confine.XXXXXX";
    base_ = ::mkdtemp(tmpl);
    root_ = base_ + "/srv";
    corpus_ = base_ + "/corpus";
    outside_ = base_ + "/outside";
    for (const auto& d : {root_ + "/models/base", corpus_, outside_, root_ + "/worker-data"}) {
      fs::create_directories(d);
    }
    std::ofstream(corpus_ + "/en.txt") << "hello\n";
    std::ofstream(outside_ + "/secret") << "x\n";
    roots_.storage = root_;
    roots_.read_only = {corpus_};
    roots_.no_write = {root_ + "/worker-data"};
  }
  void TearDown() override { fs::remove_all(base_); }

  // The error message, or "ok".
  std::string Check(const std::string& value, PathAccess access) {
    absl::StatusOr<std::string> r = ConfinePath("train.out", value, access, roots_);
    if (r.ok()) return "ok";
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    return std::string(r.status().message());
  }

  std::string base_, root_, corpus_, outside_;
  PathRoots roots_;
};

TEST_F(Confinement, OutputsInsideTheStorageRootAreAllowedAndResolved) {
  EXPECT_EQ(Check("ckpt/run1", PathAccess::kWrite), "ok");
  EXPECT_EQ(Check(root_ + "/ckpt/run1", PathAccess::kWrite), "ok");
  EXPECT_EQ(Check("models/base/../run2", PathAccess::kWrite), "ok");  // stays inside
  EXPECT_EQ(*ConfinePath("train.out", "a/./b/", PathAccess::kWrite, roots_), root_ + "/a/b");
}

TEST_F(Confinement, OutputsOutsideTheRootAreRefusedNamingFieldAndRoot) {
  EXPECT_EQ(Check("/etc/x", PathAccess::kWrite),
            "train.out: /etc/x is outside the storage root " + root_);
  EXPECT_EQ(Check(outside_, PathAccess::kWrite),
            "train.out: " + outside_ + " is outside the storage root " + root_);
  // A read root is not writable.
  EXPECT_NE(Check(corpus_ + "/new", PathAccess::kWrite).find("is outside the storage root"),
            std::string::npos);
  // The root itself would be replaced whole.
  EXPECT_NE(Check(root_, PathAccess::kWrite).find("is the storage root itself"), std::string::npos);
  EXPECT_NE(Check(".", PathAccess::kWrite).find("is the storage root itself"), std::string::npos);
  // The worker's own state.
  EXPECT_NE(
      Check("worker-data/attempts", PathAccess::kWrite).find("the worker's own data directory"),
      std::string::npos);
}

TEST_F(Confinement, DotDotIsRefusedAtSyntaxLevelForOutputs) {
  EXPECT_EQ(Check("../../..", PathAccess::kWrite),
            "train.out: ../../.. climbs out of the storage root ('..')");
  EXPECT_EQ(Check(root_ + "/../outside/x", PathAccess::kWrite),
            "train.out: " + root_ + "/../outside/x: an absolute output path must not contain '..'");
  EXPECT_EQ(Check("a//b", PathAccess::kWrite), "train.out: a//b has an empty path segment ('//')");
  EXPECT_EQ(Check(std::string("a\0b", 3), PathAccess::kWrite),
            "train.out: the path contains a NUL byte");
  EXPECT_NE(Check(std::string(5000, 'a'), PathAccess::kWrite).find("longer than"),
            std::string::npos);
}

TEST_F(Confinement, SymlinksThatLeaveTheRootAreRefused) {
  fs::create_directory_symlink(outside_, root_ + "/escape");
  fs::create_symlink(outside_ + "/secret", root_ + "/secret-link");
  fs::create_symlink("/etc/stemma-does-not-exist", root_ + "/dangling");
  fs::create_directory_symlink(root_ + "/models", root_ + "/inner");  // stays inside
  const std::string real_out = fs::canonical(outside_).string();
  EXPECT_EQ(Check("escape/model", PathAccess::kWrite),
            "train.out: escape/model (resolves to " + real_out +
                "/model) is outside the storage root " + root_);
  EXPECT_NE(Check(root_ + "/escape", PathAccess::kRead).find("is outside the storage root"),
            std::string::npos);
  EXPECT_NE(Check("secret-link", PathAccess::kRead).find("resolves to " + real_out + "/secret"),
            std::string::npos);
  // A dangling symlink: open(O_CREAT) would create its target outside.
  EXPECT_NE(Check("dangling", PathAccess::kWrite).find("/etc/stemma-does-not-exist) is outside"),
            std::string::npos);
  // `..` after a symlink is the kernel's `..`: from the link's target, not lexical.
  EXPECT_NE(Check("escape/../../../etc", PathAccess::kRead).find("is outside"), std::string::npos);
  EXPECT_EQ(Check("inner/base", PathAccess::kRead), "ok");
  EXPECT_EQ(Check("inner/run3", PathAccess::kWrite), "ok");
}

TEST_F(Confinement, InputsMayBeUnderReadRootsOnly) {
  EXPECT_EQ(Check(corpus_ + "/en.txt", PathAccess::kRead), "ok");
  EXPECT_EQ(Check("models/base", PathAccess::kRead), "ok");
  EXPECT_EQ(Check("../corpus/en.txt", PathAccess::kRead), "ok");  // a sibling read root
  EXPECT_EQ(Check(outside_ + "/secret", PathAccess::kRead),
            "train.out: " + outside_ + "/secret is outside the storage root " + root_ +
                " and the read root " + corpus_);
  roots_.read_only.clear();
  EXPECT_EQ(Check(corpus_ + "/en.txt", PathAccess::kRead),
            "train.out: " + corpus_ + "/en.txt is outside the storage root " + root_);
}

TEST_F(Confinement, AStorageRootThatIsItselfASymlinkStillConfines) {
  fs::create_directory_symlink(root_, base_ + "/srv-link");
  roots_.storage = base_ + "/srv-link";
  EXPECT_EQ(Check("ckpt/a", PathAccess::kWrite), "ok");
  EXPECT_EQ(Check(root_ + "/ckpt/a", PathAccess::kWrite), "ok");  // the same directory
  EXPECT_NE(Check(outside_ + "/a", PathAccess::kWrite)
                .find("outside the storage root " + base_ + "/srv-link"),
            std::string::npos);
}

TEST_F(Confinement, ReferencesAreNotPaths) {
  EXPECT_EQ(Check("ckpt:12", PathAccess::kRead), "ok");
  EXPECT_EQ(Check("hf:/models/x", PathAccess::kRead), "ok");
  EXPECT_EQ(Check("${{ needs.a.outputs.model }}", PathAccess::kRead), "ok");
  EXPECT_EQ(Check("", PathAccess::kWrite), "ok");
}

TEST_F(Confinement, EverySpecFieldIsCheckedWithItsRoleAndFullName) {
  v1::TrainSpec train;
  train.set_model("models/base");
  train.set_out("runs/a");
  train.mutable_data()->add_datasets()->set_path(corpus_);
  EXPECT_TRUE(CheckSpecConfinement(train, "train", roots_).ok());
  train.mutable_data()->add_datasets()->set_path(outside_ + "/secret");
  absl::Status st = CheckSpecConfinement(train, "train", roots_);
  EXPECT_EQ(st.message(), "train.data.datasets[1].path: " + outside_ +
                              "/secret is outside the storage root " + root_ +
                              " and the read root " + corpus_);
  train.mutable_data()->mutable_datasets()->RemoveLast();
  train.set_out("/etc/x");
  EXPECT_EQ(CheckSpecConfinement(train, "train", roots_).message(),
            "train.out: /etc/x is outside the storage root " + root_);

  v1::TokenizeSpec tok;
  tok.set_tokenizer("models/base");
  tok.add_input(corpus_ + "/en.txt");
  tok.set_out("../../..");
  EXPECT_EQ(CheckSpecPathSyntax(tok, "tokenize").message(),
            "tokenize.out: ../../.. climbs out of the storage root ('..')");
  tok.set_out("/abs/ok");  // syntax only: no roots known at submit
  EXPECT_TRUE(CheckSpecPathSyntax(tok, "tokenize").ok());
  tok.set_out("/abs/../x");
  EXPECT_FALSE(CheckSpecPathSyntax(tok, "tokenize").ok());
  tok.set_out("ok");
  tok.set_input(0, "/data//en.txt");
  EXPECT_EQ(CheckSpecPathSyntax(tok, "tokenize").message(),
            "tokenize.input[0]: /data//en.txt has an empty path segment ('//')");
}

}  // namespace
}  // namespace stemma
