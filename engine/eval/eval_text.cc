#include "engine/eval/eval_text.h"

#include <algorithm>
#include <numeric>

#include "common/utf8.h"

namespace stemma::engine::eval {
namespace {

std::string EncodeUtf8(std::u32string_view text) {
  std::string out;
  for (char32_t c : text) AppendUtf8(c, &out);
  return out;
}

uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

std::u32string DecodeUtf8(std::string_view text) {
  static constexpr char32_t kMinimum[] = {0, 0, 0x80, 0x800, 0x10000};
  std::u32string out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    const auto b = static_cast<unsigned char>(text[i]);
    const int length = b < 0x80           ? 1
                       : (b >> 5) == 0x6  ? 2
                       : (b >> 4) == 0xe  ? 3
                       : (b >> 3) == 0x1e ? 4
                                          : 0;
    char32_t cp = length == 1   ? b
                  : length == 2 ? (b & 0x1f)
                  : length == 3 ? (b & 0x0f)
                                : (b & 0x07);
    bool valid = length > 0 && i + length <= text.size();
    for (int k = 1; valid && k < length; ++k) {
      const auto c = static_cast<unsigned char>(text[i + k]);
      if ((c >> 6) != 0x2) valid = false;
      cp = (cp << 6) | (c & 0x3f);
    }
    // Overlong forms, surrogates and values past U+10FFFF are invalid too.
    if (valid && (cp < kMinimum[length] || (cp >= 0xd800 && cp <= 0xdfff) || cp > 0x10ffff)) {
      valid = false;
    }
    out.push_back(valid ? cp : 0xfffd);
    i += valid ? length : 1;
  }
  return out;
}

bool IsPythonSpace(char32_t c) {
  if ((c >= 0x9 && c <= 0xd) || (c >= 0x1c && c <= 0x20)) return true;
  switch (c) {
    case 0x85:
    case 0xa0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202f:
    case 0x205f:
    case 0x3000:
      return true;
    default:
      return c >= 0x2000 && c <= 0x200a;
  }
}

int64_t CodePointLength(std::string_view text) {
  return static_cast<int64_t>(DecodeUtf8(text).size());
}

std::string PythonRstrip(std::string_view text) {
  std::u32string cps = DecodeUtf8(text);
  while (!cps.empty() && IsPythonSpace(cps.back())) cps.pop_back();
  return EncodeUtf8(cps);
}

std::string PythonStrip(std::string_view text) {
  const std::u32string cps = DecodeUtf8(text);
  size_t begin = 0, end = cps.size();
  while (begin < end && IsPythonSpace(cps[begin])) ++begin;
  while (end > begin && IsPythonSpace(cps[end - 1])) --end;
  return EncodeUtf8(std::u32string_view(cps).substr(begin, end - begin));
}

std::vector<int64_t> FewShotIndices(int64_t pool_size, int64_t k, int64_t doc_index,
                                    int64_t exclude, FewShotSampler sampler, uint64_t seed) {
  std::vector<int64_t> order(pool_size);
  std::iota(order.begin(), order.end(), 0);
  if (sampler == FewShotSampler::kSeeded) {
    // Partial Fisher–Yates over the first k + 1 slots (one spare for the excluded doc).
    const uint64_t key =
        Mix64(Mix64(seed ^ 0x66657773686f7431ULL) + static_cast<uint64_t>(doc_index));
    const int64_t draws = std::min(pool_size, k + 1);
    for (int64_t i = 0; i < draws; ++i) {
      const uint64_t r = Mix64(key + (static_cast<uint64_t>(i) + 1) * 0x9e3779b97f4a7c15ULL);
      const auto span = static_cast<uint64_t>(pool_size - i);
      const auto j = i + static_cast<int64_t>((static_cast<unsigned __int128>(r) * span) >> 64);
      std::swap(order[i], order[j]);
    }
  }
  std::vector<int64_t> shots;
  for (int64_t index : order) {
    if (static_cast<int64_t>(shots.size()) == k) break;
    if (index != exclude) shots.push_back(index);
  }
  return shots;
}

}  // namespace stemma::engine::eval
