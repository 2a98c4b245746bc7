// Element conversion between the floating storage dtypes of safetensors files and fp32,
// in plain C++ (no LibTorch), so the merge kernels run on chunks that stay in cache.
#pragma once

#include <cstdint>
#include <cstring>

#include "engine/io/safetensors.h"

namespace stemma::engine::merge {

// True for F64, F32, F16 and BF16: the dtypes merge arithmetic reads and writes.
bool IsFloatDtype(io::Dtype dtype);

// dst[i] = float(src[offset + i]) for i in [0, n). `src` points at element 0 of a tensor of
// `dtype` (a float dtype).
void ToF32(const void* src, io::Dtype dtype, int64_t offset, int64_t n, float* dst);

// dst[offset + i] = dtype(src[i]), rounding to nearest even (as torch's .to() does; NaN
// stays NaN). `dst` points at element 0 of a tensor of `dtype` (a float dtype).
void FromF32(const float* src, int64_t n, io::Dtype dtype, void* dst, int64_t offset);

// Single-element helpers, exposed for tests.
inline float Bf16ToF32(uint16_t bits) {
  uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t F32ToBf16(float value);
float F16ToF32(uint16_t bits);
uint16_t F32ToF16(float value);

}  // namespace stemma::engine::merge
