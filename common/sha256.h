// The one SHA-256 door (OpenSSL's EVP API, libcrypto) for every Stemma process: token
// digests, artifact and checkpoint manifests, cache keys. Torch-free.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace stemma {

// Incremental hash. Not thread-safe; one per stream of bytes.
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  Sha256(Sha256&&) noexcept;
  Sha256& operator=(Sha256&&) noexcept;
  void Update(const void* data, size_t size);
  void Update(absl::string_view bytes) { Update(bytes.data(), bytes.size()); }
  // Lowercase hex digest (64 characters); the object is finished afterwards.
  std::string HexDigest();

 private:
  struct Ctx;
  std::unique_ptr<Ctx> ctx_;
};

// Lowercase hex SHA-256 of `bytes`.
std::string Sha256Hex(absl::string_view bytes);
// Streams a file through the hash; `*bytes` (optional) gets its size. Errors name the file
// ("open <path>: ...", "read <path>: ...").
absl::StatusOr<std::string> Sha256File(const std::string& path, uint64_t* bytes = nullptr);

}  // namespace stemma
