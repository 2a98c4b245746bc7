// Authentication and authorisation that is not gRPC: roles, the one method -> roles table,
// bearer tokens and the token file that holds their digests, and where a client finds its
// token. The gRPC side (the Authenticator, TLS credentials) is in common/rpc.h.
//
// Token file (`stemma-coordinator --tokens FILE`), one token per line:
//
//   # sha256 of the token      role    subject
//   sha256:9f86d0818...        admin   alice
//   sha256:2c26b46b6...        worker  w0
//
// Only digests are stored, so the file does not hand out tokens to whoever reads it. A
// token is "stm_" + 43 characters of base64url (32 random bytes).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/sha256.h"  // Sha256Hex, which the token digests use

namespace stemma {

// The label that records who submitted a job (set by the coordinator from the caller's
// credential; a value sent by the client is replaced).
inline constexpr char kOwnerLabel[] = "stemma.owner";

enum class Role : uint8_t { kNone = 0, kAdmin = 1, kUser = 2, kWorker = 4, kReadOnly = 8 };
using RoleSet = uint8_t;  // bitmask of Role values

constexpr RoleSet Roles(Role r) { return static_cast<RoleSet>(r); }
template <typename... R>
constexpr RoleSet Roles(Role r, R... rest) {
  return static_cast<RoleSet>(static_cast<RoleSet>(r) | Roles(rest...));
}

// "admin", "user", "worker", "read-only" (and "none").
absl::string_view RoleName(Role role);
// INVALID_ARGUMENT naming the accepted roles.
absl::StatusOr<Role> ParseRole(absl::string_view name);

// Full gRPC method name ("/stemma.v1.UserService/Submit") -> the roles that may call it.
// Every method of every service must have an entry (auth_test walks the descriptors); a
// method that is not in the table is refused for everyone.
const std::map<std::string, RoleSet>& MethodRoles();

// The roles allowed to call `full_method`; 0 when the table has no entry.
RoleSet AllowedRoles(absl::string_view full_method);

// The earliest expiry (notAfter, Unix seconds) of the PEM certificates in `pem` (a chain
// or a CA bundle: the first to expire is the one that breaks). INVALID_ARGUMENT when it
// holds no certificate.
absl::StatusOr<int64_t> EarliestCertificateExpiry(absl::string_view pem);

// A fresh random token ("stm_..."), from the OS's CSPRNG.
absl::StatusOr<std::string> NewToken();

// The token file line for `token` (see above). INVALID_ARGUMENT for a subject that is empty
// or has spaces.
absl::StatusOr<std::string> TokenFileLine(absl::string_view token, Role role,
                                          absl::string_view subject);

// Appends a line for a new token to `path` (created with mode 0600; an existing file must
// not be readable by group or others). Returns the token, which is stored nowhere else.
absl::StatusOr<std::string> CreateTokenInFile(const std::string& path, Role role,
                                              const std::string& subject);

struct TokenIdentity {
  Role role = Role::kNone;
  std::string subject;
};

// The tokens of one token file, reloaded when the file changes (checked at most once a
// second, on lookup): adding or revoking a token needs no restart. On reload, a malformed
// line is logged and skipped, and the rest of the file applies: a revocation in it takes
// effect, and a token on a malformed line is refused (the reload observer gets the count).
// A file that cannot be read on reload keeps the previous tokens and logs why.
// Thread-safe.
class TokenStore {
 public:
  // Reads `path`. INVALID_ARGUMENT naming the file and line for a malformed line;
  // the file must not be readable by group or others.
  static absl::StatusOr<std::unique_ptr<TokenStore>> Open(const std::string& path);
  // From text (tests). Never reloads.
  static absl::StatusOr<std::unique_ptr<TokenStore>> FromText(absl::string_view text,
                                                              absl::string_view source);

  // The identity of `token`, or NOT_FOUND. The digest of the token is what is looked up,
  // so lookup time says nothing about the token itself.
  absl::StatusOr<TokenIdentity> Lookup(absl::string_view token);

  size_t size();

  // Called (under the store's lock: keep it short) after each reload attempt with the
  // number of malformed lines skipped (-1: the file could not be read); for a metric.
  void SetReloadObserver(std::function<void(int malformed_lines)> observer);

 private:
  TokenStore() = default;
  // `skipped` null: the first malformed line is an error. Otherwise malformed lines are
  // left out and described there.
  static absl::StatusOr<std::map<std::string, TokenIdentity>> Parse(
      absl::string_view text, absl::string_view source, std::vector<std::string>* skipped);
  void MaybeReload() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::string path_;  // empty: never reload
  absl::Mutex mu_;
  std::map<std::string, TokenIdentity> by_digest_ ABSL_GUARDED_BY(mu_);
  int64_t checked_ms_ ABSL_GUARDED_BY(mu_) = 0;
  struct FileStamp {
    dev_t dev = 0;
    ino_t ino = 0;
    int64_t size = -1;
    int64_t mtime_ns = 0;
    bool operator==(const FileStamp&) const = default;
  };
  FileStamp stamp_ ABSL_GUARDED_BY(mu_);
  std::function<void(int)> on_reload_ ABSL_GUARDED_BY(mu_);
};

// Keeps a flood of log lines (refused calls) to `per_second` lines a second. Allow says
// whether this one may be logged, and how many were suppressed since the last one that was
// (for that line to say). Thread-safe.
class LogRateLimiter {
 public:
  explicit LogRateLimiter(int per_second) : per_second_(per_second) {}
  bool Allow(int64_t* suppressed);

 private:
  const int per_second_;
  absl::Mutex mu_;
  int64_t window_ms_ ABSL_GUARDED_BY(mu_) = -1;
  int in_window_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t suppressed_ ABSL_GUARDED_BY(mu_) = 0;
};

// Reads a secret file (token, key) that must be a regular file not readable by group or
// others. PERMISSION_DENIED / NOT_FOUND naming the path; surrounding whitespace removed.
absl::StatusOr<std::string> ReadSecretFile(const std::string& path);

// A TLS private key (`flag` names it in errors): PERMISSION_DENIED naming the file when
// others may read it or the group may write it (mode & 027; group read is allowed because
// Kubernetes makes Secret files group-readable under fsGroup); NOT_FOUND when absent.
absl::Status CheckPrivateKeyFile(absl::string_view flag, const std::string& path);

// The CLI's token: $STEMMA_TOKEN, else the file $STEMMA_TOKEN_FILE, else
// ~/.config/stemma/token when it exists, else "" (no token). A file that is named but
// cannot be read, or is readable by others, is an error rather than a silent fallback.
absl::StatusOr<std::string> FindClientToken();

// The CLI's CA bundle: $STEMMA_CA, else ~/.config/stemma/ca.pem when it exists, else "".
std::string FindClientCaFile();

// True when the host part of HOST:PORT is a loopback address (127.0.0.0/8, ::1,
// localhost) or a unix socket; "0.0.0.0", "[::]" and any other host are not.
bool IsLoopbackAddress(absl::string_view address);

}  // namespace stemma
