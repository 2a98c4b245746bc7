// The bounds of the YAML reader: what a hostile or careless file gets (issue 13).
#include "common/yaml_json.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>

namespace stemma {
namespace {

std::string Error(const std::string& text) {
  auto docs = LoadYamlDocuments(text, "job.yaml");
  EXPECT_FALSE(docs.ok()) << text.substr(0, 200);
  return docs.ok() ? "" : std::string(docs.status().message());
}

// The 287-byte shape from the issue: nine levels of nine-fold aliases (9^9 nodes).
std::string AliasBomb(int levels, int fan) {
  std::string text = "a0: &a0 [x]\n";
  for (int i = 1; i <= levels; ++i) {
    text += "a" + std::to_string(i) + ": &a" + std::to_string(i) + " [";
    for (int j = 0; j < fan; ++j) text += (j ? ",*a" : "*a") + std::to_string(i - 1);
    text += "]\n";
  }
  return text;
}

TEST(YamlBounds, AliasBombIsRefusedQuicklyAndNamesTheFile) {
  const std::string bomb = AliasBomb(9, 9);
  ASSERT_LT(bomb.size(), 600u);
  const std::string err = Error(bomb);
  EXPECT_NE(err.find("job.yaml: line"), std::string::npos) << err;
  EXPECT_NE(err.find("expands to more than"), std::string::npos) << err;
  // The work done before refusing is bounded by the budget the message names (4 nodes per
  // input byte), not by the 387 million nodes the file describes.
  EXPECT_NE(err.find("more than 10"), std::string::npos) << err;
  EXPECT_NE(err.find("4 per input byte"), std::string::npos) << err;
}

TEST(YamlBounds, ModestAliasesStillWork) {
  auto docs = LoadYamlDocuments(AliasBomb(3, 3) + "use: *a3\n", "ok.yaml");
  ASSERT_TRUE(docs.ok()) << docs.status();
  std::string json;
  AppendYamlAsJson((*docs)[0], &json);
  EXPECT_NE(json.find("\"use\":[[[[\"x\"]"), std::string::npos) << json;
}

TEST(YamlBounds, DeepNestingIsRefusedAtTheLimitNotAfterIt) {
  std::string deep(100000, '[');
  const std::string err = Error(deep);
  EXPECT_NE(err.find("nested deeper than 128 levels"), std::string::npos) << err;
  std::string ok(100, '[');
  ok += std::string(100, ']');
  EXPECT_TRUE(LoadYamlDocuments(ok, "ok.yaml").ok());
  std::string maps;
  for (int i = 0; i < 200; ++i) maps += std::string(i * 2, ' ') + "k:\n";
  EXPECT_NE(Error(maps).find("nested deeper"), std::string::npos);
}

TEST(YamlBounds, DuplicateKeysAreRefusedWithBothLines) {
  const std::string err = Error("name: a\nnoop: {duration_ms: 1}\nname: b\n");
  EXPECT_NE(err.find("job.yaml: line 3: duplicate key 'name' (first at line 1)"), std::string::npos)
      << err;
  EXPECT_NE(Error("x: {a: 1, b: 2, a: 3}\n").find("duplicate key 'a'"), std::string::npos);
  // The same key in different mappings is fine.
  EXPECT_TRUE(LoadYamlDocuments("- {a: 1}\n- {a: 2}\n", "ok.yaml").ok());
}

TEST(YamlBounds, TooManyAliasesAreRefused) {
  std::string text = "d: &d 1\nl: [";
  for (size_t i = 0; i <= kMaxYamlAliases; ++i) text += i ? ",*d" : "*d";
  text += "]\n";
  EXPECT_NE(Error(text).find("aliases"), std::string::npos);
}

TEST(YamlBounds, ALargeOrdinaryFileIsWithinTheBudget) {
  std::string text = "jobs:\n";
  for (int i = 0; i < 20000; ++i) {
    text +=
        "  - {name: j" + std::to_string(i) + ", labels: {a: b, c: d}, noop: {duration_ms: 1}}\n";
  }
  auto docs = LoadYamlDocuments(text, "big.yaml");
  ASSERT_TRUE(docs.ok()) << docs.status();
  EXPECT_EQ((*docs)[0].Find("jobs")->size(), 20000u);
}

}  // namespace
}  // namespace stemma
