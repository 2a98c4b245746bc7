// The engine's JSON-line events on stdout (docs/engine-events.md, names in
// common/engine_contract.h), typed by their schema v1::EngineEvent
// (stemma/v1/engine_event.proto): every event is built as that message and written by
// common/engine_events.h's EngineEventLine, the writer of the schema the worker reads the
// lines with. One object per line with "event" as its first key, flushed at once so the
// worker sees progress as it happens. Human logs go to stderr. Torch-free.
//
// Every command writes its events through one EventWriter, and announces each result it
// published with OutputEvent(...), which reads the result's stemma.json so the worker can
// register it (type, manifest sha256, bytes, parents, operation).
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "stemma/v1/engine_event.pb.h"

namespace stemma::engine {

// The free-form part of an event, what the schema has no field for (a start event's spec
// and model, a done event's summary, an eval metric's suite): a JSON object whose keys
// become the event's `details`, written after the schema's fields.
using EventDetails = nlohmann::json;

// Writes events as lines. Emit is one fwrite + fflush of a whole line, so lines from two
// threads never interleave (stdio locks the stream); the writer itself holds no state.
class EventWriter {
 public:
  // `enabled` false: every Emit is dropped (data-parallel ranks other than 0).
  explicit EventWriter(bool enabled = true, std::FILE* out = stdout)
      : enabled_(enabled), out_(out) {}

  void Emit(const v1::EngineEvent& event) const;

  bool enabled() const { return enabled_; }

 private:
  bool enabled_;
  std::FILE* out_;
};

// An event named `name` (engine_contract::kEvent*); the caller sets its other fields.
v1::EngineEvent NewEvent(std::string_view name);
// A start or done event of `command`, with `details` (a JSON object, or null for none).
v1::EngineEvent CommandEvent(std::string_view name, std::string_view command,
                             const EventDetails& details = nullptr);
// A progress event: `fraction` of the work done, and what is being done.
v1::EngineEvent ProgressEvent(double fraction, std::string_view message);
// A metric event: one value of the series `name`, at `step` when given.
v1::EngineEvent MetricEvent(std::string_view name, double value,
                            std::optional<int64_t> step = std::nullopt,
                            const std::map<std::string, std::string>& labels = {});
// Adds every key of `details` (a JSON object) to the event's details; a key already there is
// replaced. Numbers become doubles (exact below 2^53), as the schema's Struct holds them.
void AddDetails(const EventDetails& details, v1::EngineEvent* event);

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
// its index.json as the manifest (its `parents`: the tokenizer and the corpus of its inputs)
// and the directory's files for `bytes`. For a regular file:
// type "file", the file's sha256 and size, and `parents` as given. `operation` is what made
// it: cpt, soup, revert, interpolate, graft, upcycle, init, tokenize, eval, analyze.
// NotFound when `path` does not exist; InvalidArgument for a malformed stemma.json.
absl::StatusOr<v1::EngineEvent> OutputEvent(std::string_view name, const std::string& path,
                                            std::string_view operation,
                                            const std::vector<std::string>& file_parents = {});
// OutputEvent, or when it fails (the message goes to stderr) the event without what the
// manifest would have given: name, path, `type` and operation only.
v1::EngineEvent OutputEventOrBare(std::string_view name, const std::string& path,
                                  std::string_view type, std::string_view operation);

}  // namespace stemma::engine
