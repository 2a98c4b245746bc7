#include "cli/config.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "cli/output.h"
#include "common/files.h"
#include "common/status.h"
#include "common/yaml_json.h"

namespace stemma::cli {
namespace {

absl::Status Bad(const std::string& path, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
}

// mkdir -p of the file's directory (mode 0700: it holds the names of token files).
absl::Status MakeParents(const std::string& path) {
  const std::string dir = files::ParentDir(path);
  if (dir == "." || dir == "/" || files::PathExists(dir)) return absl::OkStatus();
  RETURN_IF_ERROR(MakeParents(dir));
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create ", dir, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

std::string Field(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return "";
  return it->is_string() ? it->get<std::string>() : it->dump();
}

}  // namespace

const Context* CliConfig::Find(const std::string& name) const {
  for (const Context& c : contexts) {
    if (c.name == name) return &c;
  }
  return nullptr;
}

Context* CliConfig::Find(const std::string& name) {
  for (Context& c : contexts) {
    if (c.name == name) return &c;
  }
  return nullptr;
}

std::string ConfigPath() {
  if (const char* env = std::getenv("STEMMA_CONFIG"); env != nullptr && *env != '\0') return env;
  const char* home = std::getenv("HOME");
  if (home == nullptr || *home == '\0') return "";
  return absl::StrCat(home, "/.config/stemma/config.yaml");
}

absl::StatusOr<CliConfig> LoadConfig(const std::string& path) {
  CliConfig config;
  if (path.empty() || !files::PathExists(path)) return config;
  ASSIGN_OR_RETURN(std::string text, files::ReadFile(path));
  ASSIGN_OR_RETURN(std::vector<YamlNode> docs, LoadYamlDocuments(text, path));
  if (docs.empty() || docs[0].IsNull()) return config;
  std::string json_text;
  AppendYamlAsJson(docs[0], &json_text);
  nlohmann::json j = nlohmann::json::parse(json_text, nullptr, false);
  if (!j.is_object()) return Bad(path, "not a mapping (expected current-context and contexts)");
  config.current_context = Field(j, "current-context");
  if (auto it = j.find("contexts"); it != j.end() && !it->is_null()) {
    if (!it->is_array()) return Bad(path, "contexts: not a list");
    for (const auto& item : *it) {
      if (!item.is_object()) return Bad(path, "contexts: an entry is not a mapping");
      Context c{Field(item, "name"), Field(item, "server"), Field(item, "ca"),
                Field(item, "token-file"), Field(item, "namespace")};
      if (c.name.empty()) return Bad(path, "contexts: an entry has no name");
      if (config.Find(c.name) != nullptr) {
        return Bad(path, absl::StrCat("contexts: '", c.name, "' is given twice"));
      }
      config.contexts.push_back(std::move(c));
    }
  }
  return config;
}

absl::Status SaveConfig(const std::string& path, const CliConfig& config) {
  if (path.empty()) {
    return absl::FailedPreconditionError("no config file: set $STEMMA_CONFIG or $HOME");
  }
  nlohmann::json j = nlohmann::json::object();
  j["current-context"] = config.current_context;
  j["contexts"] = nlohmann::json::array();
  for (const Context& c : config.contexts) {
    nlohmann::json item = {{"name", c.name}, {"server", c.server}};
    if (!c.ca.empty()) item["ca"] = c.ca;
    if (!c.token_file.empty()) item["token-file"] = c.token_file;
    if (!c.space.empty()) item["namespace"] = c.space;
    j["contexts"].push_back(std::move(item));
  }
  RETURN_IF_ERROR(MakeParents(path));
  return files::WriteFileAtomic(path, JsonToYaml(j), 0600);
}

}  // namespace stemma::cli
