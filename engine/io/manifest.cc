#include "engine/io/manifest.h"

#include "absl/strings/str_cat.h"

namespace stemma::engine::io {

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

}  // namespace stemma::engine::io
