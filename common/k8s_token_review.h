// Worker (and other) identity from the Kubernetes cluster: a pod presents a projected
// service-account token (audience "stemma") as its bearer token, and the coordinator asks
// the API server whether it is valid (the TokenReview API: POST
// /apis/authentication.k8s.io/v1/tokenreviews, authenticated with the coordinator's own
// service-account token, which needs the system:auth-delegator ClusterRole). The service
// account maps to a role (`--k8s-role stemma/stemma-worker=worker`); a worker's subject is
// the name of the pod the token is bound to, so every pod of a scaled StatefulSet is its
// own worker and no token file line is needed for a new node.
//
// Answers are cached by the token's digest: accepted tokens for the TTL, refused ones for a
// few seconds (a flood of bad tokens does not become a flood of reviews). The API server
// being unreachable is UNAVAILABLE, never an acceptance; a cached acceptance still holds
// until its TTL ends. Thread-safe; a review blocks the calling thread for at most the
// timeout (the coordinator's gRPC handlers are synchronous).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/auth.h"

namespace stemma {

struct TokenReviewOptions {
  std::string api_server;  // https://kubernetes.default.svc
  // The CA of the API server and the coordinator's own token (re-read on every review:
  // kubelet rotates it).
  std::string ca_file = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt";
  std::string token_file = "/var/run/secrets/kubernetes.io/serviceaccount/token";
  std::string audience = "stemma";  // a token must have been issued for it
  // "NAMESPACE/SERVICEACCOUNT" -> role. Tokens of other service accounts are refused.
  std::map<std::string, Role> roles;
  int64_t ttl_ms = 60000;         // how long an accepted token is trusted without a review
  int64_t refused_ttl_ms = 5000;  // how long a refused one stays refused
  int timeout_ms = 5000;          // one review
};

// "NAMESPACE/SERVICEACCOUNT=ROLE" (the --k8s-role flag). INVALID_ARGUMENT naming the flag.
absl::Status ParseK8sRole(const std::string& text, std::map<std::string, Role>* roles);

class TokenReviewer {
 public:
  // INVALID_ARGUMENT (naming the option) for a URL that is not https, no roles, or a role
  // of kNone; NOT_FOUND when the CA or token file cannot be read.
  static absl::StatusOr<std::unique_ptr<TokenReviewer>> Create(TokenReviewOptions options);

  // The identity of `token`: NOT_FOUND when the API server does not authenticate it, it
  // was not issued for the audience, its service account has no role, or a worker token is
  // bound to no pod; UNAVAILABLE (with the cause) when the API server could not answer.
  absl::StatusOr<TokenIdentity> Review(absl::string_view token);

  // Reviews that reached the API server (tests, logs).
  int64_t calls();

  // The clock, in milliseconds (tests); steady clock by default.
  void SetClockForTest(std::function<int64_t()> now_ms) { now_ms_ = std::move(now_ms); }

 private:
  explicit TokenReviewer(TokenReviewOptions options) : options_(std::move(options)) {}
  absl::StatusOr<TokenIdentity> Ask(absl::string_view token);
  absl::StatusOr<TokenIdentity> Interpret(const std::string& body) const;

  const TokenReviewOptions options_;
  std::function<int64_t()> now_ms_;
  struct Entry {
    absl::StatusOr<TokenIdentity> answer;
    int64_t expires_ms = 0;
  };
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, Entry> cache_ ABSL_GUARDED_BY(mu_);  // by token digest
  int64_t calls_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace stemma
