#include "common/k8s_token_review.h"

#include <chrono>
#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/files.h"
#include "common/https_client.h"
#include "common/sha256.h"

namespace stemma {
namespace {

constexpr char kReviewPath[] = "/apis/authentication.k8s.io/v1/tokenreviews";
constexpr char kServiceAccountPrefix[] = "system:serviceaccount:";
constexpr char kPodNameKey[] = "authentication.kubernetes.io/pod-name";
// Past this many cached answers the cache starts over (each is one digest and a name).
constexpr size_t kMaxCached = 100000;

int64_t SteadyMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

absl::Status ParseK8sRole(const std::string& text, std::map<std::string, Role>* roles) {
  const size_t eq = text.rfind('=');
  const std::string account = eq == std::string::npos ? "" : text.substr(0, eq);
  const std::vector<std::string> parts = absl::StrSplit(account, '/');
  if (eq == std::string::npos || parts.size() != 2 || parts[0].empty() || parts[1].empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--k8s-role: '", text,
                     "': expected NAMESPACE/SERVICEACCOUNT=ROLE (stemma/stemma-worker=worker)"));
  }
  absl::StatusOr<Role> role = ParseRole(text.substr(eq + 1));
  if (!role.ok())
    return absl::InvalidArgumentError(absl::StrCat("--k8s-role: ", role.status().message()));
  (*roles)[account] = *role;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<TokenReviewer>> TokenReviewer::Create(TokenReviewOptions options) {
  if (absl::Status url = ParseHttpsUrl(options.api_server).status(); !url.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--k8s-token-review: ", url.message()));
  }
  if (options.roles.empty()) {
    return absl::InvalidArgumentError(
        "--k8s-token-review needs at least one --k8s-role NAMESPACE/SERVICEACCOUNT=ROLE");
  }
  if (options.audience.empty()) return absl::InvalidArgumentError("--k8s-audience: empty");
  if (absl::Status ca = files::ReadFile(options.ca_file).status(); !ca.ok()) {
    return absl::Status(ca.code(), absl::StrCat("--k8s-ca: ", ca.message()));
  }
  if (absl::Status own = files::ReadFile(options.token_file).status(); !own.ok()) {
    return absl::Status(own.code(), absl::StrCat("--k8s-token-file: ", own.message()));
  }
  auto reviewer = std::unique_ptr<TokenReviewer>(new TokenReviewer(std::move(options)));
  reviewer->now_ms_ = SteadyMs;
  return reviewer;
}

int64_t TokenReviewer::calls() {
  absl::MutexLock lock(&mu_);
  return calls_;
}

absl::StatusOr<TokenIdentity> TokenReviewer::Review(absl::string_view token) {
  const std::string key = Sha256Hex(token);
  {
    absl::MutexLock lock(&mu_);
    auto it = cache_.find(key);
    if (it != cache_.end() && it->second.expires_ms > now_ms_()) return it->second.answer;
  }
  // Outside the lock: a slow API server delays only the calls that need it.
  absl::StatusOr<TokenIdentity> answer = Ask(token);
  if (answer.status().code() == absl::StatusCode::kUnavailable) return answer;  // not cached
  absl::MutexLock lock(&mu_);
  if (cache_.size() >= kMaxCached) cache_.clear();
  cache_[key] = {answer, now_ms_() + (answer.ok() ? options_.ttl_ms : options_.refused_ttl_ms)};
  return answer;
}

absl::StatusOr<TokenIdentity> TokenReviewer::Ask(absl::string_view token) {
  absl::StatusOr<std::string> own = files::ReadFile(options_.token_file);
  if (!own.ok()) {
    return absl::UnavailableError(
        absl::StrCat("token review: the coordinator's own token: ", own.status().message()));
  }
  nlohmann::json request = {
      {"apiVersion", "authentication.k8s.io/v1"},
      {"kind", "TokenReview"},
      {"spec", {{"token", std::string(token)}, {"audiences", {options_.audience}}}}};
  HttpsRequest http;
  http.url = absl::StrCat(options_.api_server, kReviewPath);
  http.ca_file = options_.ca_file;
  http.timeout_ms = options_.timeout_ms;
  http.body = request.dump();
  http.headers = {{"Authorization", absl::StrCat("Bearer ", absl::StripAsciiWhitespace(*own))},
                  {"Content-Type", "application/json"},
                  {"Accept", "application/json"}};
  {
    absl::MutexLock lock(&mu_);
    ++calls_;
  }
  absl::StatusOr<HttpsResponse> response = HttpsCall(http);
  if (!response.ok()) {
    return absl::UnavailableError(absl::StrCat("token review: ", response.status().message()));
  }
  if (response->status == 401 || response->status == 403) {
    return absl::UnavailableError(absl::StrCat(
        "token review: the API server refused the coordinator's own token (HTTP ", response->status,
        "): its service account needs the system:auth-delegator ClusterRole"));
  }
  if (response->status != 200 && response->status != 201) {
    return absl::UnavailableError(
        absl::StrCat("token review: HTTP ", response->status, ": ", response->body.substr(0, 200)));
  }
  return Interpret(response->body);
}

absl::StatusOr<TokenIdentity> TokenReviewer::Interpret(const std::string& body) const {
  const nlohmann::json r = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (!r.is_object() || !r.contains("status") || !r["status"].is_object()) {
    return absl::UnavailableError("token review: the API server's answer has no status");
  }
  const nlohmann::json& status = r["status"];
  if (!status.value("authenticated", false)) {
    const std::string why = status.value("error", std::string());
    return absl::NotFoundError(
        absl::StrCat("the cluster does not authenticate this token", why.empty() ? "" : ": ", why));
  }
  if (status.contains("audiences") && status["audiences"].is_array()) {
    bool ours = false;
    for (const auto& a : status["audiences"])
      ours = ours || (a.is_string() && a == options_.audience);
    if (!ours) {
      return absl::NotFoundError(absl::StrCat("token not issued for audience ", options_.audience));
    }
  }
  const nlohmann::json user = status.value("user", nlohmann::json::object());
  const std::string username = user.value("username", std::string());
  if (!absl::StartsWith(username, kServiceAccountPrefix)) {
    return absl::NotFoundError(absl::StrCat("'", username, "' is not a service account"));
  }
  std::string account = username.substr(sizeof(kServiceAccountPrefix) - 1);
  const size_t colon = account.find(':');
  if (colon == std::string::npos)
    return absl::NotFoundError(absl::StrCat("bad username '", username, "'"));
  account[colon] = '/';
  auto role = options_.roles.find(account);
  if (role == options_.roles.end()) {
    return absl::NotFoundError(
        absl::StrCat("service account ", account, " has no role (--k8s-role)"));
  }
  TokenIdentity id;
  id.role = role->second;
  id.subject = account;
  const nlohmann::json extra = user.value("extra", nlohmann::json::object());
  std::string pod;
  if (extra.contains(kPodNameKey) && extra[kPodNameKey].is_array() && !extra[kPodNameKey].empty() &&
      extra[kPodNameKey][0].is_string()) {
    pod = extra[kPodNameKey][0].get<std::string>();
  }
  if (id.role == Role::kWorker) {
    // One service account for every worker pod: the pod is the worker.
    if (pod.empty()) {
      return absl::NotFoundError(absl::StrCat("a worker token of ", account,
                                              " must be bound to a pod (a projected token)"));
    }
    id.subject = pod;
  }
  return id;
}

}  // namespace stemma
