#include "common/auth.h"

#include <fcntl.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/files.h"
#include "common/logging.h"
#include "common/status.h"

namespace stemma {
namespace {

constexpr absl::string_view kDigestPrefix = "sha256:";

int64_t SteadyMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

bool ValidSubject(absl::string_view s) {
  if (s.empty() || s.size() > 253) return false;
  for (char c : s) {
    if (static_cast<unsigned char>(c) <= ' ' || c == 0x7f) return false;
  }
  return true;
}

// A secret must be a regular file that only its owner can read.
absl::Status CheckPrivate(const std::string& path, const struct stat& st) {
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  if ((st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", st.st_mode & 07777);
    return absl::PermissionDeniedError(
        absl::StrCat(path, ": mode ", mode, " lets group or others read it; run chmod 600 ", path));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadWhole(const std::string& path, struct stat* st_out) {
  ASSIGN_OR_RETURN(files::UniqueFd fd, files::Open(path, O_RDONLY));
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus(absl::StrCat("stat ", path), errno);
  RETURN_IF_ERROR(CheckPrivate(path, st));
  if (st.st_size > (16 << 20)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": larger than 16 MiB"));
  }
  ASSIGN_OR_RETURN(std::string text, files::ReadAll(fd.get(), path));
  if (st_out != nullptr) *st_out = st;
  return text;
}

std::string HomeConfig(absl::string_view name) {
  const char* home = std::getenv("HOME");
  if (home == nullptr || *home == '\0') return "";
  return absl::StrCat(home, "/.config/stemma/", name);
}

}  // namespace

absl::string_view RoleName(Role role) {
  switch (role) {
    case Role::kAdmin:
      return "admin";
    case Role::kUser:
      return "user";
    case Role::kWorker:
      return "worker";
    case Role::kReadOnly:
      return "read-only";
    case Role::kNone:
      break;
  }
  return "none";
}

absl::StatusOr<Role> ParseRole(absl::string_view name) {
  for (Role r : {Role::kAdmin, Role::kUser, Role::kWorker, Role::kReadOnly}) {
    if (name == RoleName(r)) return r;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("role: '", name, "' is not one of admin, user, worker, read-only"));
}

const std::map<std::string, RoleSet>& MethodRoles() {
  // Users act on their own jobs (the adapters check the owner), admins on all; read-only
  // callers see jobs and workers but change nothing and read no logs; workers only talk
  // on their session.
  static const auto* table = new std::map<std::string, RoleSet>{
      {"/stemma.v1.UserService/Submit", Roles(Role::kAdmin, Role::kUser)},
      {"/stemma.v1.UserService/GetJob", Roles(Role::kAdmin, Role::kUser, Role::kReadOnly)},
      {"/stemma.v1.UserService/ListJobs", Roles(Role::kAdmin, Role::kUser, Role::kReadOnly)},
      {"/stemma.v1.UserService/Watch", Roles(Role::kAdmin, Role::kUser, Role::kReadOnly)},
      {"/stemma.v1.UserService/Cancel", Roles(Role::kAdmin, Role::kUser)},
      {"/stemma.v1.UserService/Retry", Roles(Role::kAdmin, Role::kUser)},
      {"/stemma.v1.UserService/ListWorkers", Roles(Role::kAdmin, Role::kUser, Role::kReadOnly)},
      {"/stemma.v1.UserService/Drain", Roles(Role::kAdmin)},
      {"/stemma.v1.UserService/Logs", Roles(Role::kAdmin, Role::kUser)},
      // Archiving finished jobs: a user's only its own and its projects' (scoped like gc).
      {"/stemma.v1.UserService/CollectJobs", Roles(Role::kAdmin, Role::kUser)},
      // Metric series and the checkpoint registry: read by all; verifying reads every
      // file of a checkpoint (not for read-only dashboards); GC deletes files: a user's
      // gc plans and deletes only what the user may manage (its own and its projects'
      // members' artifacts: the adapter scopes it), an admin's everything.
      {"/stemma.v1.UserService/QueryMetrics", Roles(Role::kAdmin, Role::kUser, Role::kReadOnly)},
      {"/stemma.v1.UserService/ListArtifacts", Roles(Role::kAdmin, Role::kUser, Role::kReadOnly)},
      {"/stemma.v1.UserService/GetArtifact", Roles(Role::kAdmin, Role::kUser, Role::kReadOnly)},
      {"/stemma.v1.UserService/Lineage", Roles(Role::kAdmin, Role::kUser, Role::kReadOnly)},
      {"/stemma.v1.UserService/VerifyArtifact", Roles(Role::kAdmin, Role::kUser)},
      {"/stemma.v1.UserService/PinArtifact", Roles(Role::kAdmin, Role::kUser)},
      {"/stemma.v1.UserService/CollectGarbage", Roles(Role::kAdmin, Role::kUser)},
      // Experiments: submitting one submits jobs.
      {"/stemma.v1.UserService/SubmitExperiment", Roles(Role::kAdmin, Role::kUser)},
      {"/stemma.v1.UserService/ListExperiments", Roles(Role::kAdmin, Role::kUser, Role::kReadOnly)},
      {"/stemma.v1.UserService/GetExperiment", Roles(Role::kAdmin, Role::kUser, Role::kReadOnly)},
      {"/stemma.v1.WorkerService/Session", Roles(Role::kWorker)},
  };
  return *table;
}

RoleSet AllowedRoles(absl::string_view full_method) {
  const auto& t = MethodRoles();
  auto it = t.find(std::string(full_method));
  return it == t.end() ? 0 : it->second;
}

absl::StatusOr<int64_t> EarliestCertificateExpiry(absl::string_view pem) {
  BIO* bio = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
  if (bio == nullptr) return absl::ResourceExhaustedError("out of memory reading a certificate");
  std::optional<int64_t> earliest;
  while (X509* cert = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr)) {
    struct tm tm {};
    if (ASN1_TIME_to_tm(X509_get0_notAfter(cert), &tm) == 1) {
      const int64_t t = static_cast<int64_t>(timegm(&tm));
      if (!earliest || t < *earliest) earliest = t;
    }
    X509_free(cert);
  }
  BIO_free(bio);
  ERR_clear_error();  // the read past the last certificate leaves "no start line" queued
  if (!earliest) return absl::InvalidArgumentError("no PEM certificate");
  return *earliest;
}

absl::StatusOr<std::string> NewToken() {
  unsigned char bytes[32];
  size_t got = 0;
  while (got < sizeof bytes) {
    ssize_t n = ::getrandom(bytes + got, sizeof bytes - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoStatus("getrandom", errno);
    got += n;
  }
  static const char kB64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
  std::string out = "stm_";
  uint32_t acc = 0;
  int bits = 0;
  for (unsigned char b : bytes) {
    acc = (acc << 8) | b;
    bits += 8;
    while (bits >= 6) {
      out += kB64[(acc >> (bits - 6)) & 63];
      bits -= 6;
    }
  }
  if (bits > 0) out += kB64[(acc << (6 - bits)) & 63];
  return out;
}

absl::StatusOr<std::string> TokenFileLine(absl::string_view token, Role role,
                                          absl::string_view subject) {
  if (!ValidSubject(subject)) {
    return absl::InvalidArgumentError(
        "subject: must be 1-253 characters without spaces or control characters");
  }
  if (role == Role::kNone) return absl::InvalidArgumentError("role: must be set");
  return absl::StrCat(kDigestPrefix, Sha256Hex(token), " ", RoleName(role), " ", subject);
}

absl::StatusOr<std::string> CreateTokenInFile(const std::string& path, Role role,
                                              const std::string& subject) {
  ASSIGN_OR_RETURN(std::string token, NewToken());
  ASSIGN_OR_RETURN(std::string line, TokenFileLine(token, role, subject));
  ASSIGN_OR_RETURN(files::UniqueFd fd, files::Open(path, O_WRONLY | O_APPEND | O_CREAT, 0600));
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus(absl::StrCat("stat ", path), errno);
  RETURN_IF_ERROR(CheckPrivate(path, st));
  if (st.st_size == 0) line = "# stemma tokens: sha256 of the token, role, subject\n" + line;
  line += "\n";
  RETURN_IF_ERROR(files::WriteAll(fd.get(), line, path));
  RETURN_IF_ERROR(files::SyncFd(fd.get(), path));
  return token;
}

absl::StatusOr<std::map<std::string, TokenIdentity>> TokenStore::Parse(
    absl::string_view text, absl::string_view source, std::vector<std::string>* skipped) {
  std::map<std::string, TokenIdentity> out;
  std::set<std::string> twice;  // digests on more than one line: refused (which role?)
  int line_no = 0;
  for (absl::string_view raw : absl::StrSplit(text, '\n')) {
    ++line_no;
    absl::string_view line = absl::StripAsciiWhitespace(raw);
    if (line.empty() || line[0] == '#') continue;
    std::string why;
    std::vector<absl::string_view> f =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    std::string digest;
    absl::StatusOr<Role> role = Role::kNone;
    if (f.size() != 3) {
      why = "expected 'sha256:<hex digest> <role> <subject>'";
    } else if (f[0].substr(0, kDigestPrefix.size()) != kDigestPrefix) {
      why = "the digest must start with 'sha256:' (the file holds digests, not tokens)";
    } else {
      digest = absl::AsciiStrToLower(f[0].substr(kDigestPrefix.size()));
      role = ParseRole(f[1]);
      if (digest.size() != 64 ||
          digest.find_first_not_of("0123456789abcdef") != std::string::npos) {
        why = "the digest must be 64 hex digits";
      } else if (!role.ok()) {
        why = std::string(role.status().message());
      } else if (!ValidSubject(f[2])) {
        why = "bad subject";
      } else if (out.count(digest) != 0 || twice.count(digest) != 0) {
        why = "the same token appears twice";
        out.erase(digest);
        twice.insert(digest);
      }
    }
    if (!why.empty()) {
      const std::string message = absl::StrCat(source, ": line ", line_no, ": ", why);
      if (skipped == nullptr) return absl::InvalidArgumentError(message);
      skipped->push_back(message);
      continue;
    }
    out[digest] = TokenIdentity{*role, std::string(f[2])};
  }
  return out;
}

absl::StatusOr<std::unique_ptr<TokenStore>> TokenStore::Open(const std::string& path) {
  struct stat st;
  ASSIGN_OR_RETURN(std::string text, ReadWhole(path, &st));
  ASSIGN_OR_RETURN(auto parsed, Parse(text, path, nullptr));
  std::unique_ptr<TokenStore> store(new TokenStore());
  store->path_ = path;
  absl::MutexLock lock(&store->mu_);
  store->by_digest_ = std::move(parsed);
  store->stamp_ = FileStamp{st.st_dev, st.st_ino, static_cast<int64_t>(st.st_size),
                            st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec};
  store->checked_ms_ = SteadyMs();
  return store;
}

absl::StatusOr<std::unique_ptr<TokenStore>> TokenStore::FromText(absl::string_view text,
                                                                 absl::string_view source) {
  ASSIGN_OR_RETURN(auto parsed, Parse(text, source, nullptr));
  std::unique_ptr<TokenStore> store(new TokenStore());
  absl::MutexLock lock(&store->mu_);
  store->by_digest_ = std::move(parsed);
  return store;
}

void TokenStore::MaybeReload() {
  if (path_.empty()) return;
  const int64_t now = SteadyMs();
  if (now - checked_ms_ < 1000) return;
  checked_ms_ = now;
  struct stat st;
  if (::stat(path_.c_str(), &st) != 0) {
    spdlog::error("auth: cannot stat token file {}: {}; keeping the {} tokens loaded", path_,
                  std::strerror(errno), by_digest_.size());
    return;
  }
  FileStamp stamp{st.st_dev, st.st_ino, static_cast<int64_t>(st.st_size),
                  st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec};
  if (stamp == stamp_) return;
  auto text = ReadWhole(path_, &st);
  stamp_ = stamp;  // do not log again until it changes
  if (!text.ok()) {
    spdlog::error("auth: token file {} not reloaded: {}; keeping the {} tokens loaded", path_,
                  text.status().ToString(), by_digest_.size());
    if (on_reload_) on_reload_(-1);
    return;
  }
  // A malformed line must not keep a revocation elsewhere in the file from taking effect:
  // the well-formed lines apply, and a token on a malformed line is refused.
  std::vector<std::string> skipped;
  absl::StatusOr<std::map<std::string, TokenIdentity>> parsed = Parse(*text, path_, &skipped);
  if (!parsed.ok()) return;  // not reached: lenient parsing skips instead of failing
  for (const std::string& why : skipped) {
    spdlog::error("auth: token file line skipped (its token is refused): {}", why);
  }
  by_digest_ = *std::move(parsed);
  spdlog::info("auth: reloaded {} tokens from {}{}", by_digest_.size(), path_,
               skipped.empty() ? "" : absl::StrCat(" (", skipped.size(), " malformed lines)"));
  if (on_reload_) on_reload_(static_cast<int>(skipped.size()));
}

void TokenStore::SetReloadObserver(std::function<void(int)> observer) {
  absl::MutexLock lock(&mu_);
  on_reload_ = std::move(observer);
}

bool LogRateLimiter::Allow(int64_t* suppressed) {
  const int64_t window = SteadyMs() / 1000;
  absl::MutexLock lock(&mu_);
  if (window != window_ms_) {
    window_ms_ = window;
    in_window_ = 0;
  }
  if (in_window_ >= per_second_) {
    ++suppressed_;
    return false;
  }
  ++in_window_;
  *suppressed = suppressed_;
  suppressed_ = 0;
  return true;
}

absl::StatusOr<TokenIdentity> TokenStore::Lookup(absl::string_view token) {
  const std::string digest = Sha256Hex(token);
  absl::MutexLock lock(&mu_);
  MaybeReload();
  auto it = by_digest_.find(digest);
  if (it == by_digest_.end()) return absl::NotFoundError("unknown token");
  return it->second;
}

size_t TokenStore::size() {
  absl::MutexLock lock(&mu_);
  return by_digest_.size();
}

absl::StatusOr<std::string> ReadSecretFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadWhole(path, nullptr));
  return std::string(absl::StripAsciiWhitespace(text));
}

absl::Status CheckPrivateKeyFile(absl::string_view flag, const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat(flag, " ", path, ": ", std::strerror(errno)));
  }
  if ((st.st_mode & 0027) != 0) {
    return absl::PermissionDeniedError(absl::StrFormat(
        "%s %s: mode %04o lets other users read or change the private key; chmod 600 %s", flag,
        path, st.st_mode & 07777, path));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> FindClientToken() {
  if (const char* t = std::getenv("STEMMA_TOKEN"); t != nullptr && *t != '\0') {
    return std::string(absl::StripAsciiWhitespace(t));
  }
  if (const char* f = std::getenv("STEMMA_TOKEN_FILE"); f != nullptr && *f != '\0') {
    auto token = ReadSecretFile(f);
    if (!token.ok()) {
      return absl::Status(token.status().code(),
                          absl::StrCat("token file: ", token.status().message()));
    }
    return token;
  }
  const std::string home = HomeConfig("token");
  if (home.empty()) return std::string();
  struct stat st;
  if (::stat(home.c_str(), &st) != 0) return std::string();
  auto token = ReadSecretFile(home);
  if (!token.ok()) {
    return absl::Status(token.status().code(),
                        absl::StrCat("token file: ", token.status().message()));
  }
  return token;
}

std::string FindClientCaFile() {
  if (const char* ca = std::getenv("STEMMA_CA"); ca != nullptr && *ca != '\0') return ca;
  const std::string home = HomeConfig("ca.pem");
  struct stat st;
  if (!home.empty() && ::stat(home.c_str(), &st) == 0) return home;
  return "";
}

bool IsLoopbackAddress(absl::string_view address) {
  if (address.substr(0, 5) == "unix:") return true;
  absl::string_view host = address;
  if (!host.empty() && host[0] == '[') {
    size_t end = host.find(']');
    if (end == absl::string_view::npos) return false;
    host = host.substr(1, end - 1);
  } else if (size_t colon = host.rfind(':'); colon != absl::string_view::npos) {
    host = host.substr(0, colon);
  }
  if (host == "localhost" || host == "::1") return true;
  if (host.substr(0, 4) == "127.") {
    for (char c : host) {
      if (!(c == '.' || (c >= '0' && c <= '9'))) return false;
    }
    return true;
  }
  return false;
}

}  // namespace stemma
