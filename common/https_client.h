// A small HTTPS/1.1 client over OpenSSL for the few calls the control plane makes to other
// services' REST APIs (the Kubernetes TokenReview API, common/k8s_token_review.h). One
// request per connection (Connection: close), the server's certificate verified against a
// CA file and the URL's host, bounded by a deadline. Not a general HTTP client: no
// redirects, no proxies, no keep-alive. Thread-safe (no shared state).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace stemma {

struct HttpsRequest {
  std::string method = "POST";
  std::string url;  // https://HOST[:PORT][/PATH]
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  // PEM CA bundle the server's certificate must chain to; empty: the system's bundle.
  std::string ca_file;
  int timeout_ms = 5000;  // the whole exchange: connect, handshake, request, response
};

struct HttpsResponse {
  int status = 0;  // 200, 201, 401, ...
  std::string body;
};

// INVALID_ARGUMENT for a URL that is not https://HOST...; UNAVAILABLE (naming the URL and
// the cause: refused, timed out, TLS verification failed, the connection closed early) when
// no complete response came back. A response with any status code is returned as it is.
absl::StatusOr<HttpsResponse> HttpsCall(const HttpsRequest& request);

// Splits https://HOST[:PORT][/PATH] (IPv6 hosts in brackets). INVALID_ARGUMENT otherwise.
struct HttpsUrl {
  std::string host;
  std::string port = "443";
  std::string path = "/";
};
absl::StatusOr<HttpsUrl> ParseHttpsUrl(const std::string& url);

}  // namespace stemma
