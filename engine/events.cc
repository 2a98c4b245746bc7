#include "engine/events.h"

#include <sys/stat.h>

#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/engine_contract.h"
#include "common/status.h"
#include "engine/io/fs.h"
#include "engine/io/manifest.h"
#include "engine/io/sha256.h"

namespace stemma::engine {
namespace {

void WriteLine(const Event& event, std::FILE* out) {
  std::string line = event.dump(-1, ' ', false, Event::error_handler_t::replace);
  line += '\n';
  std::fwrite(line.data(), 1, line.size(), out);
  std::fflush(out);
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

void EventWriter::Emit(std::string_view name, const Event& fields) const {
  if (!enabled_) return;
  Event event = Event::object();
  event["event"] = std::string(name);
  if (fields.is_object()) {
    for (auto it = fields.begin(); it != fields.end(); ++it) {
      if (it.key() != "event") event[it.key()] = it.value();
    }
  }
  WriteLine(event, out_);
}

void EventWriter::Emit(const Event& event) const {
  if (!enabled_) return;
  if (!event.is_object() || !event.contains("event") || event.begin().key() == "event") {
    WriteLine(event, out_);
    return;
  }
  Emit(event["event"].is_string() ? event["event"].get<std::string>() : event["event"].dump(),
       event);
}

absl::StatusOr<Event> OutputEvent(std::string_view name, const std::string& path_in,
                                  std::string_view operation,
                                  const std::vector<std::string>& file_parents) {
  std::string path = path_in;
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return ErrnoStatus("output " + path, errno);
  Event event = Event::object();
  event["event"] = std::string(engine_contract::kEventOutput);
  event["name"] = std::string(name);
  event["path"] = path;
  Event parents = Event::array();
  if (!S_ISDIR(st.st_mode)) {
    uint64_t bytes = 0;
    ASSIGN_OR_RETURN(std::string sha, io::Sha256File(path, &bytes));
    for (const std::string& p : file_parents) parents.push_back(p);
    event["type"] = kOutputFile;
    event["manifest_sha256"] = sha;
    event["bytes"] = bytes;
    event["parents"] = std::move(parents);
    event["operation"] = std::string(operation);
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
    for (const io::ManifestParent& p : manifest.parents) parents.push_back(p.path);
    type = manifest.type;
  } else if (IsTokenDataset(path)) {
    // A dataset whose writer keeps its manifest in index.json (hashes of every shard).
    ASSIGN_OR_RETURN(sha, io::Sha256File(path + "/index.json"));
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
  event["type"] = type;
  event["manifest_sha256"] = sha;
  event["bytes"] = bytes;
  event["parents"] = std::move(parents);
  event["operation"] = std::string(operation);
  return event;
}

}  // namespace stemma::engine
