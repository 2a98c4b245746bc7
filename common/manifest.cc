#include "common/manifest.h"

#include <sys/stat.h>

#include "absl/strings/str_cat.h"

namespace stemma::manifest {

nlohmann::json ManifestToJson(const Manifest& m) {
  nlohmann::json files = nlohmann::json::object();
  for (const auto& [name, f] : m.files) {
    nlohmann::json entry = {{"sha256", f.sha256}, {"bytes", f.bytes}};
    if (!f.tensor_sha256.empty()) entry["tensors"] = f.tensor_sha256;
    files[name] = std::move(entry);
  }
  nlohmann::json parents = nlohmann::json::array();
  for (const auto& p : m.parents) {
    parents.push_back(
        {{"path", p.path},
         {"manifest_sha256", p.manifest_sha256.empty() ? nlohmann::json(nullptr)
                                                       : nlohmann::json(p.manifest_sha256)}});
  }
  return {{"format", m.format},
          {"files", std::move(files)},
          {"parents", std::move(parents)},
          {"producer",
           {{"job", m.producer.job},
            {"attempt", m.producer.attempt},
            {"command", m.producer.command},
            {"params", m.producer.params}}},
          {"created_ms", m.created_ms},
          {"type", m.type}};
}

absl::StatusOr<Manifest> ParseManifest(absl::string_view text, absl::string_view source) {
  nlohmann::json j = nlohmann::json::parse(text.begin(), text.end(), nullptr, false);
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", why));
  };
  if (j.is_discarded() || !j.is_object()) return bad("not a JSON object");
  Manifest m;
  if (!j.contains("format") || !j["format"].is_number_integer()) return bad("missing format");
  m.format = j["format"].get<int>();
  if (m.format > kManifestFormat) {
    return absl::UnimplementedError(
        absl::StrCat(source, ": manifest format ", m.format, " is newer than this engine's"));
  }
  if (!j.contains("files") || !j["files"].is_object()) return bad("missing files");
  for (auto it = j["files"].begin(); it != j["files"].end(); ++it) {
    const auto& v = it.value();
    if (!v.is_object() || !v.contains("sha256") || !v["sha256"].is_string() ||
        !v.contains("bytes") || !v["bytes"].is_number_unsigned()) {
      return bad(absl::StrCat("files.", it.key(), ": needs sha256 and bytes"));
    }
    ManifestFile f;
    f.sha256 = v["sha256"].get<std::string>();
    f.bytes = v["bytes"].get<uint64_t>();
    if (v.contains("tensors")) {
      if (!v["tensors"].is_object()) return bad(absl::StrCat("files.", it.key(), ".tensors"));
      for (auto t = v["tensors"].begin(); t != v["tensors"].end(); ++t) {
        if (!t.value().is_string()) return bad(absl::StrCat("files.", it.key(), ".tensors"));
        f.tensor_sha256[t.key()] = t.value().get<std::string>();
      }
    }
    m.files[it.key()] = std::move(f);
  }
  if (j.contains("parents")) {
    if (!j["parents"].is_array()) return bad("parents is not an array");
    for (const auto& p : j["parents"]) {
      if (!p.is_object() || !p.contains("path") || !p["path"].is_string()) {
        return bad("parents: each needs a path");
      }
      ManifestParent parent;
      parent.path = p["path"].get<std::string>();
      if (p.contains("manifest_sha256") && p["manifest_sha256"].is_string()) {
        parent.manifest_sha256 = p["manifest_sha256"].get<std::string>();
      }
      m.parents.push_back(std::move(parent));
    }
  }
  if (j.contains("producer") && j["producer"].is_object()) {
    const auto& p = j["producer"];
    auto str = [&](const char* k) {
      return p.contains(k) && p[k].is_string() ? p[k].get<std::string>() : std::string();
    };
    m.producer.job = str("job");
    m.producer.attempt = str("attempt");
    m.producer.command = str("command");
    if (p.contains("params")) m.producer.params = p["params"];
  }
  if (j.contains("type")) {
    if (!j["type"].is_string()) return bad("type is not a string");
    m.type = j["type"].get<std::string>();
  }
  if (j.contains("created_ms") && j["created_ms"].is_number_integer()) {
    m.created_ms = j["created_ms"].get<int64_t>();
  }
  return m;
}

namespace {

bool FormatStartsWith(const nlohmann::json& j, const char* prefix) {
  if (!j.is_object()) return false;
  const auto it = j.find("format");
  return it != j.end() && it->is_string() &&
         it->get_ref<const std::string&>().rfind(prefix, 0) == 0;
}

// An integer field of `j`, if it has one.
std::optional<int64_t> IntField(const nlohmann::json& j, const char* key) {
  if (!j.is_object() || !j.contains(key) || !j[key].is_number_integer()) return std::nullopt;
  return j[key].get<int64_t>();
}

// A token dataset's index.json: its shards (uint32 tokens: 4 bytes each) and index.bin
// (num_documents + 1 uint64 offsets), each with the sha256 the writer recorded.
std::vector<ListedFile> TokenIndexFiles(const nlohmann::json& j) {
  std::vector<ListedFile> out;
  auto entry = [](const nlohmann::json& e, std::optional<int64_t> count, int64_t width) {
    ListedFile f;
    if (!e.is_object()) return f;
    if (e.contains("file") && e["file"].is_string()) f.path = e["file"].get<std::string>();
    if (e.contains("sha256") && e["sha256"].is_string()) f.sha256 = e["sha256"].get<std::string>();
    if (count.has_value() && *count >= 0) f.bytes = *count * width;
    return f;
  };
  if (j.contains("shards") && j["shards"].is_array()) {
    for (const auto& shard : j["shards"])
      out.push_back(entry(shard, IntField(shard, "num_tokens"), 4));
  }
  if (j.contains("documents") && j["documents"].is_object()) {
    std::optional<int64_t> documents = IntField(j, "num_documents");
    if (documents.has_value()) *documents += 1;
    out.push_back(entry(j["documents"], documents, 8));
  }
  return out;
}

}  // namespace

bool IsCorpusManifest(const nlohmann::json& j) { return FormatStartsWith(j, kCorpusFormatPrefix); }

bool IsTokenIndex(const nlohmann::json& j) { return FormatStartsWith(j, kTokenIndexFormatPrefix); }

std::vector<ListedFile> ListedFiles(const nlohmann::json& j) {
  std::vector<ListedFile> out;
  if (IsTokenIndex(j)) return TokenIndexFiles(j);
  if (!j.is_object() || !j.contains("files")) return out;
  auto fill = [](const nlohmann::json& entry, ListedFile* f) {
    if (!entry.is_object()) return;
    if (entry.contains("sha256") && entry["sha256"].is_string()) {
      f->sha256 = entry["sha256"].get<std::string>();
    }
    if (entry.contains("bytes") && entry["bytes"].is_number_integer()) {
      f->bytes = entry["bytes"].get<int64_t>();
    }
  };
  const nlohmann::json& files = j["files"];
  if (files.is_object()) {  // stemma.json: {name: {sha256, bytes}}
    for (const auto& [name, entry] : files.items()) {
      ListedFile f;
      f.path = name;
      fill(entry, &f);
      out.push_back(std::move(f));
    }
  } else if (files.is_array()) {  // a corpus manifest: [{path, sha256, bytes}]
    for (const auto& entry : files) {
      ListedFile f;
      if (entry.is_object() && entry.contains("path") && entry["path"].is_string()) {
        f.path = entry["path"].get<std::string>();
      }
      fill(entry, &f);
      out.push_back(std::move(f));
    }
  }
  return out;
}

std::string ManifestPathOf(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return path;
  const std::string stemma_json = absl::StrCat(path, "/", kManifestName);
  if (::stat(stemma_json.c_str(), &st) == 0) return stemma_json;
  for (const char* name : {kCorpusManifestName, kTokenIndexName}) {
    std::string other = absl::StrCat(path, "/", name);
    if (::stat(other.c_str(), &st) == 0) return other;
  }
  return stemma_json;
}

}  // namespace stemma::manifest
