// SHA-256 over OpenSSL's EVP API (libcrypto). The only door to OpenSSL in the engine; part of
// the torch-free stemma_engine_files library, so the data pipeline uses it too.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace stemma::engine::io {

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
  // Lowercase hex digest; the object is finished afterwards.
  std::string HexDigest();

 private:
  struct Ctx;
  std::unique_ptr<Ctx> ctx_;
};

std::string Sha256Hex(absl::string_view bytes);
// Streams a file through the hash. NotFound / errno statuses name the file.
absl::StatusOr<std::string> Sha256File(const std::string& path, uint64_t* bytes = nullptr);

}  // namespace stemma::engine::io
