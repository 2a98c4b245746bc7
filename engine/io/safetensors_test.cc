#include "engine/io/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "engine/io/fs.h"
#include "engine/io/sha256.h"

namespace stemma::engine::io {
namespace {

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("stemma-st-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Path(const std::string& name) { return (dir_ / name).string(); }
  // Writes a raw file: 8-byte length, header, data.
  std::string Raw(const std::string& name, const std::string& header, const std::string& data) {
    std::string bytes(8, '\0');
    uint64_t n = header.size();
    for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>(n >> (8 * i));
    bytes += header + data;
    EXPECT_TRUE(WriteFileSynced(Path(name), bytes).ok());
    return Path(name);
  }
  std::filesystem::path dir_;
};

TEST_F(SafetensorsTest, RoundTripsEveryDtypeAndShape) {
  const Dtype dtypes[] = {Dtype::kF64, Dtype::kF32, Dtype::kF16, Dtype::kBF16, Dtype::kI64,
                          Dtype::kI32, Dtype::kI16, Dtype::kI8,  Dtype::kU8,   Dtype::kBool};
  const std::vector<std::vector<int64_t>> shapes = {{}, {0}, {3}, {2, 3}, {2, 0, 4}, {1, 2, 3}};
  std::vector<std::string> buffers;
  std::vector<TensorToWrite> writes;
  for (Dtype d : dtypes) {
    for (size_t s = 0; s < shapes.size(); ++s) {
      int64_t numel = 1;
      for (int64_t x : shapes[s]) numel *= x;
      std::string bytes(numel * DtypeSize(d), '\0');
      for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>((i * 37 + s) & 1);
      buffers.push_back(bytes);
      writes.push_back({std::string(DtypeName(d)) + "." + std::to_string(s), d, shapes[s], nullptr,
                        bytes.size()});
    }
  }
  for (size_t i = 0; i < writes.size(); ++i) writes[i].data = buffers[i].data();
  auto written = WriteSafetensors(Path("a.safetensors"), writes);
  ASSERT_TRUE(written.ok()) << written.status();
  auto file = SafetensorsFile::Open(Path("a.safetensors"));
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->metadata().at("format"), "pt");
  EXPECT_EQ((*file)->header_bytes() % 8, 0u);
  ASSERT_EQ((*file)->tensors().size(), writes.size());
  for (size_t i = 0; i < writes.size(); ++i) {
    const TensorInfo* t = (*file)->Find(writes[i].name);
    ASSERT_NE(t, nullptr) << writes[i].name;
    EXPECT_EQ(t->dtype, writes[i].dtype);
    EXPECT_EQ(t->shape, writes[i].shape);
    ASSERT_EQ(t->nbytes(), buffers[i].size());
    EXPECT_EQ(std::memcmp((*file)->Data(*t), buffers[i].data(), t->nbytes()), 0);
    // Ordered by element size, so every tensor is aligned for zero-copy use.
    EXPECT_EQ(reinterpret_cast<uintptr_t>((*file)->Data(*t)) % DtypeSize(t->dtype), 0u);
  }
  auto sha = Sha256File(Path("a.safetensors"));
  ASSERT_TRUE(sha.ok());
  EXPECT_EQ(*sha, written->sha256);
}

TEST_F(SafetensorsTest, WritingTwiceGivesTheSameBytes) {
  std::vector<float> a = {1, 2, 3}, b = {4};
  std::vector<TensorToWrite> w1 = {{"b", Dtype::kF32, {1}, b.data(), 4},
                                   {"a", Dtype::kF32, {3}, a.data(), 12}};
  std::vector<TensorToWrite> w2 = {w1[1], w1[0]};  // other insertion order
  auto r1 = WriteSafetensors(Path("1.safetensors"), w1);
  auto r2 = WriteSafetensors(Path("2.safetensors"), w2);
  ASSERT_TRUE(r1.ok() && r2.ok());
  EXPECT_EQ(r1->sha256, r2->sha256);
}

TEST_F(SafetensorsTest, RejectsDuplicateNamesAndSizeMismatch) {
  float x[2] = {};
  EXPECT_FALSE(WriteSafetensors(Path("d.safetensors"),
                                {{"a", Dtype::kF32, {1}, x, 4}, {"a", Dtype::kF16, {2}, x, 4}})
                   .ok());
  EXPECT_FALSE(WriteSafetensors(Path("s.safetensors"), {{"a", Dtype::kF32, {2}, x, 4}}).ok());
}

struct Damage {
  const char* test;
  std::string header;
  std::string data;
  const char* message;  // expected in the error
};

TEST_F(SafetensorsTest, DamagedFilesNameFileAndTensor) {
  const Damage cases[] = {
      {"bad json", "{\"a\": {", "", "not a JSON object"},
      {"unknown dtype", R"({"w":{"dtype":"Q4","shape":[1],"data_offsets":[0,1]}})", "x",
       "tensor \"w\": unsupported dtype"},
      {"offset beyond data (truncated)",
       R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", std::string(8, 'x'),
       "tensor \"w\": data_offsets [0, 16) beyond"},
      {"shape mismatch", R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})",
       std::string(8, 'x'), "tensor \"w\": shape and dtype need 12 bytes"},
      {"overlap",
       R"({"u":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"v":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
       std::string(12, 'x'), "overlaps"},
      {"hole", R"({"u":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", std::string(8, 'x'),
       "belong to no tensor"},
      {"negative dim", R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,0]}})", "",
       "tensor \"w\": shape has a negative"},
  };
  for (const auto& c : cases) {
    std::string path = Raw("bad.safetensors", c.header, c.data);
    auto f = SafetensorsFile::Open(path);
    ASSERT_FALSE(f.ok()) << c.test;
    EXPECT_NE(f.status().message().find(path), std::string::npos) << c.test << f.status();
    EXPECT_NE(f.status().message().find(c.message), std::string::npos) << c.test << f.status();
  }
}

TEST_F(SafetensorsTest, HeaderLengthBounds) {
  // Length field larger than the file; and an absurd length.
  std::string bytes = std::string("\x10\x00\x00\x00\x00\x00\x00\x00", 8) + "{}";
  ASSERT_TRUE(WriteFileSynced(Path("short.safetensors"), bytes).ok());
  auto f = SafetensorsFile::Open(Path("short.safetensors"));
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("truncated"), std::string::npos) << f.status();
  bytes = std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8) + "{}";
  ASSERT_TRUE(WriteFileSynced(Path("huge.safetensors"), bytes).ok());
  EXPECT_FALSE(SafetensorsFile::Open(Path("huge.safetensors")).ok());
  ASSERT_TRUE(WriteFileSynced(Path("tiny.safetensors"), "abc").ok());
  EXPECT_FALSE(SafetensorsFile::Open(Path("tiny.safetensors")).ok());
  EXPECT_EQ(SafetensorsFile::Open(Path("missing.safetensors")).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(SafetensorsTest, TruncatedWrittenFileNamesTheLastTensor) {
  std::vector<float> a(16, 1.f), z(16, 2.f);
  ASSERT_TRUE(WriteSafetensors(Path("t.safetensors"), {{"a", Dtype::kF32, {16}, a.data(), 64},
                                                       {"z", Dtype::kF32, {16}, z.data(), 64}})
                  .ok());
  std::filesystem::resize_file(Path("t.safetensors"),
                               std::filesystem::file_size(Path("t.safetensors")) - 10);
  auto f = SafetensorsFile::Open(Path("t.safetensors"));
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("tensor \"z\""), std::string::npos) << f.status();
}

TEST(Sha256Test, KnownVectors) {
  EXPECT_EQ(Sha256Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

}  // namespace
}  // namespace stemma::engine::io
