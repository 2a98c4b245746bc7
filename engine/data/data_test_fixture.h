// The fixture the data pipeline's unit tests share (data_test.cc, text_input_test.cc): a
// directory of the test's own with the byte tokenizer in tok/, files written into it, and
// tokenize specs as the command sees them (the schema's defaults filled).
#pragma once

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/engine_spec.h"
#include "gtest/gtest.h"
#include "stemma/v1/specs/data.pb.h"

// gtest without gmock: substring check that prints both strings.
#define EXPECT_CONTAINS(text, sub)                          \
  EXPECT_NE(std::string(text).find(sub), std::string::npos) \
      << "'" << std::string(text) << "' does not contain '" << std::string(sub) << "'"

namespace stemma::engine::data {

class ByteTokenizerTest : public ::testing::Test {
 protected:
  // <tmp>/stemma_<suite>_<pid>_<test>, fresh, with tok/stemma_tokenizer.json (bytes).
  void SetUp() override {
    const ::testing::TestInfo* test = ::testing::UnitTest::GetInstance()->current_test_info();
    root_ = std::filesystem::temp_directory_path() /
            ("stemma_" + std::string(test->test_suite_name()) + "_" + std::to_string(::getpid()) +
             "_" + test->name());
    std::filesystem::remove_all(root_);
    std::filesystem::create_directories(root_ / "tok");
    Write("tok/stemma_tokenizer.json", R"({"type": "bytes"})");
  }
  void TearDown() override { std::filesystem::remove_all(root_); }

  std::string Path(const std::string& rel) const { return (root_ / rel).string(); }
  // Writes `contents` to `rel` (making its directory); returns the absolute path.
  std::string Write(const std::string& rel, const std::string& contents) const {
    std::filesystem::create_directories(std::filesystem::path(Path(rel)).parent_path());
    std::ofstream(Path(rel), std::ios::binary) << contents;
    return Path(rel);
  }
  // A tokenize spec over `inputs` with the byte tokenizer, language "xx", into `out`.
  v1::TokenizeSpec Spec(std::vector<std::string> inputs, const std::string& format,
                        const std::string& out) const {
    v1::TokenizeSpec o;
    o.set_tokenizer(Path("tok"));
    for (std::string& input : inputs) o.add_input(std::move(input));
    o.set_format(format);
    o.set_language("xx");
    o.set_out(Path(out));
    FillSpecDefaults(&o);
    return o;
  }

  std::filesystem::path root_;
};

}  // namespace stemma::engine::data
