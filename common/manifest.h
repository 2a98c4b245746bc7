// The one reader of the manifests Stemma writes beside its results, shared by the engine
// (which writes them) and the coordinator (which registers, verifies and memoizes on them).
// Torch-free; no I/O except ManifestPathOf (a stat or two).
//
// stemma.json: the manifest beside every checkpoint and dataset (docs/engine-io.md).
//   {"format": 1,
//    "files": {"model.safetensors": {"sha256": "...", "bytes": N, "tensors": {name: sha256}}},
//    "parents": [{"path": "/ckpt/base", "manifest_sha256": "..." | null}],
//    "producer": {"job": "...", "attempt": "...", "command": "...", "params": {...}},
//    "created_ms": 1700000000000,
//    "type": "checkpoint" | "dataset"}
// "type" says what Stemma wrote (absent in manifests older than it: a checkpoint).
// "tensors" (sha256 of each tensor's bytes) is present for safetensors files only, so a
// damaged file can be narrowed to the damaged tensor.
//
// manifest.json with "format": "stemma.corpus/N": a prepared corpus (`stemma-engine prepare`,
// docs/corpus.md); its "files" is a list of {path, bytes, lines, sha256} and "content_hash"
// the sha256 of the sorted "<sha256>  <path>\n" lines.
//
// index.json with "format": "stemma-tokens-v1": a token dataset (`stemma-engine tokenize`,
// docs/data-format.md); it lists every shard and index.bin with their sha256, so it is the
// dataset's manifest.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace stemma::manifest {

inline constexpr char kManifestName[] = "stemma.json";
inline constexpr int kManifestFormat = 1;
inline constexpr char kCorpusManifestName[] = "manifest.json";
inline constexpr char kCorpusFormatPrefix[] = "stemma.corpus/";
inline constexpr char kTokenIndexName[] = "index.json";
inline constexpr char kTokenIndexFormatPrefix[] = "stemma-tokens";

struct ManifestFile {
  std::string sha256;
  uint64_t bytes = 0;
  std::map<std::string, std::string> tensor_sha256;  // safetensors files only
};

struct ManifestParent {
  std::string path;
  std::string manifest_sha256;  // empty: the parent has no stemma.json (e.g. from the Hub)
};

struct ManifestProducer {
  std::string job;
  std::string attempt;
  std::string command;
  nlohmann::json params = nlohmann::json::object();
};

inline constexpr char kManifestTypeCheckpoint[] = "checkpoint";
inline constexpr char kManifestTypeDataset[] = "dataset";

struct Manifest {
  int format = kManifestFormat;
  std::string type = kManifestTypeCheckpoint;  // checkpoint | dataset
  std::map<std::string, ManifestFile> files;   // by file name, relative to the checkpoint
  std::vector<ManifestParent> parents;
  ManifestProducer producer;
  int64_t created_ms = 0;
};

nlohmann::json ManifestToJson(const Manifest& manifest);
// A stemma.json's text. `source` names the file in errors. InvalidArgument for malformed
// JSON or fields, Unimplemented for a newer format.
absl::StatusOr<Manifest> ParseManifest(absl::string_view text, absl::string_view source);

// Whether `j` is a corpus manifest (an object whose "format" starts with stemma.corpus/).
bool IsCorpusManifest(const nlohmann::json& j);
// Whether `j` is a token dataset's index.json (an object whose "format" starts with
// stemma-tokens).
bool IsTokenIndex(const nlohmann::json& j);

// One file a manifest lists, in any of its forms (stemma.json's "files" object, a corpus
// manifest's "files" list, a token index's "shards" and "documents"), relative to the
// manifest's directory.
struct ListedFile {
  std::string path;              // "" when the entry has none
  std::string sha256;            // "" when the entry has none
  std::optional<int64_t> bytes;  // when the entry records an integer size
};

// Every entry of a parsed manifest's "files", in the manifest's order (a stemma.json's keys
// sorted; a token index's shards in order, then index.bin, with the sizes their token and
// document counts imply); an entry that is not an object, or has no string path, sha256 or
// integer bytes, is listed with "" / no bytes there, for the caller to judge. Empty when `j`
// has no files of any form.
std::vector<ListedFile> ListedFiles(const nlohmann::json& j);

// The file whose sha256 is an artifact's manifest hash: <path>/stemma.json for a directory
// (checkpoint, dataset), else <path>/manifest.json for a prepared corpus, else
// <path>/index.json for a token dataset; stemma.json for a directory with none of them;
// `path` itself otherwise (a file).
std::string ManifestPathOf(const std::string& path);

}  // namespace stemma::manifest
