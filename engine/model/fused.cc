#include "engine/model/fused.h"

#include <ATen/Parallel.h>
#include <torch/autograd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

namespace stemma::engine::model::fused {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Rows per OpenMP chunk: about 32k elements, LibTorch's own grain for element-wise loops.
int64_t RowGrain(int64_t width) { return std::max<int64_t>(1, 32768 / std::max<int64_t>(1, width)); }

// ---- RMSNorm ----

// y = x * inv * f per row, inv = 1 / sqrt(mean(x^2) + eps); inv is kept for the backward.
void RmsNormForwardKernel(const float* x, const float* f, float* y, float* inv, int64_t rows,
                          int64_t d, float eps) {
  at::parallel_for(0, rows, RowGrain(d), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* xr = x + r * d;
      float* yr = y + r * d;
      float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
      for (int64_t j = 0; j < d; ++j) sum += xr[j] * xr[j];
      const float ir = 1.0f / std::sqrt(sum / static_cast<float>(d) + eps);
      inv[r] = ir;
#pragma omp simd
      for (int64_t j = 0; j < d; ++j) yr[j] = (xr[j] * ir) * f[j];
    }
  });
}

// dx = inv * (dy*f - x * inv^2 * sum(dy*f*x) / d); dw = sum over rows of dy * x * inv.
// dw is summed per fixed block of rows and the blocks in order, so the result does not
// depend on the number of threads (training stays bitwise reproducible).
void RmsNormBackwardKernel(const float* dy, const float* x, const float* f, const float* inv,
                           float* dx, float* dw, int64_t rows, int64_t d) {
  const int64_t blocks = std::min<int64_t>(rows, 32);
  const int64_t per_block = (rows + blocks - 1) / blocks;
  std::vector<float> partial(dw != nullptr ? blocks * d : 0, 0.0f);
  at::parallel_for(0, blocks, 1, [&](int64_t block_begin, int64_t block_end) {
    for (int64_t b = block_begin; b < block_end; ++b) {
      float* pw = dw != nullptr ? partial.data() + b * d : nullptr;
      const int64_t r_end = std::min(rows, (b + 1) * per_block);
      for (int64_t r = b * per_block; r < r_end; ++r) {
        const float* dyr = dy + r * d;
        const float* xr = x + r * d;
        const float ir = inv[r];
        if (dx != nullptr) {
          float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
          for (int64_t j = 0; j < d; ++j) dot += dyr[j] * f[j] * xr[j];
          const float c = ir * ir * dot / static_cast<float>(d);
          float* dxr = dx + r * d;
#pragma omp simd
          for (int64_t j = 0; j < d; ++j) dxr[j] = ir * (dyr[j] * f[j] - xr[j] * c);
        }
        if (pw != nullptr) {
#pragma omp simd
          for (int64_t j = 0; j < d; ++j) pw[j] += dyr[j] * (xr[j] * ir);
        }
      }
    }
  });
  if (dw == nullptr) return;
  std::fill(dw, dw + d, 0.0f);
  for (int64_t b = 0; b < blocks; ++b) {
    const float* pw = partial.data() + b * d;
    for (int64_t j = 0; j < d; ++j) dw[j] += pw[j];
  }
}

class RmsNormFunction : public torch::autograd::Function<RmsNormFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, double eps, bool one_plus) {
    auto xc = x.contiguous();
    auto f = one_plus ? (weight + 1.0).contiguous() : weight.contiguous();  // [D]
    const int64_t d = xc.size(-1), rows = xc.numel() / std::max<int64_t>(1, d);
    auto y = torch::empty_like(xc);
    auto inv = torch::empty({rows}, xc.options());
    RmsNormForwardKernel(xc.data_ptr<float>(), f.data_ptr<float>(), y.data_ptr<float>(),
                         inv.data_ptr<float>(), rows, d, static_cast<float>(eps));
    ctx->save_for_backward({xc, f, inv});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& x = saved[0];
    const auto& f = saved[1];
    const auto& inv = saved[2];
    auto dy = grads[0].contiguous();
    const int64_t d = x.size(-1), rows = x.numel() / std::max<int64_t>(1, d);
    torch::Tensor dx, dw;
    if (ctx->needs_input_grad(0)) dx = torch::empty_like(x);
    if (ctx->needs_input_grad(1)) dw = torch::empty({d}, x.options());
    RmsNormBackwardKernel(dy.data_ptr<float>(), x.data_ptr<float>(), f.data_ptr<float>(),
                          inv.data_ptr<float>(), dx.defined() ? dx.data_ptr<float>() : nullptr,
                          dw.defined() ? dw.data_ptr<float>() : nullptr, rows, d);
    return {dx, dw, torch::Tensor(), torch::Tensor()};
  }
};

// ---- Rotary embedding ----

// out_j = x_j c_j - x_{j+h} s_j (j < h), x_j c_j + x_{j-h} s_j (j >= h); h = hd / 2. With
// `transpose` (the backward) the rotation runs the other way:
// dx_j = dy_j c_j + dy_{j+h} s_{j+h} (j < h), dy_j c_j - dy_{j-h} s_{j-h} (j >= h).
void RopeKernel(const float* x, const float* cos, const float* sin, float* out, int64_t rows,
                int64_t t, int64_t heads, int64_t hd, bool transpose) {
  const int64_t h = hd / 2;
  at::parallel_for(0, rows, RowGrain(hd), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t pos = (r / heads) % t;
      const float* xr = x + r * hd;
      const float* c = cos + pos * hd;
      const float* s = sin + pos * hd;
      float* o = out + r * hd;
      if (!transpose) {
#pragma omp simd
        for (int64_t j = 0; j < h; ++j) o[j] = xr[j] * c[j] - xr[j + h] * s[j];
#pragma omp simd
        for (int64_t j = h; j < hd; ++j) o[j] = xr[j] * c[j] + xr[j - h] * s[j];
      } else {
#pragma omp simd
        for (int64_t j = 0; j < h; ++j) o[j] = xr[j] * c[j] + xr[j + h] * s[j + h];
#pragma omp simd
        for (int64_t j = h; j < hd; ++j) o[j] = xr[j] * c[j] - xr[j - h] * s[j - h];
      }
    }
  });
}

class RopeFunction : public torch::autograd::Function<RopeFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& cos, const torch::Tensor& sin) {
    auto xc = x.contiguous();
    auto c = cos.contiguous(), s = sin.contiguous();
    auto out = torch::empty_like(xc);
    const int64_t t = xc.size(1), heads = xc.size(2), hd = xc.size(3);
    RopeKernel(xc.data_ptr<float>(), c.data_ptr<float>(), s.data_ptr<float>(),
               out.data_ptr<float>(), xc.numel() / hd, t, heads, hd, /*transpose=*/false);
    ctx->save_for_backward({c, s});
    ctx->saved_data["heads"] = heads;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    auto dy = grads[0].contiguous();
    auto dx = torch::empty_like(dy);
    const int64_t t = dy.size(1), hd = dy.size(3);
    RopeKernel(dy.data_ptr<float>(), saved[0].data_ptr<float>(), saved[1].data_ptr<float>(),
               dx.data_ptr<float>(), dy.numel() / hd, t, ctx->saved_data["heads"].toInt(), hd,
               /*transpose=*/true);
    return {dx, torch::Tensor(), torch::Tensor()};
  }
};

// ---- SiLU(g) * u ----

class SiluMulFunction : public torch::autograd::Function<SiluMulFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& g,
                               const torch::Tensor& u) {
    auto gc = g.contiguous(), uc = u.contiguous();
    auto s = torch::sigmoid(gc);  // LibTorch's vectorised exp
    auto out = torch::empty_like(gc);
    const float* gp = gc.data_ptr<float>();
    const float* up = uc.data_ptr<float>();
    const float* sp = s.data_ptr<float>();
    float* op = out.data_ptr<float>();
    at::parallel_for(0, gc.numel(), 32768, [&](int64_t begin, int64_t end) {
#pragma omp simd
      for (int64_t i = begin; i < end; ++i) op[i] = (gp[i] * sp[i]) * up[i];
    });
    ctx->save_for_backward({gc, uc, s});
    return out;
  }

  // d/dg = dy * u * s * (1 + g * (1 - s)); d/du = dy * g * s.
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    auto dy = grads[0].contiguous();
    torch::Tensor dg, du;
    if (ctx->needs_input_grad(0)) dg = torch::empty_like(dy);
    if (ctx->needs_input_grad(1)) du = torch::empty_like(dy);
    const float* dyp = dy.data_ptr<float>();
    const float* gp = saved[0].data_ptr<float>();
    const float* up = saved[1].data_ptr<float>();
    const float* sp = saved[2].data_ptr<float>();
    float* dgp = dg.defined() ? dg.data_ptr<float>() : nullptr;
    float* dup = du.defined() ? du.data_ptr<float>() : nullptr;
    at::parallel_for(0, dy.numel(), 32768, [&](int64_t begin, int64_t end) {
      if (dgp != nullptr) {
#pragma omp simd
        for (int64_t i = begin; i < end; ++i) {
          dgp[i] = dyp[i] * up[i] * sp[i] * (1.0f + gp[i] * (1.0f - sp[i]));
        }
      }
      if (dup != nullptr) {
#pragma omp simd
        for (int64_t i = begin; i < end; ++i) dup[i] = dyp[i] * (gp[i] * sp[i]);
      }
    });
    return {dg, du};
  }
};

}  // namespace

bool Applies(const torch::Tensor& x) {
  // STEMMA_FUSED=0 forces the composite ops everywhere (to compare or to rule the kernels out).
  static const bool enabled = [] {
    const char* env = std::getenv("STEMMA_FUSED");
    return env == nullptr || std::string(env) != "0";
  }();
  return enabled && x.defined() && x.device().is_cpu() && x.scalar_type() == torch::kFloat32 &&
         !x.is_sparse();
}

torch::Tensor RmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double eps,
                      bool one_plus) {
  return RmsNormFunction::apply(x, weight, eps, one_plus);
}

torch::Tensor Rope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  return RopeFunction::apply(x, cos, sin);
}

torch::Tensor SiluMul(const torch::Tensor& g, const torch::Tensor& u) {
  return SiluMulFunction::apply(g, u);
}

}  // namespace stemma::engine::model::fused
