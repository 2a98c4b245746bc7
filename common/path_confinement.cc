#include "common/path_confinement.h"

#include <errno.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <deque>
#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/engine_spec.h"
#include "common/job_spec.h"
#include "common/status.h"
#include "stemma/v1/spec_options.pb.h"

namespace stemma {
namespace {

constexpr int kMaxSymlinks = 40;  // as the kernel's ELOOP limit
constexpr size_t kMaxPathBytes = PATH_MAX;

bool IsReferenceValue(const std::string& v) {
  return absl::StartsWith(v, "ckpt:") || absl::StartsWith(v, "hf:") || absl::StartsWith(v, "${{");
}

void PushComponents(const std::string& path, std::deque<std::string>* queue, bool front) {
  std::vector<std::string> parts = absl::StrSplit(path, '/', absl::SkipEmpty());
  if (front) {
    queue->insert(queue->begin(), parts.begin(), parts.end());
  } else {
    queue->insert(queue->end(), parts.begin(), parts.end());
  }
}

void Pop(std::string* resolved) {
  size_t slash = resolved->rfind('/');
  resolved->resize(slash == 0 ? 1 : slash);  // "/a" -> "/", "/a/b" -> "/a"
}

void Append(std::string* resolved, const std::string& component) {
  if (resolved->size() > 1) resolved->push_back('/');
  resolved->append(component);
}

// The absolute path `path` names as open() would see it: existing components resolved
// (symlinks followed, also dangling ones, whose targets are then resolved further), `..`
// applied to what is real so far; components below the first missing one taken lexically.
absl::StatusOr<std::string> Resolve(const std::string& path) {
  std::deque<std::string> queue;
  PushComponents(path, &queue, false);
  std::string resolved = "/";
  bool exists = true;  // every component so far exists
  int links = 0;
  while (!queue.empty()) {
    std::string c = std::move(queue.front());
    queue.pop_front();
    if (c == ".") continue;
    if (c == "..") {
      Pop(&resolved);
      continue;
    }
    std::string candidate = resolved;
    Append(&candidate, c);
    if (!exists) {
      resolved = std::move(candidate);
      continue;
    }
    struct stat st;
    if (::lstat(candidate.c_str(), &st) != 0) {
      if (errno != ENOENT && errno != ENOTDIR) {
        return ErrnoStatus(absl::StrCat("cannot resolve ", candidate), errno);
      }
      exists = false;
      resolved = std::move(candidate);
      continue;
    }
    if (S_ISLNK(st.st_mode)) {
      if (++links > kMaxSymlinks) {
        return absl::InvalidArgumentError(absl::StrCat("too many symlinks under ", candidate));
      }
      char target[PATH_MAX];
      ssize_t n = ::readlink(candidate.c_str(), target, sizeof target - 1);
      if (n < 0) return ErrnoStatus(absl::StrCat("cannot read the symlink ", candidate), errno);
      const std::string t(target, static_cast<size_t>(n));
      if (absl::StartsWith(t, "/")) resolved = "/";
      PushComponents(t, &queue, true);
      continue;
    }
    resolved = std::move(candidate);
  }
  return resolved;
}

bool Inside(const std::string& path, const std::string& root, bool allow_equal) {
  if (path == root) return allow_equal;
  if (root == "/") return true;
  return path.size() > root.size() && absl::StartsWith(path, root) && path[root.size()] == '/';
}

std::string ResolvedRoot(const std::string& root) {
  std::error_code ec;
  const std::string absolute = std::filesystem::absolute(root, ec).string();
  absl::StatusOr<std::string> r = Resolve(absolute);
  return r.ok() ? *r : std::filesystem::path(absolute).lexically_normal().string();
}

const char* ReadOnlyWords(size_t n) { return n == 1 ? "the read root" : "the read roots"; }

}  // namespace

absl::Status CheckPathSyntax(std::string_view field_name, const std::string& value,
                             PathAccess access) {
  if (value.empty() || IsReferenceValue(value)) return absl::OkStatus();
  const std::string field(field_name);
  auto bad = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
  };
  if (value.find('\0') != std::string::npos) return bad("the path contains a NUL byte");
  if (value.size() > kMaxPathBytes) {
    return bad(absl::StrCat("the path is ", value.size(), " bytes, longer than ", kMaxPathBytes));
  }
  // One trailing slash names the same directory; "a//b" is a path built from an empty part.
  absl::string_view trimmed(value);
  if (trimmed.size() > 1 && trimmed.back() == '/') trimmed.remove_suffix(1);
  if (absl::StrContains(trimmed, "//")) {
    return bad(absl::StrCat(value, " has an empty path segment ('//')"));
  }
  if (access == PathAccess::kWrite) {
    const std::filesystem::path p(value);
    bool dotdot = false;
    for (const auto& part : p) dotdot |= part == "..";
    if (p.is_absolute() && dotdot) {
      return bad(absl::StrCat(value, ": an absolute output path must not contain '..'"));
    }
    if (!p.is_absolute()) {
      const std::filesystem::path normal = p.lexically_normal();
      if (!normal.empty() && *normal.begin() == "..") {
        return bad(absl::StrCat(value, " climbs out of the storage root ('..')"));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ConfinePath(std::string_view field_name, const std::string& value,
                                        PathAccess access, const PathRoots& roots) {
  if (value.empty() || IsReferenceValue(value)) return value;
  const std::string field(field_name);
  RETURN_IF_ERROR(CheckPathSyntax(field, value, access));
  if (roots.storage.empty() || !std::filesystem::path(roots.storage).is_absolute()) {
    return absl::FailedPreconditionError(
        absl::StrCat(field, ": the worker has no absolute storage root to confine paths to"));
  }
  // What the engine opens: relative paths joined and normalised (ResolveSpecPaths).
  const std::filesystem::path given(value);
  const std::string opened =
      given.is_absolute()
          ? value
          : (std::filesystem::path(roots.storage) / given).lexically_normal().string();
  absl::StatusOr<std::string> real = Resolve(opened);
  if (!real.ok())
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", real.status().message()));
  const std::string storage = ResolvedRoot(roots.storage);
  // "VALUE" or "VALUE (resolves to R)" when the two differ.
  const std::string shown =
      *real == value ? value : absl::StrCat(value, " (resolves to ", *real, ")");
  if (access == PathAccess::kWrite) {
    if (*real == storage) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": ", shown,
                       " is the storage root itself; an output must be a directory inside it"));
    }
    if (!Inside(*real, storage, false)) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": ", shown, " is outside the storage root ", roots.storage));
    }
    for (const std::string& denied : roots.no_write) {
      if (Inside(*real, ResolvedRoot(denied), true)) {
        return absl::InvalidArgumentError(absl::StrCat(
            field, ": ", shown, " is inside the worker's own data directory ", denied));
      }
    }
    return *real;
  }
  if (Inside(*real, storage, true)) return *real;
  for (const std::string& root : roots.read_only) {
    if (Inside(*real, ResolvedRoot(root), true)) return *real;
  }
  std::string where = absl::StrCat("the storage root ", roots.storage);
  if (!roots.read_only.empty()) {
    absl::StrAppend(&where, " and ", ReadOnlyWords(roots.read_only.size()), " ",
                    absl::StrJoin(roots.read_only, ", "));
  }
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", shown, " is outside ", where));
}

absl::StatusOr<std::string> ResolveAsOpened(const std::string& path) { return Resolve(path); }

absl::StatusOr<std::string> RelativeBelowRoot(std::string_view field_name, const std::string& path,
                                              const std::string& root) {
  const std::string field(field_name);
  if (path.empty() || path[0] != '/' || root.empty() || root[0] != '/') {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": '", path, "' is not an absolute path below the storage root ", root));
  }
  absl::StatusOr<std::string> real = Resolve(path);
  if (!real.ok())
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", real.status().message()));
  const std::string storage = ResolvedRoot(root);
  if (!Inside(*real, storage, false)) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": ", path, *real == path ? "" : absl::StrCat(" (resolves to ", *real, ")"),
        " is outside the storage root ", root));
  }
  return storage == "/" ? real->substr(1) : real->substr(storage.size() + 1);
}

namespace {

std::string FieldName(std::string_view prefix, const std::string& field) {
  return prefix.empty() ? field : absl::StrCat(std::string(prefix), ".", field);
}

PathAccess AccessOf(int role) {
  return role == v1::ROLE_OUTPUT_PATH ? PathAccess::kWrite : PathAccess::kRead;
}

}  // namespace

absl::Status CheckSpecConfinement(const google::protobuf::Message& spec, std::string_view prefix,
                                  const PathRoots& roots) {
  for (const SpecPath& p : SpecPaths(spec)) {
    absl::StatusOr<std::string> ok =
        ConfinePath(FieldName(prefix, p.field), p.value, AccessOf(p.role), roots);
    if (!ok.ok()) return ok.status();
  }
  return absl::OkStatus();
}

absl::Status CheckJobConfinement(const v1::JobSpec& job, const PathRoots& roots) {
  const google::protobuf::Message* spec = IsEngineJob(job) ? EngineSpecOf(job) : nullptr;
  if (spec == nullptr) return absl::OkStatus();
  return CheckSpecConfinement(*spec, JobKind(job), roots);
}

absl::Status CheckSpecPathSyntax(const google::protobuf::Message& spec, std::string_view prefix) {
  for (const SpecPath& p : SpecPaths(spec)) {
    RETURN_IF_ERROR(CheckPathSyntax(FieldName(prefix, p.field), p.value, AccessOf(p.role)));
  }
  return absl::OkStatus();
}

}  // namespace stemma
