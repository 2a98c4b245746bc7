#include "engine/merge/dtype_convert.h"

#include <cmath>
#include <cstring>

namespace stemma::engine::merge {
namespace {

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Loops are written per dtype so the compiler vectorises the bf16/f32 cases.
template <typename Fn>
void Convert(const uint16_t* src, int64_t n, float* dst, Fn fn) {
  for (int64_t i = 0; i < n; ++i) dst[i] = fn(src[i]);
}

}  // namespace

bool IsFloatDtype(io::Dtype dtype) {
  return dtype == io::Dtype::kF64 || dtype == io::Dtype::kF32 || dtype == io::Dtype::kF16 ||
         dtype == io::Dtype::kBF16;
}

uint16_t F32ToBf16(float value) {
  uint32_t u = Bits(value);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
  return static_cast<uint16_t>(u >> 16);
}

float F16ToF32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact in fp32
    float v = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  if (exponent == 31) return FromBits(sign | 0x7f800000u | (mantissa << 13));
  return FromBits(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

uint16_t F32ToF16(float value) {
  uint32_t x = Bits(value);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  x &= 0x7fffffffu;
  if (x >= 0x7f800000u) return sign | (x > 0x7f800000u ? 0x7e00 : 0x7c00);  // NaN / inf
  if (x >= 0x477ff000u) return sign | 0x7c00;  // >= 65520 rounds to inf
  if (x < 0x38800000u) {
    // Below the smallest normal half (2^-14): a multiple of 2^-24. Scaling by 2^24 is
    // exact, and nearbyint rounds half to even in the default rounding mode.
    float scaled = FromBits(x) * 16777216.0f;
    return sign | static_cast<uint16_t>(std::nearbyint(scaled));
  }
  // Rebias the exponent (127 -> 15) and round the 13 dropped mantissa bits to even; a
  // carry out of the mantissa correctly bumps the exponent.
  x += 0xc8000fffu + ((x >> 13) & 1u);
  return sign | static_cast<uint16_t>(x >> 13);
}

void ToF32(const void* src, io::Dtype dtype, int64_t offset, int64_t n, float* dst) {
  switch (dtype) {
    case io::Dtype::kF32:
      std::memcpy(dst, static_cast<const float*>(src) + offset, n * sizeof(float));
      return;
    case io::Dtype::kBF16: {
      const uint16_t* s = static_cast<const uint16_t*>(src) + offset;
      Convert(s, n, dst, [](uint16_t b) { return FromBits(static_cast<uint32_t>(b) << 16); });
      return;
    }
    case io::Dtype::kF16:
      Convert(static_cast<const uint16_t*>(src) + offset, n, dst, F16ToF32);
      return;
    case io::Dtype::kF64: {
      const double* s = static_cast<const double*>(src) + offset;
      for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(s[i]);
      return;
    }
    default:
      // Callers check IsFloatDtype first; integers never reach the arithmetic.
      std::memset(dst, 0, n * sizeof(float));
  }
}

void FromF32(const float* src, int64_t n, io::Dtype dtype, void* dst, int64_t offset) {
  switch (dtype) {
    case io::Dtype::kF32:
      std::memcpy(static_cast<float*>(dst) + offset, src, n * sizeof(float));
      return;
    case io::Dtype::kBF16: {
      uint16_t* d = static_cast<uint16_t*>(dst) + offset;
      for (int64_t i = 0; i < n; ++i) d[i] = F32ToBf16(src[i]);
      return;
    }
    case io::Dtype::kF16: {
      uint16_t* d = static_cast<uint16_t*>(dst) + offset;
      for (int64_t i = 0; i < n; ++i) d[i] = F32ToF16(src[i]);
      return;
    }
    case io::Dtype::kF64: {
      double* d = static_cast<double*>(dst) + offset;
      for (int64_t i = 0; i < n; ++i) d[i] = src[i];
      return;
    }
    default:
      return;
  }
}

}  // namespace stemma::engine::merge
