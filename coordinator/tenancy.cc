#include "coordinator/tenancy.h"

#include <algorithm>
#include <filesystem>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/engine_spec.h"
#include "common/files.h"
#include "common/job_spec.h"
#include "common/status.h"
#include "stemma/v1/spec_options.pb.h"

namespace stemma::coordinator {

bool IsPlainName(absl::string_view name) {
  if (name.empty() || name == "." || name == ".." || name.size() > 128) return false;
  for (char ch : name) {
    const bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                    (ch >= '0' && ch <= '9') || ch == '.' || ch == '_' || ch == '-' || ch == '@';
    if (!ok) return false;
  }
  return true;
}

absl::StatusOr<Tenancy> Tenancy::Parse(absl::string_view text, absl::string_view source) {
  Tenancy t;
  t.source_ = std::string(source);
  std::set<std::string> seen;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    if (auto hash = line.find('#'); hash != absl::string_view::npos) line = line.substr(0, hash);
    std::vector<std::string> words =
        absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
    if (words.empty()) continue;
    auto bad = [&](absl::string_view what) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": line ", line_no, ": ", what));
    };
    const std::string& project = words[0];
    if (!IsPlainName(project)) {
      return bad(absl::StrCat("project '", project, "' is not a plain name ([A-Za-z0-9._@-])"));
    }
    if (!seen.insert(project).second)
      return bad(absl::StrCat("project ", project, " listed twice"));
    if (words.size() < 2) {
      return bad(absl::StrCat("project ", project, " has no members (write: PROJECT SUBJECT...)"));
    }
    for (size_t i = 1; i < words.size(); ++i) {
      if (!IsPlainName(words[i])) {
        return bad(absl::StrCat("member '", words[i], "' is not a plain name"));
      }
      auto& list = t.projects_of_[words[i]];
      if (std::find(list.begin(), list.end(), project) == list.end()) list.push_back(project);
      auto& members = t.members_[project];
      if (std::find(members.begin(), members.end(), words[i]) == members.end()) {
        members.push_back(words[i]);
      }
    }
  }
  return t;
}

absl::StatusOr<Tenancy> Tenancy::Load(const std::string& path) {
  absl::StatusOr<std::string> text = files::ReadFile(path);
  if (!text.ok()) {
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) {
      return absl::NotFoundError(absl::StrCat(path, ": no such projects file"));
    }
    return absl::PermissionDeniedError(absl::StrCat(path, ": cannot read the projects file"));
  }
  return Parse(*text, path);
}

const std::vector<std::string>* Tenancy::MembersOf(const std::string& project) const {
  auto it = members_.find(project);
  return it == members_.end() ? nullptr : &it->second;
}

std::vector<std::string> Tenancy::ProjectsOf(const std::string& subject) const {
  auto it = projects_of_.find(subject);
  return it == projects_of_.end() ? std::vector<std::string>() : it->second;
}

std::string Tenancy::Namespace(const std::string& subject) const {
  auto it = projects_of_.find(subject);
  if (it == projects_of_.end() || it->second.empty()) return subject;
  return absl::StrCat("projects/", it->second.front());
}

bool Tenancy::Shares(const std::string& subject, const std::string& owner) const {
  if (owner.empty() || subject == owner) return true;
  const std::vector<std::string> mine = ProjectsOf(subject);
  for (const std::string& p : ProjectsOf(owner)) {
    if (std::find(mine.begin(), mine.end(), p) != mine.end()) return true;
  }
  return false;
}

std::vector<std::string> Tenancy::WritablePrefixes(const std::string& subject) const {
  std::vector<std::string> out = {subject};
  for (const std::string& p : ProjectsOf(subject)) out.push_back(absl::StrCat("projects/", p));
  return out;
}

absl::Status Tenancy::CheckWritable(absl::string_view field, const std::string& relative,
                                    const std::string& owner) const {
  if (owner.empty()) return absl::OkStatus();
  if (!IsPlainName(owner) || owner == "projects") {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": the subject '", owner, "' cannot own storage (not a plain name); ask an admin"));
  }
  const std::string normal = std::filesystem::path(relative).lexically_normal().string();
  const std::vector<std::string> prefixes = WritablePrefixes(owner);
  for (const std::string& p : prefixes) {
    if (normal.size() > p.size() + 1 && absl::StartsWith(normal, p) && normal[p.size()] == '/') {
      return absl::OkStatus();
    }
  }
  std::vector<std::string> shown;
  for (const std::string& p : prefixes) shown.push_back(absl::StrCat("'", p, "/'"));
  return absl::PermissionDeniedError(absl::StrCat(
      field, ": ", relative, (normal == relative ? "" : absl::StrCat(" (", normal, ")")),
      " is not below ", owner, "'s storage (", absl::StrJoin(shown, " or "),
      " of the storage root; docs/tenancy.md)"));
}

absl::Status Tenancy::CheckJobOutputs(const v1::JobSpec& spec, const std::string& owner) const {
  if (owner.empty()) return absl::OkStatus();
  if (spec.has_exec()) {  // declared outputs (issue 23) follow the engine's rules
    for (const auto& [name, out] : spec.exec().outputs()) {
      const std::string field = absl::StrCat("exec.outputs.", name, ".path");
      if (absl::StartsWith(out.path(), "/")) {
        return absl::PermissionDeniedError(
            absl::StrCat(field, ": ", out.path(),
                         ": with authentication an output path is relative to the storage "
                         "root and starts with '",
                         owner, "/' (docs/tenancy.md)"));
      }
      if (out.path().find("${{") == std::string::npos) {
        RETURN_IF_ERROR(CheckWritable(field, out.path(), owner));
      }
    }
    return absl::OkStatus();
  }
  if (!IsEngineJob(spec)) return absl::OkStatus();
  const google::protobuf::Message* engine = EngineSpecOf(spec);
  if (engine == nullptr) return absl::OkStatus();
  for (const SpecPath& p : SpecPaths(*engine)) {
    if (p.role != v1::ROLE_OUTPUT_PATH || p.value.empty()) continue;
    const std::string field = absl::StrCat(JobKind(spec), ".", p.field);
    if (absl::StartsWith(p.value, "/")) {
      return absl::PermissionDeniedError(
          absl::StrCat(field, ": ", p.value,
                       ": with authentication an output path is relative to the storage "
                       "root and starts with '",
                       owner, "/' (docs/tenancy.md)"));
    }
    RETURN_IF_ERROR(CheckWritable(field, p.value, owner));
  }
  return absl::OkStatus();
}

}  // namespace stemma::coordinator
