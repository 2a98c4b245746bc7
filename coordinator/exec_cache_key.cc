#include "coordinator/exec_cache_key.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/sha256.h"
#include "coordinator/artifact_files.h"

namespace stemma::coordinator {
namespace {

namespace fs = std::filesystem;

constexpr size_t kMaxTreeFiles = 20000;

// The content of a directory tree: sha256 over "<sha256>  <relative path>\n" of every
// regular file, sorted by path (symbolic links are not followed); "" when unreadable.
std::string TreeHash(const std::string& dir) {
  std::vector<std::string> rel;
  std::error_code ec;
  fs::recursive_directory_iterator it(dir, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    if (it->is_symlink(ec) || !it->is_regular_file(ec)) continue;
    if (rel.size() >= kMaxTreeFiles) return "";
    rel.push_back(it->path().lexically_relative(dir).string());
  }
  if (ec) return "";
  std::sort(rel.begin(), rel.end());
  std::string listing;
  for (const std::string& r : rel) {
    absl::StatusOr<std::string> sha = Sha256File(absl::StrCat(dir, "/", r));
    if (!sha.ok()) return "";
    absl::StrAppend(&listing, *sha, "  ", r, "\n");
  }
  return Sha256Hex(listing);
}

// What a code path stands for: its content.
std::string ContentIdentity(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    const std::string tree = TreeHash(path);
    return tree.empty() ? "unreadable:" + path : "tree:" + tree;
  }
  absl::StatusOr<std::string> sha = Sha256File(path);
  return sha.ok() ? "sha256:" + *sha : "unreadable:" + path;
}

// What an input stands for: a directory's manifest (the one reader engine jobs' keys use)
// when it has one, else its content. A file is hashed by ContentIdentity, streaming: it may
// be larger than a manifest is allowed to be.
std::string InputIdentity(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    if (std::optional<std::string> manifest = ReadArtifactManifest(path)) {
      return "sha256:" + Sha256Hex(*manifest);
    }
  }
  return ContentIdentity(path);
}

// argv[0]: the resolved file's path, size and mtime when it is an absolute path found here.
std::string ProgramIdentity(const std::string& program) {
  if (program.empty() || program[0] != '/') return program;
  char* real = realpath(program.c_str(), nullptr);
  if (real == nullptr) return program;
  const std::string resolved(real);
  free(real);
  struct stat st;
  if (stat(resolved.c_str(), &st) != 0) return program;
  return absl::StrCat(resolved, " ", st.st_size, " ", st.st_mtim.tv_sec, ".", st.st_mtim.tv_nsec);
}

}  // namespace

bool IsMemoizedExec(const v1::JobSpec& spec) {
  if (!spec.has_exec() || spec.exec().outputs_size() == 0) return false;
  if (spec.exec().has_cache() && !spec.exec().cache()) return false;
  return true;
}

std::string ExecCacheKey(const v1::JobSpec& spec) {
  if (!IsMemoizedExec(spec)) return "";
  const v1::ExecSpec& e = spec.exec();
  nlohmann::json j = nlohmann::json::object();
  j["argv"] = std::vector<std::string>(e.argv().begin(), e.argv().end());
  // nlohmann objects sort their keys: protobuf's map order does not reach the key.
  j["env"] = std::map<std::string, std::string>(e.env().begin(), e.env().end());
  j["launcher"] = e.launcher();
  nlohmann::json outputs = nlohmann::json::object();
  for (const auto& [name, out] : e.outputs()) outputs[name] = {out.path(), out.type()};
  j["outputs"] = std::move(outputs);
  if (j.dump().find("${{") != std::string::npos) return "";
  for (const std::string& p : e.inputs()) {
    if (p.find("${{") != std::string::npos) return "";
    j["inputs"].push_back({p, InputIdentity(p)});
  }
  for (const std::string& p : e.code()) {
    if (p.find("${{") != std::string::npos) return "";
    j["code"].push_back({p, ContentIdentity(p)});
  }
  if (!e.argv().empty()) j["program"] = ProgramIdentity(e.argv(0));
  return Sha256Hex(absl::StrCat("exec\n", j.dump()));
}

}  // namespace stemma::coordinator
