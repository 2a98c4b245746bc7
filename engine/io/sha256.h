// The engine's names for the one SHA-256 door (common/sha256.h, OpenSSL's EVP API).
#pragma once

#include "common/sha256.h"

namespace stemma::engine::io {

using ::stemma::Sha256;
using ::stemma::Sha256File;
using ::stemma::Sha256Hex;

}  // namespace stemma::engine::io
