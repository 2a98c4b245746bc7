#include "worker/job_confinement.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/landlock.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/auth.h"
#include "common/engine_spec.h"
#include "common/job_spec.h"
#include "common/logging.h"
#include "stemma/v1/spec_options.pb.h"

extern char** environ;

namespace stemma::worker {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t kRead = LANDLOCK_ACCESS_FS_READ_FILE;
// LANDLOCK_ACCESS_FS_TRUNCATE (ABI 3): Debian 12's <linux/landlock.h> predates it.
constexpr uint64_t kTruncate = 1ULL << 14;
// What the per-attempt write rule set handles (ABI 1), besides REFER (2) and TRUNCATE (3).
constexpr uint64_t kDirWrites =
    LANDLOCK_ACCESS_FS_REMOVE_DIR | LANDLOCK_ACCESS_FS_REMOVE_FILE | LANDLOCK_ACCESS_FS_MAKE_CHAR |
    LANDLOCK_ACCESS_FS_MAKE_DIR | LANDLOCK_ACCESS_FS_MAKE_REG | LANDLOCK_ACCESS_FS_MAKE_SOCK |
    LANDLOCK_ACCESS_FS_MAKE_FIFO | LANDLOCK_ACCESS_FS_MAKE_BLOCK | LANDLOCK_ACCESS_FS_MAKE_SYM;

// The rights a rule grants: `dir_rights` on a directory, `file_rights` on anything else (a
// rule on a file may name only rights that apply to files).
struct Rights {
  uint64_t dir_rights;
  uint64_t file_rights;
};
constexpr Rights kReadRights = {kRead, kRead};

bool AddRule(int ruleset, int fd, uint64_t access) {
  struct landlock_path_beneath_attr rule = {.allowed_access = access, .parent_fd = fd};
  return syscall(SYS_landlock_add_rule, ruleset, LANDLOCK_RULE_PATH_BENEATH, &rule, 0) == 0;
}

bool AllowBeneath(int ruleset, int dir_fd, const char* name, Rights rights) {
  const int fd = openat(dir_fd, name, O_PATH | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return false;
  struct stat st;
  bool ok = false;
  // A symbolic link is never a rule: what it names is reached, and checked, at its target.
  if (fstat(fd, &st) == 0 && !S_ISLNK(st.st_mode)) {
    ok = AddRule(ruleset, fd, S_ISDIR(st.st_mode) ? rights.dir_rights : rights.file_rights);
  }
  close(fd);
  return ok;
}

// Every entry of `dir` but `except`.
absl::Status AllowEntriesBut(int ruleset, const std::string& dir, const std::string& except,
                             Rights rights = kReadRights) {
  const int dir_fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) return absl::NotFoundError(absl::StrCat(dir, ": ", strerror(errno)));
  DIR* d = fdopendir(dup(dir_fd));
  if (d == nullptr) {
    close(dir_fd);
    return absl::InternalError(absl::StrCat(dir, ": ", strerror(errno)));
  }
  while (const dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name == "." || name == ".." || name == except) continue;
    if (!AllowBeneath(ruleset, dir_fd, e->d_name, rights)) {
      spdlog::debug("job confinement: no rule for {}/{}", dir, name);
    }
  }
  closedir(d);
  close(dir_fd);
  return absl::OkStatus();
}

bool Inside(const std::string& path, const std::string& dir) {
  if (dir == "/") return true;
  return path.size() > dir.size() && path.compare(0, dir.size(), dir) == 0 &&
         path[dir.size()] == '/';
}

// The prefix of the storage root an output path lies below: "bob" for "bob/x/y",
// "projects/vision" for "projects/vision/x"; "" when there is none.
std::string PrefixOf(const std::string& normal) {
  std::vector<std::string> parts = absl::StrSplit(normal, '/', absl::SkipEmpty());
  if (parts.empty() || parts[0] == "." || parts[0] == "..") return "";
  if (parts[0] != "projects") return parts[0];
  return parts.size() >= 2 && parts[1] != ".." ? absl::StrCat("projects/", parts[1]) : "";
}

// root/relative as an O_PATH directory descriptor, reached one component at a time without
// following symbolic links; missing directories are made when `create`.
absl::StatusOr<int> OpenBeneath(const std::string& root, const std::string& relative, bool create) {
  int fd = open(root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return absl::NotFoundError(absl::StrCat(root, ": ", strerror(errno)));
  for (absl::string_view part : absl::StrSplit(relative, '/', absl::SkipEmpty())) {
    const std::string name(part);
    constexpr int kFlags = O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC;
    int next = openat(fd, name.c_str(), kFlags);
    if (next < 0 && errno == ENOENT && create) {
      if (mkdirat(fd, name.c_str(), 0755) == 0 || errno == EEXIST)
        next = openat(fd, name.c_str(), kFlags);
    }
    const int err = errno;
    close(fd);
    if (next < 0) {
      return absl::PermissionDeniedError(absl::StrCat(
          root, "/", relative, ": ",
          err == ENOTDIR || err == ELOOP ? "a symbolic link or not a directory" : strerror(err)));
    }
    fd = next;
  }
  return fd;
}

}  // namespace

int LandlockAbi() {
  const long abi =
      syscall(SYS_landlock_create_ruleset, nullptr, 0, LANDLOCK_CREATE_RULESET_VERSION);
  return abi < 0 ? 0 : static_cast<int>(abi);
}

absl::StatusOr<int> MakeJobRuleset(
    const std::string& secret_file,
    const std::vector<std::pair<std::string, std::string>>& job_dirs) {
  std::string secret;
  if (!secret_file.empty()) {
    std::error_code ec;
    secret = std::filesystem::canonical(secret_file, ec).string();
    if (ec) return absl::NotFoundError(absl::StrCat(secret_file, ": ", ec.message()));
    for (const auto& [flag, dir] : job_dirs) {
      const std::string real = std::filesystem::weakly_canonical(dir, ec).string();
      if (!ec && Inside(secret, real)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--token-file ", secret_file, " lies inside ", flag, " ", dir,
            ": jobs read that directory, so they could read the token; keep the token file "
            "in a directory of its own"));
      }
    }
  }
  if (LandlockAbi() < 1) {
    return absl::UnimplementedError("this kernel has no Landlock (or it is disabled)");
  }
  struct landlock_ruleset_attr attr = {.handled_access_fs = kRead};
  const int ruleset = static_cast<int>(
      syscall(SYS_landlock_create_ruleset, &attr, sizeof attr, 0));  // O_CLOEXEC by the kernel
  if (ruleset < 0) return absl::InternalError(absl::StrCat("landlock: ", strerror(errno)));
  absl::Status st;
  if (secret.empty()) {
    const int root = open("/", O_PATH | O_CLOEXEC);
    struct landlock_path_beneath_attr rule = {.allowed_access = kRead, .parent_fd = root};
    if (syscall(SYS_landlock_add_rule, ruleset, LANDLOCK_RULE_PATH_BENEATH, &rule, 0) != 0) {
      st = absl::InternalError(absl::StrCat("landlock: a rule for /: ", strerror(errno)));
    }
    close(root);
  } else {
    // /a/b/token: every entry of / but a, of /a but b, of /a/b but token.
    std::string dir = "/";
    size_t at = 1;
    while (st.ok() && at <= secret.size()) {
      size_t end = secret.find('/', at);
      if (end == std::string::npos) end = secret.size();
      const std::string step = secret.substr(at, end - at);
      st = AllowEntriesBut(ruleset, dir, step);
      dir = secret.substr(0, end);
      at = end + 1;
    }
  }
  if (!st.ok()) {
    close(ruleset);
    return st;
  }
  return ruleset;
}

absl::StatusOr<OwnedWrites> CheckOwnedWrites(const v1::JobSpec& spec,
                                             const std::string& storage_root) {
  OwnedWrites writes;
  auto owner = spec.labels().find(kOwnerLabel);
  if (owner == spec.labels().end() || owner->second.empty()) return writes;
  writes.owner = owner->second;
  if (writes.owner.find('/') != std::string::npos || writes.owner == "." || writes.owner == ".." ||
      writes.owner == "projects") {
    return absl::PermissionDeniedError(
        absl::StrCat("the job's owner '", writes.owner, "' cannot own storage"));
  }
  writes.prefixes.push_back(writes.owner);
  const google::protobuf::Message* engine = IsEngineJob(spec) ? EngineSpecOf(spec) : nullptr;
  // The output paths: an engine spec's, or an exec job's declared outputs (issue 23).
  std::vector<SpecPath> outputs;
  if (engine != nullptr) {
    for (SpecPath& p : SpecPaths(*engine)) {
      if (p.role == v1::ROLE_OUTPUT_PATH && !p.value.empty()) outputs.push_back(std::move(p));
    }
  } else if (spec.has_exec()) {
    for (const auto& [name, out] : spec.exec().outputs()) {
      SpecPath p;
      p.field = absl::StrCat("outputs.", name, ".path");
      p.value = out.path();
      p.role = v1::ROLE_OUTPUT_PATH;
      if (!p.value.empty()) outputs.push_back(std::move(p));
    }
  }
  if (outputs.empty()) return writes;
  std::error_code ec;
  const fs::path root = fs::weakly_canonical(storage_root, ec);
  if (ec) return absl::NotFoundError(absl::StrCat(storage_root, ": ", ec.message()));
  for (const SpecPath& p : outputs) {
    const std::string field = absl::StrCat(JobKind(spec), ".", p.field);
    const std::string normal = fs::path(p.value).lexically_normal().string();
    const std::string prefix = p.value[0] == '/' ? "" : PrefixOf(normal);
    if (prefix.empty() || !Inside(normal, prefix)) {
      return absl::PermissionDeniedError(
          absl::StrCat(field, ": ", p.value, " is not below one of ", writes.owner,
                       "'s prefixes of the storage root (docs/tenancy.md)"));
    }
    fs::path at = root;
    for (absl::string_view part : absl::StrSplit(prefix, '/')) {
      at /= std::string(part);
      struct stat st;
      if (lstat(at.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
        return absl::PermissionDeniedError(
            absl::StrCat(field, ": ", at.string(), " is a symbolic link; outputs go only below ",
                         "real directories of the storage root"));
      }
    }
    const fs::path resolved = fs::weakly_canonical(root / normal, ec);
    if (ec || !Inside(resolved.string(), (root / prefix).string())) {
      return absl::PermissionDeniedError(absl::StrCat(
          field, ": ", p.value, " resolves to ", resolved.string(),
          " through a symbolic link, outside ", prefix, "/ of the storage root ", root.string()));
    }
    if (std::find(writes.prefixes.begin(), writes.prefixes.end(), prefix) ==
        writes.prefixes.end()) {
      writes.prefixes.push_back(prefix);
    }
  }
  return writes;
}

absl::StatusOr<int> MakeWriteRuleset(const OwnedWrites& writes, const std::string& storage_root,
                                     const std::string& workdir) {
  if (writes.owner.empty()) return -1;
  const int abi = LandlockAbi();
  std::error_code ec;
  if (abi < 2) return -1;
  fs::create_directories(storage_root, ec);  // as the job's own mkdir -p would have
  const std::string root = fs::weakly_canonical(storage_root, ec).string();
  if (ec || root == "/") return -1;
  const uint64_t file_rights = LANDLOCK_ACCESS_FS_WRITE_FILE | (abi >= 3 ? kTruncate : 0);
  const Rights all = {file_rights | kDirWrites | LANDLOCK_ACCESS_FS_REFER, file_rights};
  struct landlock_ruleset_attr attr = {.handled_access_fs = all.dir_rights};
  const int ruleset = static_cast<int>(syscall(SYS_landlock_create_ruleset, &attr, sizeof attr, 0));
  if (ruleset < 0) return absl::InternalError(absl::StrCat("landlock: ", strerror(errno)));
  // Outside the root: every entry of each directory on the path to it, but the next step.
  absl::Status st;
  std::string dir = "/";
  for (size_t at = 1; st.ok() && at <= root.size();) {
    size_t end = root.find('/', at);
    if (end == std::string::npos) end = root.size();
    st = AllowEntriesBut(ruleset, dir, root.substr(at, end - at), all);
    dir = root.substr(0, end);
    at = end + 1;
  }
  // Inside: the owner's prefixes (made when missing) and the attempt directory.
  for (const std::string& prefix : writes.prefixes) {
    if (!st.ok()) break;
    absl::StatusOr<int> fd = OpenBeneath(root, prefix, /*create=*/true);
    if (!fd.ok()) {
      st = fd.status();
    } else {
      if (!AddRule(ruleset, *fd, all.dir_rights)) {
        st = absl::InternalError(
            absl::StrCat("landlock: a rule for ", root, "/", prefix, ": ", strerror(errno)));
      }
      close(*fd);
    }
  }
  if (st.ok() && !workdir.empty()) {
    const int fd = open(workdir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0 || !AddRule(ruleset, fd, all.dir_rights)) {
      st = absl::InternalError(
          absl::StrCat("landlock: a rule for ", workdir, ": ", strerror(errno)));
    }
    if (fd >= 0) close(fd);
  }
  if (!st.ok()) {
    close(ruleset);
    return st;
  }
  return ruleset;
}

absl::StatusOr<int> ConfineOwnedWrites(const v1::JobSpec& spec, const std::string& storage_root,
                                       const std::string& workdir) {
  absl::StatusOr<OwnedWrites> writes = CheckOwnedWrites(spec, storage_root);
  if (!writes.ok()) return writes.status();
  return MakeWriteRuleset(*writes, storage_root, workdir);
}

absl::Status HideFileFromJobs(const std::string& path) {
  std::error_code ec;
  const std::string real = std::filesystem::canonical(path, ec).string();
  if (ec) return absl::NotFoundError(absl::StrCat(path, ": ", ec.message()));
  if (unshare(CLONE_NEWNS) != 0) {
    return absl::FailedPreconditionError(absl::StrCat("unshare(CLONE_NEWNS): ", strerror(errno)));
  }
  // Slave: mounts the host makes later still reach this namespace; this one's never leave.
  if (mount("none", "/", nullptr, MS_REC | MS_SLAVE, nullptr) != 0) {
    return absl::InternalError(absl::StrCat("mount --make-rslave /: ", strerror(errno)));
  }
  if (mount("/dev/null", real.c_str(), nullptr, MS_BIND, nullptr) != 0) {
    return absl::InternalError(absl::StrCat("bind /dev/null over ", real, ": ", strerror(errno)));
  }
  return absl::OkStatus();
}

std::string TakeEnvironmentSecret(const char* name) {
  const char* value = getenv(name);
  if (value == nullptr) return "";
  std::string secret = value;
  const size_t len = strlen(name);
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    if (strncmp(*e, name, len) == 0 && (*e)[len] == '=') {
      // The original block (the stack the kernel set up) is what /proc/PID/environ reads.
      memset(*e + len + 1, 0, strlen(*e + len + 1));
    }
  }
  unsetenv(name);
  return secret;
}

}  // namespace stemma::worker
