// stemma.json: the manifest beside every checkpoint Stemma writes (docs/engine-io.md).
//   {"format": 1,
//    "files": {"model.safetensors": {"sha256": "...", "bytes": N, "tensors": {name: sha256}}},
//    "parents": [{"path": "/ckpt/base", "manifest_sha256": "..." | null}],
//    "producer": {"job": "...", "attempt": "...", "command": "...", "params": {...}},
//    "created_ms": 1700000000000,
//    "type": "checkpoint" | "dataset"}
// "type" says what Stemma wrote (absent in manifests older than it: a checkpoint);
// `overwrite` replaces only a directory whose manifest parses (engine/io/durable.h).
// "tensors" (sha256 of each tensor's bytes) is present for safetensors files only, so a
// damaged file can be narrowed to the damaged tensor.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace stemma::engine::io {

inline constexpr char kManifestName[] = "stemma.json";
inline constexpr int kManifestFormat = 1;

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
// `source` names the file in errors. InvalidArgument for malformed JSON or fields,
// Unimplemented for a newer format.
absl::StatusOr<Manifest> ParseManifest(absl::string_view text, absl::string_view source);

}  // namespace stemma::engine::io
