#include "engine/merge/kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "engine/merge/dtype_convert.h"

namespace stemma::engine::merge {
namespace {

// Elements per inner block: a few fp32 rows of this size stay in L1/L2.
constexpr int64_t kBlock = 4096;

uint64_t Mix(uint64_t x) {  // splitmix64's finalizer
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

void Load(const Input& in, int64_t begin, int64_t n, float* dst) {
  // Elements past the input's end (a grown vocabulary) read as zero.
  const int64_t have = std::clamp<int64_t>(in.numel - begin, 0, n);
  if (have > 0) ToF32(in.data, in.dtype, begin, have, dst);
  if (have < n) std::fill(dst + std::max<int64_t>(have, 0), dst + n, 0.0f);
}

void PrefetchRange(const Input& in, int64_t begin, int64_t end) {
  if (in.data == nullptr) return;
  end = std::min(end, in.numel);
  if (end <= begin) return;
  const int size = io::DtypeSize(in.dtype);
  SourceCheckpoint::Prefetch(in.data + begin * size, static_cast<uint64_t>(end - begin) * size);
}

// acc[i] (+)= c * in[begin + i], converting on the fly (one pass, no temporary).
void Accumulate(const Input& in, int64_t begin, int64_t n, float c, bool assign, float* acc,
                float* scratch) {
  if (in.dtype == io::Dtype::kBF16 && in.numel >= begin + n) {
    const uint16_t* s = reinterpret_cast<const uint16_t*>(in.data) + begin;
    if (assign) {
      for (int64_t i = 0; i < n; ++i) acc[i] = c * Bf16ToF32(s[i]);
    } else {
      for (int64_t i = 0; i < n; ++i) acc[i] += c * Bf16ToF32(s[i]);
    }
    return;
  }
  Load(in, begin, n, scratch);
  if (assign) {
    for (int64_t i = 0; i < n; ++i) acc[i] = c * scratch[i];
  } else {
    for (int64_t i = 0; i < n; ++i) acc[i] += c * scratch[i];
  }
}

void ReleaseRange(const Input& in, int64_t begin, int64_t end) {
  if (in.data == nullptr) return;
  end = std::min(end, in.numel);
  if (end <= begin) return;
  const int size = io::DtypeSize(in.dtype);
  SourceCheckpoint::Release(in.data + begin * size, static_cast<uint64_t>(end - begin) * size);
}

}  // namespace

Input InputOf(const SourceCheckpoint::Tensor& tensor) {
  return Input{tensor.data, tensor.info->dtype, tensor.info->numel()};
}

double Uniform(uint64_t seed, uint64_t stream, uint64_t index) {
  const uint64_t h = Mix(Mix(seed ^ Mix(stream)) + index);
  return static_cast<double>(h >> 11) * 0x1.0p-53;
}

uint64_t StreamId(const std::string& tensor, uint64_t model) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a over the name, then the model index
  for (unsigned char c : tensor) h = (h ^ c) * 0x100000001b3ull;
  return Mix(h ^ Mix(model));
}

absl::Status RecipeFiller::Prepare(size_t index) {
  const Recipe& r = recipes_[index];
  const OutputTensor& t = tensors_[index];
  name_stream_ = StreamId(t.name, ~0ull);
  if (r.kind != Recipe::Kind::kGeneralized) return absl::OkStatus();
  const GeneralizedParams& g = r.generalized;
  const int64_t n = t.numel();
  sparse_.assign(r.terms.size(), Sparse{});
  deltas_.resize(r.terms.size());
  x_.resize(kBlock);
  y_.resize(kBlock);
  for (size_t m = 0; m < r.terms.size(); ++m) {
    const Term& term = r.terms[m];
    Sparse& sp = sparse_[m];
    sp.stream = StreamId(t.name, m);
    if (g.sparsify == Sparsify::kNone || term.density >= 1.0) continue;
    // A random mask needs no pass over the data unless the rescale needs its L1 norms.
    if (g.sparsify == Sparsify::kRandom && !g.rescale) continue;
    const int64_t k = static_cast<int64_t>(term.density * static_cast<double>(n));
    if (k <= 0 && g.sparsify == Sparsify::kMagnitude) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor \"", t.name, "\": density ", term.density, " of model ", m,
                       " keeps no element of its ", n, " (raise the density)"));
    }
    // Streamed passes over (model, base), recomputing |delta| exactly as the merge does:
    // no copy of the tensor is held, whatever its size.
    auto each = [&](auto&& fn) {
      for (int64_t b = 0; b < n; b += kBlock) {
        const int64_t len = std::min(kBlock, n - b);
        Load(r.anchor, b, len, y_.data());
        Load(term.x, b, len, x_.data());
        for (int64_t i = 0; i < len; ++i) fn(b + i, std::fabs(x_[i] - y_[i]));
        ReleaseRange(r.anchor, b, b + len);
        ReleaseRange(term.x, b, b + len);
      }
    };
    double l1_before = 0, l1_after = 0;
    if (g.sparsify == Sparsify::kRandom) {
      each([&](int64_t i, float a) {
        l1_before += a;
        if (Uniform(g.seed, sp.stream, i) < term.density) l1_after += a;
      });
    } else {
      // The k-th largest |delta| by radix selection on its bits (non-negative floats order
      // like their bit patterns), 8 bits per pass from the top.
      uint32_t prefix = 0, mask = 0;
      int64_t remaining = k;  // how many of the elements matching prefix are still to take
      for (int shift = 24; shift >= 0; shift -= 8) {
        int64_t histogram[256] = {};
        each([&](int64_t, float a) {
          uint32_t bits;
          std::memcpy(&bits, &a, 4);
          if ((bits & mask) == prefix) ++histogram[(bits >> shift) & 0xff];
        });
        for (int digit = 255; digit >= 0; --digit) {
          if (remaining <= histogram[digit]) {
            prefix |= static_cast<uint32_t>(digit) << shift;
            break;
          }
          remaining -= histogram[digit];
        }
        mask |= 0xffu << shift;
      }
      std::memcpy(&sp.threshold, &prefix, 4);
      // Everything above the threshold is kept, and the first `remaining` elements equal
      // to it (in index order): exactly k in all.
      int64_t ties = 0;
      each([&](int64_t i, float a) {
        l1_before += a;
        if (a > sp.threshold) {
          l1_after += a;
        } else if (a == sp.threshold && ties < remaining) {
          ++ties;
          sp.cutoff = i;
          l1_after += a;
        }
      });
    }
    if (g.rescale && l1_before >= 1e-7 && l1_after >= 1e-7) sp.scale = l1_before / l1_after;
  }
  return absl::OkStatus();
}

bool RecipeFiller::Keep(const Recipe& r, size_t m, int64_t i, float magnitude) const {
  const Term& term = r.terms[m];
  if (r.generalized.sparsify == Sparsify::kNone || term.density >= 1.0) return true;
  const Sparse& sp = sparse_[m];
  if (r.generalized.sparsify == Sparsify::kMagnitude) {
    return magnitude > sp.threshold || (magnitude == sp.threshold && i <= sp.cutoff);
  }
  return Uniform(r.generalized.seed, sp.stream, static_cast<uint64_t>(i)) < term.density;
}

void RecipeFiller::GeneralizedBlock(const Recipe& r, int64_t begin, int64_t n, float* acc) {
  const GeneralizedParams& g = r.generalized;
  const size_t models = r.terms.size();
  Load(r.anchor, begin, n, y_.data());  // base
  for (size_t m = 0; m < models; ++m) {
    std::vector<float>& wd = deltas_[m];
    wd.resize(kBlock);
    Load(r.terms[m].x, begin, n, x_.data());
    const float w = static_cast<float>(r.terms[m].coef);
    const float scale = static_cast<float>(sparse_[m].scale);
    for (int64_t i = 0; i < n; ++i) {
      float d = x_[i] - y_[i];
      if (!Keep(r, m, begin + i, std::fabs(d)))
        d = 0.0f;
      else if (scale != 1.0f)
        d *= scale;
      wd[i] = w * d;  // the weighted delta
    }
  }
  float weight_sum = 0;
  for (const Term& term : r.terms) weight_sum += static_cast<float>(term.coef);
  if (std::fabs(weight_sum) < 1e-8f) weight_sum = 1.0f;
  const float lambda = static_cast<float>(g.lambda);
  for (int64_t i = 0; i < n; ++i) {
    float mixed = 0, divisor = 0;
    if (g.consensus) {
      // TIES sign election on the weighted deltas ("sum"): a zero total counts as positive;
      // only deltas of the elected sign (never zeros) take part, and so do their weights.
      float total = 0;
      for (size_t m = 0; m < models; ++m) total += deltas_[m][i];
      const bool positive = total >= 0;
      for (size_t m = 0; m < models; ++m) {
        const float d = deltas_[m][i];
        if (positive ? d > 0 : d < 0) {
          mixed += d;
          divisor += static_cast<float>(r.terms[m].coef);
        }
      }
      if (divisor == 0) divisor = 1;
    } else {
      for (size_t m = 0; m < models; ++m) mixed += deltas_[m][i];
      divisor = weight_sum;
    }
    if (g.normalize) mixed /= divisor;
    acc[i] = y_[i] + mixed * lambda;
  }
}

void RecipeFiller::Block(const Recipe& r, int64_t begin, int64_t n, float* acc) {
  switch (r.kind) {
    case Recipe::Kind::kCopy:
      Load(r.anchor, begin, n, acc);
      return;
    case Recipe::Kind::kLinear: {
      if (r.terms.empty()) std::fill(acc, acc + n, 0.0f);
      for (size_t m = 0; m < r.terms.size(); ++m) {
        Accumulate(r.terms[m].x, begin, n, static_cast<float>(r.terms[m].coef), m == 0, acc,
                   x_.data());
      }
      return;
    }
    case Recipe::Kind::kDelta: {
      Load(r.anchor, begin, n, acc);
      for (const Term& term : r.terms) {
        Load(term.x, begin, n, x_.data());
        Load(term.y, begin, n, y_.data());
        const float c = static_cast<float>(term.coef);
        // Rows past a shorter delta (a grown vocabulary) get no delta: both read as zero.
        for (int64_t i = 0; i < n; ++i) acc[i] += c * (x_[i] - y_[i]);
      }
      return;
    }
    case Recipe::Kind::kGeneralized:
      GeneralizedBlock(r, begin, n, acc);
      return;
    case Recipe::Kind::kNormal:
      for (int64_t i = 0; i < n; ++i) {
        const uint64_t e = static_cast<uint64_t>(begin + i);
        // Box-Muller on two uniforms of this element; 1 - u keeps the log argument > 0.
        const double u1 = 1.0 - Uniform(r.seed, name_stream_, 2 * e);
        const double u2 = Uniform(r.seed, name_stream_, 2 * e + 1);
        acc[i] = static_cast<float>(r.stddev * std::sqrt(-2.0 * std::log(u1)) *
                                    std::cos(2.0 * M_PI * u2));
      }
      return;
    case Recipe::Kind::kZeros:
      std::fill(acc, acc + n, 0.0f);
      return;
  }
}

absl::Status RecipeFiller::operator()(size_t index, int64_t begin, int64_t end, bool first,
                                      uint8_t* out) {
  const Recipe& r = recipes_[index];
  const OutputTensor& t = tensors_[index];
  if (first) RETURN_IF_ERROR(Prepare(index));
  // Same dtype copies are byte copies: exact for every dtype, integers included.
  if (r.kind == Recipe::Kind::kCopy && r.anchor.dtype == t.dtype) {
    const int size = io::DtypeSize(t.dtype);
    std::memcpy(out, r.anchor.data + begin * size, static_cast<size_t>(end - begin) * size);
    ReleaseRange(r.anchor, begin, end);
    return absl::OkStatus();
  }
  x_.resize(kBlock);
  y_.resize(kBlock);
  acc_.resize(kBlock);
  PrefetchRange(r.anchor, begin, end);
  for (const Term& term : r.terms) {
    PrefetchRange(term.x, begin, end);
    PrefetchRange(term.y, begin, end);
  }
  for (int64_t b = begin; b < end; b += kBlock) {
    const int64_t n = std::min(kBlock, end - b);
    Block(r, b, n, acc_.data());
    FromF32(acc_.data(), n, t.dtype, out, b - begin);
  }
  ReleaseRange(r.anchor, begin, end);
  for (const Term& term : r.terms) {
    ReleaseRange(term.x, begin, end);
    ReleaseRange(term.y, begin, end);
  }
  return absl::OkStatus();
}

}  // namespace stemma::engine::merge
