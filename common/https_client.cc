#include "common/https_client.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/files.h"

namespace stemma {
namespace {

using SteadyClock = std::chrono::steady_clock;

// OpenSSL's queued errors, oldest first, as one line (and the queue emptied).
std::string SslErrors() {
  std::string out;
  for (unsigned long e = ERR_get_error(); e != 0; e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof buf);
    absl::StrAppend(&out, out.empty() ? "" : "; ", buf);
  }
  return out.empty() ? "unknown TLS error" : out;
}

int RemainingMs(SteadyClock::time_point deadline) {
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - SteadyClock::now()).count();
  return ms > 0 ? static_cast<int>(ms) : 0;
}

bool IsIpLiteral(const std::string& host) {
  unsigned char buf[sizeof(in6_addr)];
  return inet_pton(AF_INET, host.c_str(), buf) == 1 || inet_pton(AF_INET6, host.c_str(), buf) == 1;
}

// A non-blocking TCP connection to the URL's host and port, made before the deadline.
absl::StatusOr<int> Connect(const HttpsUrl& u, SteadyClock::time_point deadline) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(u.host.c_str(), u.port.c_str(), &hints, &found); rc != 0) {
    return absl::UnavailableError(absl::StrCat("cannot resolve ", u.host, ": ", gai_strerror(rc)));
  }
  std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> guard(found, freeaddrinfo);
  std::string last = "no address";
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    files::UniqueFd s{
        ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol)};
    if (!s.valid()) {
      last = std::strerror(errno);
      continue;
    }
    if (::connect(s.get(), a->ai_addr, a->ai_addrlen) != 0) {
      if (errno != EINPROGRESS) {
        last = std::strerror(errno);
        continue;
      }
      pollfd p{s.get(), POLLOUT, 0};
      const int n = ::poll(&p, 1, RemainingMs(deadline));
      int err = 0;
      socklen_t len = sizeof err;
      if (n == 0) {
        last = "timed out connecting";
        continue;
      }
      if (n < 0 || ::getsockopt(s.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) {
        last = std::strerror(n < 0 ? errno : err);
        continue;
      }
    }
    return s.release();
  }
  return absl::UnavailableError(last);
}

// Repeats an SSL call until it completes, waiting for the socket as OpenSSL asks, until the
// deadline. Returns the call's last result (<= 0: failed; `timed_out` says if by the clock).
template <typename F>
int SslIo(SSL* ssl, int fd, SteadyClock::time_point deadline, bool* timed_out, F call) {
  for (;;) {
    const int r = call();
    if (r > 0) return r;
    const int e = SSL_get_error(ssl, r);
    short events = 0;
    if (e == SSL_ERROR_WANT_READ) {
      events = POLLIN;
    } else if (e == SSL_ERROR_WANT_WRITE) {
      events = POLLOUT;
    } else {
      return r;
    }
    pollfd p{fd, events, 0};
    const int ms = RemainingMs(deadline);
    if (ms == 0 || ::poll(&p, 1, ms) <= 0) {
      *timed_out = true;
      return -1;
    }
  }
}

// The body of a complete response in `raw`, or nullopt while more is needed. `eof`: the
// server closed the connection (a body without a length ends there).
absl::StatusOr<std::optional<HttpsResponse>> ParseResponse(const std::string& raw, bool eof) {
  const size_t end = raw.find("\r\n\r\n");
  if (end == std::string::npos) {
    if (eof) return absl::UnavailableError("the connection closed before the response headers");
    return std::nullopt;
  }
  std::vector<std::string> lines = absl::StrSplit(raw.substr(0, end), "\r\n");
  HttpsResponse out;
  std::vector<std::string> status = absl::StrSplit(lines[0], absl::MaxSplits(' ', 2));
  if (status.size() < 2 || !absl::StartsWith(status[0], "HTTP/1.") ||
      !absl::SimpleAtoi(status[1], &out.status)) {
    return absl::UnavailableError(absl::StrCat("not an HTTP response: '", lines[0], "'"));
  }
  bool chunked = false;
  std::optional<size_t> length;
  for (size_t i = 1; i < lines.size(); ++i) {
    const size_t colon = lines[i].find(':');
    if (colon == std::string::npos) continue;
    const std::string name = absl::AsciiStrToLower(lines[i].substr(0, colon));
    const std::string value(absl::StripAsciiWhitespace(lines[i].substr(colon + 1)));
    if (name == "transfer-encoding")
      chunked = absl::StrContains(absl::AsciiStrToLower(value), "chunked");
    size_t n = 0;
    if (name == "content-length" && absl::SimpleAtoi(value, &n)) length = n;
  }
  const std::string body = raw.substr(end + 4);
  if (chunked) {
    size_t pos = 0;
    for (;;) {
      const size_t line_end = body.find("\r\n", pos);
      if (line_end == std::string::npos) break;
      size_t size = 0;
      const std::string hex = body.substr(pos, body.find_first_of(";\r", pos) - pos);
      if (!absl::SimpleHexAtoi(hex, &size)) {
        return absl::UnavailableError(absl::StrCat("bad chunk size '", hex, "'"));
      }
      if (size == 0) return out;
      if (body.size() < line_end + 2 + size + 2) break;
      out.body.append(body, line_end + 2, size);
      pos = line_end + 2 + size + 2;
    }
    if (eof) return absl::UnavailableError("the connection closed inside a chunked body");
    return std::nullopt;
  }
  if (length.has_value()) {
    if (body.size() >= *length) {
      out.body = body.substr(0, *length);
      return out;
    }
    if (eof) return absl::UnavailableError("the connection closed before the whole body");
    return std::nullopt;
  }
  if (!eof) return std::nullopt;
  out.body = body;
  return out;
}

// The exchange on a connected socket.
absl::StatusOr<HttpsResponse> Exchange(const HttpsRequest& request, const HttpsUrl& u, int fd,
                                       SteadyClock::time_point deadline) {
  std::unique_ptr<SSL_CTX, decltype(&SSL_CTX_free)> ctx(SSL_CTX_new(TLS_client_method()),
                                                        SSL_CTX_free);
  if (ctx == nullptr) return absl::InternalError(SslErrors());
  SSL_CTX_set_min_proto_version(ctx.get(), TLS1_2_VERSION);
  SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER, nullptr);
  // A server that closes without close_notify (many do after Connection: close) ends the body.
  SSL_CTX_set_options(ctx.get(), SSL_OP_IGNORE_UNEXPECTED_EOF);
  const int loaded = request.ca_file.empty() ? SSL_CTX_set_default_verify_paths(ctx.get())
                                             : SSL_CTX_load_verify_locations(
                                                   ctx.get(), request.ca_file.c_str(), nullptr);
  if (loaded != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CA file ", request.ca_file.empty() ? "(system)" : request.ca_file, ": ", SslErrors()));
  }
  std::unique_ptr<SSL, decltype(&SSL_free)> ssl(SSL_new(ctx.get()), SSL_free);
  if (ssl == nullptr) return absl::InternalError(SslErrors());
  if (IsIpLiteral(u.host)) {
    X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl.get()), u.host.c_str());
  } else {
    SSL_set_tlsext_host_name(ssl.get(), u.host.c_str());
    SSL_set1_host(ssl.get(), u.host.c_str());
  }
  SSL_set_fd(ssl.get(), fd);
  bool timed_out = false;
  if (SslIo(ssl.get(), fd, deadline, &timed_out, [&] { return SSL_connect(ssl.get()); }) <= 0) {
    if (timed_out) return absl::DeadlineExceededError("timed out in the TLS handshake");
    const long verify = SSL_get_verify_result(ssl.get());
    return absl::UnavailableError(
        verify != X509_V_OK ? absl::StrCat("TLS: the server's certificate did not verify: ",
                                           X509_verify_cert_error_string(verify))
                            : absl::StrCat("TLS handshake failed: ", SslErrors()));
  }
  std::string out =
      absl::StrCat(request.method, " ", u.path, " HTTP/1.1\r\nHost: ", u.host,
                   u.port == "443" ? "" : absl::StrCat(":", u.port),
                   "\r\nConnection: close\r\nContent-Length: ", request.body.size(), "\r\n");
  for (const auto& [name, value] : request.headers)
    absl::StrAppend(&out, name, ": ", value, "\r\n");
  absl::StrAppend(&out, "\r\n", request.body);
  size_t sent = 0;
  while (sent < out.size()) {
    const int n = SslIo(ssl.get(), fd, deadline, &timed_out, [&] {
      return SSL_write(ssl.get(), out.data() + sent, static_cast<int>(out.size() - sent));
    });
    if (n <= 0) {
      return timed_out ? absl::DeadlineExceededError("timed out sending the request")
                       : absl::UnavailableError(absl::StrCat("sending: ", SslErrors()));
    }
    sent += static_cast<size_t>(n);
  }
  std::string raw;
  char buf[16384];
  for (;;) {
    const int n = SslIo(ssl.get(), fd, deadline, &timed_out,
                        [&] { return SSL_read(ssl.get(), buf, sizeof buf); });
    const bool eof = n <= 0;
    if (eof && timed_out) return absl::DeadlineExceededError("timed out reading the response");
    if (eof && SSL_get_error(ssl.get(), n) != SSL_ERROR_ZERO_RETURN && ERR_peek_error() != 0) {
      return absl::UnavailableError(absl::StrCat("reading: ", SslErrors()));
    }
    if (n > 0) raw.append(buf, static_cast<size_t>(n));
    auto parsed = ParseResponse(raw, eof);
    if (!parsed.ok()) return parsed.status();
    if (parsed->has_value()) return **parsed;
    if (raw.size() > (64u << 20)) return absl::UnavailableError("response over 64 MiB");
  }
}

}  // namespace

absl::StatusOr<HttpsUrl> ParseHttpsUrl(const std::string& url) {
  constexpr absl::string_view kScheme = "https://";
  if (!absl::StartsWith(url, kScheme)) {
    return absl::InvalidArgumentError(absl::StrCat("'", url, "' is not an https:// URL"));
  }
  HttpsUrl u;
  std::string rest = url.substr(kScheme.size());
  const size_t slash = rest.find('/');
  if (slash != std::string::npos) {
    u.path = rest.substr(slash);
    rest = rest.substr(0, slash);
  }
  if (absl::StartsWith(rest, "[")) {  // [v6]:port
    const size_t close = rest.find(']');
    if (close == std::string::npos)
      return absl::InvalidArgumentError(absl::StrCat("'", url, "': unclosed ["));
    u.host = rest.substr(1, close - 1);
    rest = rest.substr(close + 1);
    if (absl::StartsWith(rest, ":")) u.port = rest.substr(1);
  } else if (const size_t colon = rest.rfind(':'); colon != std::string::npos) {
    u.host = rest.substr(0, colon);
    u.port = rest.substr(colon + 1);
  } else {
    u.host = rest;
  }
  int port = 0;
  if (u.host.empty() || !absl::SimpleAtoi(u.port, &port) || port <= 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", url, "': expected https://HOST[:PORT][/PATH]"));
  }
  return u;
}

absl::StatusOr<HttpsResponse> HttpsCall(const HttpsRequest& request) {
  absl::StatusOr<HttpsUrl> u = ParseHttpsUrl(request.url);
  if (!u.ok()) return u.status();
  const auto deadline = SteadyClock::now() + std::chrono::milliseconds(request.timeout_ms);
  const std::string what = absl::StrCat(request.method, " ", request.url, ": ");
  absl::StatusOr<int> fd = Connect(*u, deadline);
  if (!fd.ok()) return absl::UnavailableError(absl::StrCat(what, fd.status().message()));
  files::UniqueFd closer{*fd};
  ERR_clear_error();
  absl::StatusOr<HttpsResponse> r = Exchange(request, *u, *fd, deadline);
  if (!r.ok()) {
    // Everything but a bad CA file means the server could not be reached or understood.
    return absl::Status(r.status().code() == absl::StatusCode::kInvalidArgument
                            ? absl::StatusCode::kInvalidArgument
                            : absl::StatusCode::kUnavailable,
                        absl::StrCat(what, r.status().message()));
  }
  return r;
}

}  // namespace stemma
