#include "engine/io/checkpoint.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "engine/io/fs.h"
#include "engine/io/sha256.h"

namespace stemma::engine::io {
namespace {

namespace fs = std::filesystem;

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("stemma-ckpt-" + std::to_string(::getpid()) + "-" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }
  std::string P(const std::string& name) { return (root_ / name).string(); }

  std::map<std::string, at::Tensor> Tensors() {
    at::manual_seed(7);
    return {
        {"model.embed_tokens.weight", at::randn({32, 8}).to(at::kBFloat16)},
        {"model.layers.0.mlp.up_proj.weight", at::randn({16, 8})},
        {"model.layers.0.self_attn.q_proj.bias", at::randn({8}).to(at::kHalf)},
        {"model.norm.weight", at::randn({8}).to(at::kDouble)},
        {"scalar", at::scalar_tensor(3, at::kLong)},
        {"empty", at::empty({0, 4}, at::kInt)},
        {"mask", at::rand({5}) > 0.5},
    };
  }
  absl::Status Write(const std::string& out, CheckpointWriterOptions options = {}) {
    options.created_ms = 1;
    auto w = CheckpointWriter::Create(out, std::move(options));
    if (!w.ok()) return w.status();
    for (const auto& [name, t] : Tensors()) {
      absl::Status s = (*w)->AddTensor(name, t);
      if (!s.ok()) return s;
    }
    absl::Status s = (*w)->AddFile("config.json", R"({"model_type":"llama"})");
    if (!s.ok()) return s;
    return (*w)->Commit();
  }
  // Flips one bit of the tensor `name` in a sharded copy at P("ck") and returns its shard
  // file's name: the file keeps its size, its sha256 changes.
  std::string WriteAndDamage(const std::string& name) {
    CheckpointWriterOptions o;
    o.max_shard_bytes = 520;
    EXPECT_TRUE(Write(P("ck"), o).ok());
    auto r = CheckpointReader::Open(P("ck"));
    EXPECT_TRUE(r.ok()) << r.status();
    const std::string shard = (*r)->ShardOf(name);
    const TensorInfo* info = (*r)->Find(name);
    auto file = SafetensorsFile::Open(P("ck/" + shard));
    const uint64_t pos = 8 + (*file)->header_bytes() + info->begin + 5;
    r->reset();
    file->reset();
    std::fstream f(P("ck/" + shard), std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(pos);
    char c;
    f.read(&c, 1);
    c ^= 0x10;
    f.seekp(pos);
    f.write(&c, 1);
    return shard;
  }
  fs::path root_;
};

// Sets RANK for one scope (the worker's variable, read by Verify::kOncePerJob).
class ScopedRank {
 public:
  explicit ScopedRank(const char* rank) {
    if (const char* old = std::getenv("RANK")) old_ = old;
    if (rank == nullptr) {
      ::unsetenv("RANK");
    } else {
      ::setenv("RANK", rank, 1);
    }
  }
  ~ScopedRank() {
    if (old_.has_value()) {
      ::setenv("RANK", old_->c_str(), 1);
    } else {
      ::unsetenv("RANK");
    }
  }

 private:
  std::optional<std::string> old_;
};

TEST_F(CheckpointTest, RoundTripIsBitExact) {
  ASSERT_TRUE(Write(P("ck")).ok());
  EXPECT_TRUE(fs::exists(P("ck/model.safetensors")));
  EXPECT_FALSE(fs::exists(P("ck/model.safetensors.index.json")));
  auto r = CheckpointReader::Open(P("ck"), {.verify = CheckpointReaderOptions::Verify::kAlways});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)->config()["model_type"], "llama");
  for (const auto& [name, want] : Tensors()) {
    auto got = (*r)->Tensor(name);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->scalar_type(), want.scalar_type()) << name;
    EXPECT_EQ(got->sizes(), want.sizes()) << name;
    EXPECT_TRUE(at::equal(*got, want)) << name;  // bf16/f16 compared bit for bit
  }
  EXPECT_EQ((*r)->Tensor("nope").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(CheckpointTest, TensorsOutliveTheReaderAndWritesStayPrivate) {
  ASSERT_TRUE(Write(P("ck")).ok());
  at::Tensor t;
  {
    auto r = CheckpointReader::Open(P("ck"));
    ASSERT_TRUE(r.ok());
    t = (*r)->TensorOrThrow("model.layers.0.mlp.up_proj.weight");
  }
  t.add_(1.0);  // copy-on-write mapping: the file does not change
  EXPECT_TRUE(VerifyCheckpoint(P("ck")).ok());
}

TEST_F(CheckpointTest, ShardsWithIndexAndIdenticalBytes) {
  CheckpointWriterOptions o;
  o.max_shard_bytes = 520;  // 3 shards: 517 + 512 + 88 bytes
  ASSERT_TRUE(Write(P("a"), o).ok());
  ASSERT_TRUE(Write(P("b"), o).ok());
  ASSERT_TRUE(fs::exists(P("a/model.safetensors.index.json")));
  EXPECT_TRUE(fs::exists(P("a/model-00001-of-00003.safetensors")));
  auto r = CheckpointReader::Open(P("a"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)->shards().size(), 3u);
  EXPECT_EQ((*r)->TensorNames().size(), Tensors().size());
  for (const auto& [name, want] : Tensors()) {
    EXPECT_TRUE(at::equal((*r)->TensorOrThrow(name), want)) << name;
  }
  for (const auto& shard : (*r)->shards()) {
    EXPECT_EQ(*Sha256File(P("a/" + shard)), *Sha256File(P("b/" + shard))) << shard;
  }
  EXPECT_EQ(*Sha256File(P("a/stemma.json")), *Sha256File(P("b/stemma.json")));
}

// Declared, then written one by one in reverse order (the sharded trainer's way): the same
// files, byte for byte, as adding every tensor and committing.
TEST_F(CheckpointTest, StreamedTensorsGiveTheSameFiles) {
  CheckpointWriterOptions o;
  o.max_shard_bytes = 520;  // 3 shards, as above
  ASSERT_TRUE(Write(P("added"), o).ok());
  o.created_ms = 1;
  auto w = CheckpointWriter::Create(P("streamed"), o);
  ASSERT_TRUE(w.ok()) << w.status();
  const auto tensors = Tensors();
  for (const auto& [name, t] : tensors) {
    const Dtype dtype = t.scalar_type() == at::kBFloat16 ? Dtype::kBF16
                        : t.scalar_type() == at::kHalf   ? Dtype::kF16
                        : t.scalar_type() == at::kDouble ? Dtype::kF64
                        : t.scalar_type() == at::kLong   ? Dtype::kI64
                        : t.scalar_type() == at::kInt    ? Dtype::kI32
                        : t.scalar_type() == at::kBool   ? Dtype::kBool
                                                         : Dtype::kF32;
    ASSERT_TRUE((*w)->DeclareTensor(name, dtype, t.sizes().vec()).ok()) << name;
  }
  EXPECT_EQ((*w)->WriteTensor("undeclared", at::zeros({1})).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*w)->WriteTensor("model.norm.weight", at::zeros({9}, at::kDouble)).code(),
            absl::StatusCode::kInvalidArgument);
  for (auto it = tensors.rbegin(); it != tensors.rend(); ++it) {
    ASSERT_TRUE((*w)->WriteTensor(it->first, it->second).ok()) << it->first;
  }
  ASSERT_TRUE((*w)->AddFile("config.json", R"({"model_type":"llama"})").ok());
  ASSERT_TRUE((*w)->Commit().ok());
  for (const char* file :
       {"model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
        "model-00003-of-00003.safetensors", "model.safetensors.index.json", "stemma.json"}) {
    EXPECT_EQ(*Sha256File(P(std::string("added/") + file)),
              *Sha256File(P(std::string("streamed/") + file)))
        << file;
  }
}

// A declared tensor that was never written: nothing is published.
TEST_F(CheckpointTest, StreamedCommitRefusesAMissingTensor) {
  auto w = CheckpointWriter::Create(P("partial"));
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE((*w)->DeclareTensor("a", Dtype::kF32, {2}).ok());
  ASSERT_TRUE((*w)->DeclareTensor("b", Dtype::kF32, {3}).ok());
  ASSERT_TRUE((*w)->WriteTensor("a", at::ones({2})).ok());
  EXPECT_EQ((*w)->Commit().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(fs::exists(P("partial")));
}

// Laying out the shard files fails part-way (the second shard's name is taken by a
// directory): every later write and the commit fail with that error, nothing is written into
// a shard that was never laid out, and nothing is published.
TEST_F(CheckpointTest, AStreamedLayoutThatFailsStaysFailed) {
  CheckpointWriterOptions o;
  o.max_shard_bytes = 8;  // one 8-byte tensor per shard
  auto w = CheckpointWriter::Create(P("broken"), o);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE((*w)->DeclareTensor("a", Dtype::kF32, {2}).ok());
  ASSERT_TRUE((*w)->DeclareTensor("b", Dtype::kF32, {2}).ok());
  fs::create_directory(fs::path((*w)->staging_dir()) / "model-00002-of-00002.safetensors");
  const absl::Status first = (*w)->WriteTensor("a", at::ones({2}));
  EXPECT_FALSE(first.ok());
  EXPECT_EQ((*w)->WriteTensor("b", at::ones({2})), first);
  EXPECT_EQ((*w)->WriteTensor("a", at::ones({2})), first);
  EXPECT_FALSE((*w)->Commit().ok());
  EXPECT_FALSE(fs::exists(P("broken")));
}

TEST_F(CheckpointTest, ManifestRecordsParentsProducerAndCarriedFiles) {
  ASSERT_TRUE(Write(P("base")).ok());
  ASSERT_TRUE(WriteFileSynced(P("base/tokenizer.json"), "{}").ok());
  CheckpointWriterOptions o;
  o.source_dir = P("base");
  o.parents = {P("base")};
  o.producer = {"job-1", "att-2", "train", {{"lr", 0.001}}};
  ASSERT_TRUE(Write(P("child"), o).ok());
  EXPECT_TRUE(fs::exists(P("child/tokenizer.json")));
  auto m = ParseManifest(*ReadFile(P("child/stemma.json")), "stemma.json");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->parents.at(0).manifest_sha256, *Sha256File(P("base/stemma.json")));
  EXPECT_EQ(m->producer.job, "job-1");
  EXPECT_EQ(m->producer.params["lr"], 0.001);
  EXPECT_TRUE(m->files.count("tokenizer.json"));
  EXPECT_TRUE(m->files.count("config.json"));  // AddFile wins over the copy
}

TEST_F(CheckpointTest, RefusesToOverwriteUnlessAsked) {
  ASSERT_TRUE(Write(P("ck")).ok());
  EXPECT_EQ(Write(P("ck")).code(), absl::StatusCode::kAlreadyExists);
  CheckpointWriterOptions o;
  o.overwrite = true;
  o.max_shard_bytes = 520;
  ASSERT_TRUE(Write(P("ck"), o).ok());
  EXPECT_TRUE(fs::exists(P("ck/model.safetensors.index.json")));
  EXPECT_FALSE(fs::exists(P("ck/model.safetensors")));
  EXPECT_TRUE(VerifyCheckpoint(P("ck")).ok());
}

TEST_F(CheckpointTest, FlippedBitIsCaughtNamingFileAndTensor) {
  const std::string shard = WriteAndDamage("model.layers.0.mlp.up_proj.weight");
  absl::Status s = VerifyCheckpoint(P("ck"));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find(shard), std::string::npos) << s;
  EXPECT_NE(s.message().find("model.layers.0.mlp.up_proj.weight"), std::string::npos) << s;
  EXPECT_EQ(CheckpointReader::Open(P("ck")).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(
      CheckpointReader::Open(P("ck"), {.verify = CheckpointReaderOptions::Verify::kNever}).ok());
}

TEST_F(CheckpointTest, TruncatedShardIsRefusedNamingTheTensor) {
  ASSERT_TRUE(Write(P("ck")).ok());
  const std::string path = P("ck/model.safetensors");
  fs::resize_file(path, fs::file_size(path) - 3);
  absl::Status s = VerifyCheckpoint(P("ck"));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("model.safetensors: tensor"), std::string::npos) << s;
  // Without a manifest check, the header validation still names it.
  auto r = CheckpointReader::Open(P("ck"), {.verify = CheckpointReaderOptions::Verify::kNever});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("tensor"), std::string::npos) << r.status();
}

// The model every rank of a job opens is hashed by rank 0 only (Verify::kOncePerJob): a
// damaged file fails rank 0, naming it, and with it the attempt; the other ranks check sizes.
TEST_F(CheckpointTest, OncePerJobHashesOnRankZeroOnly) {
  using Verify = CheckpointReaderOptions::Verify;
  const std::string shard = WriteAndDamage("model.layers.0.mlp.up_proj.weight");
  for (const char* rank0 : {"0", static_cast<const char*>(nullptr)}) {
    ScopedRank rank(rank0);
    auto r = CheckpointReader::Open(P("ck"), {.verify = Verify::kOncePerJob});
    ASSERT_FALSE(r.ok()) << "RANK=" << (rank0 ? rank0 : "unset");
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_NE(r.status().message().find(P("ck/" + shard)), std::string::npos) << r.status();
  }
  // Rank 1 reads no file's contents: the same-size damage goes unseen there (rank 0 has it).
  ScopedRank rank("1");
  EXPECT_EQ(VerifyForThisRank(Verify::kOncePerJob), Verify::kSizes);
  auto r = CheckpointReader::Open(P("ck"), {.verify = Verify::kOncePerJob});
  EXPECT_TRUE(r.ok()) << r.status();
  // An explicit policy is not overridden by RANK.
  EXPECT_EQ(CheckpointReader::Open(P("ck")).status().code(), absl::StatusCode::kDataLoss);
}

TEST_F(CheckpointTest, EveryRankCatchesAShardOfTheWrongSize) {
  CheckpointWriterOptions o;
  o.max_shard_bytes = 520;
  ASSERT_TRUE(Write(P("ck"), o).ok());
  const std::string path = P("ck/model-00002-of-00003.safetensors");
  const uint64_t size = fs::file_size(path);
  for (uint64_t wrong : {size - 1, size + 4}) {
    fs::resize_file(path, wrong);
    for (const char* rank : {"0", "1", "7"}) {
      ScopedRank scoped(rank);
      auto r =
          CheckpointReader::Open(P("ck"), {.verify = CheckpointReaderOptions::Verify::kOncePerJob});
      ASSERT_FALSE(r.ok()) << "RANK=" << rank;
      EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
      EXPECT_NE(r.status().message().find(path), std::string::npos) << r.status();
      EXPECT_NE(r.status().message().find(absl::StrCat(wrong, " bytes, manifest says ", size)),
                std::string::npos)
          << r.status();
    }
  }
  fs::remove(path);
  ScopedRank scoped("1");
  EXPECT_EQ(VerifyCheckpointSizes(P("ck")).code(), absl::StatusCode::kNotFound);
}

TEST_F(CheckpointTest, FailedPublishLeavesNothing) {
  CheckpointWriterOptions o;
  o.max_shard_bytes = 520;
  o.after_file_for_test = [](absl::string_view file) {
    return file == "model-00002-of-00003.safetensors" ? absl::InternalError("injected")
                                                      : absl::OkStatus();
  };
  EXPECT_EQ(Write(P("ck"), o).code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(fs::is_empty(root_)) << "staging or target left behind";
}

TEST_F(CheckpointTest, KilledWriterPublishesNothing) {
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    CheckpointWriterOptions o;
    o.max_shard_bytes = 520;
    o.after_file_for_test = [](absl::string_view file) {
      if (file == "stemma.json") ::raise(SIGKILL);  // everything written, not yet renamed
      return absl::OkStatus();
    };
    (void)Write(P("ck"), o);
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_FALSE(fs::exists(P("ck")));
  EXPECT_TRUE(fs::exists(P("ck.tmp-" + std::to_string(pid))));  // the only trace
}

TEST_F(CheckpointTest, DirectoryWithoutWeightsIsNotFound) {
  fs::create_directories(P("empty"));
  EXPECT_EQ(CheckpointReader::Open(P("empty")).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(VerifyCheckpoint(P("empty")).code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace stemma::engine::io
