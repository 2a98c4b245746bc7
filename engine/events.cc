#include "engine/events.h"

#include <sys/stat.h>

#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/engine_contract.h"
#include "common/engine_events.h"
#include "common/status.h"
#include "engine/io/fs.h"
#include "engine/io/manifest.h"
#include "engine/io/sha256.h"

namespace stemma::engine {
namespace {

namespace pb = google::protobuf;

// A JSON value as the schema's Struct value.
pb::Value ToValue(const nlohmann::json& j) {
  pb::Value v;
  if (j.is_number()) {
    v.set_number_value(j.get<double>());
  } else if (j.is_string()) {
    v.set_string_value(j.get<std::string>());
  } else if (j.is_boolean()) {
    v.set_bool_value(j.get<bool>());
  } else if (j.is_object()) {
    auto* fields = v.mutable_struct_value()->mutable_fields();
    for (const auto& [key, value] : j.items()) (*fields)[key] = ToValue(value);
  } else if (j.is_array()) {
    auto* list = v.mutable_list_value();
    for (const auto& value : j) *list->add_values() = ToValue(value);
  } else {
    v.set_null_value(pb::NULL_VALUE);
  }
  return v;
}

bool HasWeights(const std::string& dir) {
  return io::PathExists(dir + "/model.safetensors") ||
         io::PathExists(dir + "/model.safetensors.index.json");
}

// A token dataset's index.json (docs/data-format.md) says "format": "stemma-tokens-v1".
bool IsTokenDataset(const std::string& dir) {
  auto text = io::ReadFile(dir + "/index.json");
  if (!text.ok()) return false;
  nlohmann::json j = nlohmann::json::parse(*text, nullptr, false);
  return j.is_object() && j.contains("format") && j["format"].is_string() &&
         absl::StartsWith(j["format"].get<std::string>(), "stemma-tokens");
}

}  // namespace

void EventWriter::Emit(const v1::EngineEvent& event) const {
  if (!enabled_) return;
  std::string line = EngineEventLine(event);
  line += '\n';
  std::fwrite(line.data(), 1, line.size(), out_);
  std::fflush(out_);
}

v1::EngineEvent NewEvent(std::string_view name) {
  v1::EngineEvent event;
  event.set_event(std::string(name));
  return event;
}

v1::EngineEvent CommandEvent(std::string_view name, std::string_view command,
                             const EventDetails& details) {
  v1::EngineEvent event = NewEvent(name);
  event.set_command(std::string(command));
  AddDetails(details, &event);
  return event;
}

v1::EngineEvent ProgressEvent(double fraction, std::string_view message) {
  v1::EngineEvent event = NewEvent(engine_contract::kEventProgress);
  event.set_fraction(fraction);
  event.set_message(std::string(message));
  return event;
}

v1::EngineEvent MetricEvent(std::string_view name, double value, std::optional<int64_t> step,
                            const std::map<std::string, std::string>& labels) {
  v1::EngineEvent event = NewEvent(engine_contract::kEventMetric);
  event.set_name(std::string(name));
  event.set_value(value);
  if (step.has_value()) event.set_step(static_cast<double>(*step));
  for (const auto& [key, label] : labels) (*event.mutable_labels())[key] = label;
  return event;
}

void AddDetails(const EventDetails& details, v1::EngineEvent* event) {
  if (!details.is_object()) return;
  auto* fields = event->mutable_details()->mutable_fields();
  for (const auto& [key, value] : details.items()) (*fields)[key] = ToValue(value);
}

absl::StatusOr<v1::EngineEvent> OutputEvent(std::string_view name, const std::string& path_in,
                                            std::string_view operation,
                                            const std::vector<std::string>& file_parents) {
  std::string path = path_in;
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return ErrnoStatus("output " + path, errno);
  v1::EngineEvent event = NewEvent(engine_contract::kEventOutput);
  event.set_name(std::string(name));
  event.set_path(path);
  event.set_operation(std::string(operation));
  if (!S_ISDIR(st.st_mode)) {
    uint64_t bytes = 0;
    ASSIGN_OR_RETURN(std::string sha, io::Sha256File(path, &bytes));
    for (const std::string& p : file_parents) event.add_parents(p);
    event.set_type(kOutputFile);
    event.set_manifest_sha256(sha);
    event.set_bytes(static_cast<double>(bytes));
    return event;
  }
  const std::string manifest_path = absl::StrCat(path, "/", io::kManifestName);
  std::string type;
  std::string sha;
  uint64_t bytes = 0;
  if (io::PathExists(manifest_path)) {
    ASSIGN_OR_RETURN(std::string text, io::ReadFile(manifest_path));
    ASSIGN_OR_RETURN(io::Manifest manifest, io::ParseManifest(text, manifest_path));
    sha = io::Sha256Hex(text);
    for (const auto& [file, f] : manifest.files) bytes += f.bytes;
    for (const io::ManifestParent& p : manifest.parents) event.add_parents(p.path);
    type = manifest.type;
  } else if (IsTokenDataset(path)) {
    // A dataset whose writer keeps its manifest in index.json (hashes of every shard), its
    // parents (the tokenizer, the corpus of its inputs) included.
    ASSIGN_OR_RETURN(std::string text, io::ReadFile(path + "/index.json"));
    sha = io::Sha256Hex(text);
    const nlohmann::json index = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (index.is_object() && index.contains("parents") && index["parents"].is_array()) {
      for (const nlohmann::json& p : index["parents"]) {
        if (p.is_object() && p.contains("path") && p["path"].is_string()) {
          event.add_parents(p["path"].get<std::string>());
        }
      }
    }
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(path, ec)) {
      if (e.is_regular_file(ec)) bytes += e.file_size(ec);
    }
    type = kOutputDataset;
  } else {
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": published without a ", io::kManifestName, " manifest"));
  }
  if (type.empty())
    type = HasWeights(path)       ? kOutputCheckpoint
           : IsTokenDataset(path) ? kOutputDataset
                                  : kOutputFile;
  event.set_type(type);
  event.set_manifest_sha256(sha);
  event.set_bytes(static_cast<double>(bytes));
  return event;
}

v1::EngineEvent OutputEventOrBare(std::string_view name, const std::string& path,
                                  std::string_view type, std::string_view operation) {
  absl::StatusOr<v1::EngineEvent> output = OutputEvent(name, path, operation);
  if (output.ok()) return *std::move(output);
  std::fprintf(stderr, "stemma-engine: output event without manifest fields: %s\n",
               std::string(output.status().message()).c_str());
  v1::EngineEvent event = NewEvent(engine_contract::kEventOutput);
  event.set_name(std::string(name));
  event.set_path(path);
  event.set_type(std::string(type));
  event.set_operation(std::string(operation));
  return event;
}

}  // namespace stemma::engine
