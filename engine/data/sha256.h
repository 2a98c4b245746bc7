// SHA-256 in plain C++ for the data pipeline's shard and source checksums. The engine's
// OpenSSL door (engine/io/sha256.h) lives in stemma_engine_io, which links LibTorch; the data
// library stays torch-free so that it builds in seconds, hence this small copy (FIPS 180-4).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace stemma::engine::data {

// Incremental hash. Not thread-safe; one per stream of bytes.
class Sha256 {
 public:
  Sha256();
  void Update(const void* data, size_t size);
  // Lowercase hex digest; the object must not be updated afterwards.
  std::string HexDigest();

 private:
  void Block(const uint8_t* p);
  std::array<uint32_t, 8> h_;
  std::array<uint8_t, 64> buf_;
  size_t buf_len_ = 0;
  uint64_t total_ = 0;
};

std::string Sha256Hex(std::string_view bytes);
// Streams a file through the hash; errors name the file. `bytes` receives its size.
absl::StatusOr<std::string> Sha256File(const std::string& path, uint64_t* bytes = nullptr);

}  // namespace stemma::engine::data
