// The one manifest reader (common/manifest.h): stemma.json both ways, the files a manifest
// lists in either form, and which file is an artifact's manifest.
#include "common/manifest.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "common/files.h"

namespace stemma::manifest {
namespace {

namespace fs = std::filesystem;

TEST(Manifest, RoundTripsThroughJson) {
  Manifest m;
  m.type = kManifestTypeDataset;
  m.files["model.safetensors"] = ManifestFile{"ab", 12, {{"w", "cd"}}};
  m.parents.push_back(ManifestParent{"/ckpt/base", ""});
  m.producer.command = "train";
  m.created_ms = 5;
  auto back = ParseManifest(ManifestToJson(m).dump(), "x/stemma.json");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->type, kManifestTypeDataset);
  EXPECT_EQ(back->files.at("model.safetensors").bytes, 12u);
  EXPECT_EQ(back->files.at("model.safetensors").tensor_sha256.at("w"), "cd");
  EXPECT_EQ(back->parents.at(0).path, "/ckpt/base");
  EXPECT_EQ(back->parents.at(0).manifest_sha256, "");
  EXPECT_EQ(back->producer.command, "train");
  EXPECT_EQ(back->created_ms, 5);
}

TEST(Manifest, ErrorsNameTheFile) {
  EXPECT_EQ(ParseManifest("[]", "a/stemma.json").status().message(),
            "a/stemma.json: not a JSON object");
  EXPECT_EQ(
      ParseManifest(R"({"format": 1, "files": {"x": {}}})", "a/stemma.json").status().message(),
      "a/stemma.json: files.x: needs sha256 and bytes");
  EXPECT_EQ(ParseManifest(R"({"format": 9, "files": {}})", "a").status().code(),
            absl::StatusCode::kUnimplemented);
}

TEST(Manifest, ListsTheFilesOfEitherForm) {
  const auto checkpoint = nlohmann::json::parse(
      R"({"format": 1, "files": {"b": {"sha256": "s2"}, "a": {"sha256": "s1", "bytes": 3}}})");
  std::vector<ListedFile> listed = ListedFiles(checkpoint);
  ASSERT_EQ(listed.size(), 2u);
  EXPECT_EQ(listed[0].path, "a");
  EXPECT_EQ(listed[0].sha256, "s1");
  EXPECT_EQ(listed[0].bytes, 3);
  EXPECT_EQ(listed[1].path, "b");
  EXPECT_FALSE(listed[1].bytes.has_value());
  EXPECT_FALSE(IsCorpusManifest(checkpoint));

  const auto corpus = nlohmann::json::parse(
      R"({"format": "stemma.corpus/1", "files": [{"path": "train/uk.txt", "bytes": 7,
          "sha256": "s3"}, {"bytes": 1}, 5]})");
  EXPECT_TRUE(IsCorpusManifest(corpus));
  listed = ListedFiles(corpus);
  ASSERT_EQ(listed.size(), 3u);
  EXPECT_EQ(listed[0].path, "train/uk.txt");
  EXPECT_EQ(listed[0].bytes, 7);
  EXPECT_EQ(listed[1].path, "");  // reported by the caller, not dropped
  EXPECT_EQ(listed[2].sha256, "");
  EXPECT_TRUE(ListedFiles(nlohmann::json::parse(R"({"format": 1})")).empty());

  // A token dataset's index.json: its shards in order, then index.bin, sized by their counts.
  const auto tokens = nlohmann::json::parse(
      R"({"format": "stemma-tokens-v1", "num_documents": 2,
          "documents": {"file": "index.bin", "sha256": "d"},
          "shards": [{"file": "shard-00000.bin", "num_tokens": 5, "sha256": "s0"},
                     {"file": "shard-00001.bin", "sha256": "s1"}]})");
  EXPECT_TRUE(IsTokenIndex(tokens));
  EXPECT_FALSE(IsCorpusManifest(tokens));
  listed = ListedFiles(tokens);
  ASSERT_EQ(listed.size(), 3u);
  EXPECT_EQ(listed[0].path, "shard-00000.bin");
  EXPECT_EQ(listed[0].bytes, 20);
  EXPECT_EQ(listed[1].sha256, "s1");
  EXPECT_FALSE(listed[1].bytes.has_value());  // no num_tokens: no size to check
  EXPECT_EQ(listed[2].path, "index.bin");
  EXPECT_EQ(listed[2].bytes, 24);
}

TEST(Manifest, TheManifestFileOfAnArtifact) {
  const std::string dir =
      fs::temp_directory_path() / ("stemma-manifest-" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir + "/corpus");
  fs::create_directories(dir + "/ckpt");
  ASSERT_TRUE(files::WriteFileSynced(dir + "/corpus/manifest.json", "{}").ok());
  ASSERT_TRUE(files::WriteFileSynced(dir + "/ckpt/stemma.json", "{}").ok());
  ASSERT_TRUE(files::WriteFileSynced(dir + "/ckpt/manifest.json", "{}").ok());
  ASSERT_TRUE(files::WriteFileSynced(dir + "/file.bin", "x").ok());
  fs::create_directories(dir + "/tokens");
  ASSERT_TRUE(files::WriteFileSynced(dir + "/tokens/index.json", "{}").ok());
  EXPECT_EQ(ManifestPathOf(dir + "/tokens"), dir + "/tokens/index.json");
  EXPECT_EQ(ManifestPathOf(dir + "/corpus"), dir + "/corpus/manifest.json");
  EXPECT_EQ(ManifestPathOf(dir + "/ckpt"), dir + "/ckpt/stemma.json");
  EXPECT_EQ(ManifestPathOf(dir + "/file.bin"), dir + "/file.bin");
  EXPECT_EQ(ManifestPathOf(dir + "/missing"), dir + "/missing");
  fs::remove_all(dir);
}

}  // namespace
}  // namespace stemma::manifest
