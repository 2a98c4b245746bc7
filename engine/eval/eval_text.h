// Small torch-free helpers shared by the eval tasks: Python-compatible text operations
// (code points, str.isspace, strip) and the deterministic few-shot sampler.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace stemma::engine::eval {

// UTF-8 -> code points; each byte of an invalid sequence becomes U+FFFD.
std::u32string DecodeUtf8(std::string_view text);

// Python's str.isspace() for one code point.
bool IsPythonSpace(char32_t c);

// len(s) in Python: the number of code points.
int64_t CodePointLength(std::string_view text);

// Python's s.strip() / s.rstrip() (Unicode whitespace), on UTF-8.
std::string PythonStrip(std::string_view text);
std::string PythonRstrip(std::string_view text);

enum class FewShotSampler {
  kFirstN,  // lm-eval's first_n: the first k pool docs, skipping the evaluated one
  kSeeded,  // k distinct pool docs drawn by SplitMix64 keyed by (seed, evaluated doc index)
};

// Indices into a pool of `pool_size` docs for the few-shot examples of doc `doc_index`.
// `exclude` (the evaluated doc's index in the pool, or -1 when the pool is another file) is
// never chosen. Returns fewer than k only when the pool has too few docs. The same
// (pool_size, k, doc_index, exclude, seed) always gives the same indices, in any run order.
std::vector<int64_t> FewShotIndices(int64_t pool_size, int64_t k, int64_t doc_index,
                                    int64_t exclude, FewShotSampler sampler, uint64_t seed);

}  // namespace stemma::engine::eval
