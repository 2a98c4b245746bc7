// The engine's JSON-line events on stdout (docs/engine-events.md, names in
// common/engine_contract.h): one object per line with "event" as its first key, flushed at
// once so the worker sees progress as it happens. Human logs go to stderr. Torch-free.
//
// Every command writes its events through one EventWriter, and announces each result it
// published with OutputEvent(...), which reads the result's stemma.json so the worker can
// register it (type, manifest sha256, bytes, parents, operation).
#pragma once

#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace stemma::engine {

// Ordered, so that "event" stays the first key as the worker expects.
using Event = nlohmann::ordered_json;

// Writes events as lines. Emit is one fwrite + fflush of a whole line, so lines from two
// threads never interleave (stdio locks the stream); the writer itself holds no state.
class EventWriter {
 public:
  // `enabled` false: every Emit is dropped (data-parallel ranks other than 0).
  explicit EventWriter(bool enabled = true, std::FILE* out = stdout)
      : enabled_(enabled), out_(out) {}

  // {"event": name, <fields...>}. `fields` must be an object (or null for none).
  void Emit(std::string_view name, const Event& fields) const;
  void Emit(const char* name) const { Emit(std::string_view(name), Event::object()); }
  // An event built by the caller; its "event" key is moved to the front if it is not there.
  void Emit(const Event& event) const;

  bool enabled() const { return enabled_; }

 private:
  bool enabled_;
  std::FILE* out_;
};

// The artifact types of an output event.
inline constexpr char kOutputCheckpoint[] = "checkpoint";
inline constexpr char kOutputDataset[] = "dataset";
inline constexpr char kOutputFile[] = "file";

// The `output` event for something just published at `path`:
//   {"event": "output", "name", "path", "type", "manifest_sha256", "bytes", "parents",
//    "operation"}
// For a directory: `type` from its stemma.json ("type", else checkpoint when it has
// weights, dataset when it has a token-dataset index.json); `manifest_sha256` the sha256 of
// <path>/stemma.json; `bytes` the sum of the files the manifest lists; `parents` the paths
// the manifest lists. A dataset without stemma.json (written before datasets had one) uses
// its index.json as the manifest and the directory's files for `bytes`. For a regular file:
// type "file", the file's sha256 and size, and `parents` as given. `operation` is what made
// it: cpt, soup, revert, interpolate, graft, upcycle, init, tokenize, eval, analyze.
// NotFound when `path` does not exist; InvalidArgument for a malformed stemma.json.
absl::StatusOr<Event> OutputEvent(std::string_view name, const std::string& path,
                                  std::string_view operation,
                                  const std::vector<std::string>& file_parents = {});

}  // namespace stemma::engine
