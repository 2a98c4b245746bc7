#include "engine/model/fused.h"

#include <ATen/Parallel.h>
#include <ATen/autocast_mode.h>
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
int64_t RowGrain(int64_t width) {
  return std::max<int64_t>(1, 32768 / std::max<int64_t>(1, width));
}

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
void RopeKernel(const float* x, int64_t token_stride, const float* cos, const float* sin,
                float* out, int64_t rows, int64_t t, int64_t heads, int64_t hd, bool transpose) {
  const int64_t h = hd / 2;
  at::parallel_for(0, rows, RowGrain(hd), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t token = r / heads;
      const int64_t pos = token % t;
      const float* xr = x + token * token_stride + (r % heads) * hd;
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
    const int64_t t = x.size(1), heads = x.size(2), hd = x.size(3);
    // Heads packed within a token, tokens at any stride (q/k as column blocks of one q|k|v
    // product) are read in place; anything else is made contiguous first.
    const bool in_place = x.stride(3) == 1 && x.stride(2) == hd && x.stride(0) == t * x.stride(1);
    auto xc = in_place ? x : x.contiguous();
    auto c = cos.contiguous(), s = sin.contiguous();
    auto out = torch::empty(x.sizes(), x.options());
    RopeKernel(xc.data_ptr<float>(), xc.stride(1), c.data_ptr<float>(), s.data_ptr<float>(),
               out.data_ptr<float>(), x.numel() / hd, t, heads, hd, /*transpose=*/false);
    ctx->save_for_backward({c, s});
    ctx->saved_data["heads"] = heads;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    auto dy = grads[0].contiguous();
    auto dx = torch::empty_like(dy);
    const int64_t t = dy.size(1), hd = dy.size(3);
    const int64_t heads = ctx->saved_data["heads"].toInt();
    RopeKernel(dy.data_ptr<float>(), heads * hd, saved[0].data_ptr<float>(),
               saved[1].data_ptr<float>(), dx.data_ptr<float>(), dy.numel() / hd, t, heads, hd,
               /*transpose=*/true);
    return {dx, torch::Tensor(), torch::Tensor()};
  }
};

// ---- SiLU(g) * u ----

// g, u [rows, width] with row strides (they may be the two halves of one [rows, 2 * width]
// product); s = sigmoid(g) and out contiguous.
void SiluMulForwardKernel(const float* g, int64_t g_stride, const float* u, int64_t u_stride,
                          const float* s, float* out, int64_t rows, int64_t width) {
  at::parallel_for(0, rows, RowGrain(width), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* gr = g + r * g_stride;
      const float* ur = u + r * u_stride;
      const float* sr = s + r * width;
      float* o = out + r * width;
#pragma omp simd
      for (int64_t j = 0; j < width; ++j) o[j] = (gr[j] * sr[j]) * ur[j];
    }
  });
}

// d/dg = dy * u * s * (1 + g * (1 - s)); d/du = dy * g * s. dg/du may be null (not needed).
void SiluMulBackwardKernel(const float* dy, const float* g, int64_t g_stride, const float* u,
                           int64_t u_stride, const float* s, float* dg, int64_t dg_stride,
                           float* du, int64_t du_stride, int64_t rows, int64_t width) {
  at::parallel_for(0, rows, RowGrain(width), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* dyr = dy + r * width;
      const float* gr = g + r * g_stride;
      const float* ur = u + r * u_stride;
      const float* sr = s + r * width;
      if (dg != nullptr) {
        float* o = dg + r * dg_stride;
#pragma omp simd
        for (int64_t j = 0; j < width; ++j) {
          o[j] = dyr[j] * ur[j] * sr[j] * (1.0f + gr[j] * (1.0f - sr[j]));
        }
      }
      if (du != nullptr) {
        float* o = du + r * du_stride;
#pragma omp simd
        for (int64_t j = 0; j < width; ++j) o[j] = dyr[j] * (gr[j] * sr[j]);
      }
    }
  });
}

class SiluMulFunction : public torch::autograd::Function<SiluMulFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& g,
                               const torch::Tensor& u) {
    auto gc = g.contiguous(), uc = u.contiguous();
    const int64_t width = gc.size(-1), rows = gc.numel() / std::max<int64_t>(1, width);
    auto s = torch::sigmoid(gc);  // LibTorch's vectorised exp
    auto out = torch::empty_like(gc);
    SiluMulForwardKernel(gc.data_ptr<float>(), width, uc.data_ptr<float>(), width,
                         s.data_ptr<float>(), out.data_ptr<float>(), rows, width);
    ctx->save_for_backward({gc, uc, s});
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    auto dy = grads[0].contiguous();
    const int64_t width = dy.size(-1), rows = dy.numel() / std::max<int64_t>(1, width);
    torch::Tensor dg, du;
    if (ctx->needs_input_grad(0)) dg = torch::empty_like(dy);
    if (ctx->needs_input_grad(1)) du = torch::empty_like(dy);
    SiluMulBackwardKernel(dy.data_ptr<float>(), saved[0].data_ptr<float>(), width,
                          saved[1].data_ptr<float>(), width, saved[2].data_ptr<float>(),
                          dg.defined() ? dg.data_ptr<float>() : nullptr, width,
                          du.defined() ? du.data_ptr<float>() : nullptr, width, rows, width);
    return {dg, du};
  }
};

// ---- Linear layers that share their input ----

// The weights [out_i, in] stacked into one [Σ out_i, in] tensor without a copy, when they lie
// back to back in one storage (FlatAdamW puts a layer's q/k/v and gate/up weights there in
// that order); undefined otherwise.
torch::Tensor StackedView(const std::vector<torch::Tensor>& weights) {
  if (weights.empty()) return {};
  torch::NoGradGuard no_grad;  // a plain alias: the gradients go to the weights themselves
  const auto& first = weights[0];
  if (!Applies(first) || first.dim() != 2 || !first.is_contiguous()) return {};
  int64_t rows = 0;
  const float* expected = first.data_ptr<float>();
  for (const auto& w : weights) {
    if (!Applies(w) || w.dim() != 2 || !w.is_contiguous() || w.size(1) != first.size(1) ||
        !w.storage().is_alias_of(first.storage()) || w.data_ptr<float>() != expected) {
      return {};
    }
    expected += w.numel();
    rows += w.size(0);
  }
  return first.as_strided({rows, first.size(1)}, {first.size(1), 1});
}

// y_i = x W_i^T + b_i as one product x W^T over the stacked weights.
class GroupedLinearFunction : public torch::autograd::Function<GroupedLinearFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& stacked, at::TensorList weights,
                               at::TensorList biases) {
    const int64_t in = stacked.size(1);
    auto x2 = x.reshape({-1, in});
    auto y = biases.empty() ? x2.mm(stacked.t()) : at::addmm(at::cat(biases), x2, stacked.t());
    std::vector<int64_t> out_sizes = x.sizes().vec(), widths;
    variable_list outputs;
    int64_t offset = 0;
    for (const auto& w : weights) {
      out_sizes.back() = w.size(0);
      outputs.push_back(y.narrow(1, offset, w.size(0)).view(out_sizes));
      offset += w.size(0);
      widths.push_back(w.size(0));
    }
    ctx->saved_data["widths"] = widths;
    ctx->save_for_backward({x2, stacked});
    ctx->saved_data["x_sizes"] = x.sizes().vec();
    ctx->saved_data["parts"] = static_cast<int64_t>(weights.size());
    ctx->saved_data["biases"] = !biases.empty();
    return outputs;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& x2 = saved[0];
    const auto& stacked = saved[1];
    const int64_t parts = ctx->saved_data["parts"].toInt();
    const bool has_biases = ctx->saved_data["biases"].toBool();
    const int64_t rows = x2.size(0);
    const auto widths = ctx->saved_data["widths"].toIntVector();
    std::vector<torch::Tensor> pieces;
    for (int64_t i = 0; i < parts; ++i) {  // an output that went unused has no gradient
      pieces.push_back(grads[i].defined() ? grads[i].reshape({rows, widths[i]})
                                          : torch::zeros({rows, widths[i]}, x2.options()));
    }
    auto dy = at::cat(pieces, 1);             // [N, Σ out]
    variable_list result(1 + 1 + 2 * parts);  // x, stacked, weights..., biases...
    if (ctx->needs_input_grad(0)) {
      result[0] = dy.mm(stacked).view(ctx->saved_data["x_sizes"].toIntVector());
    }
    bool any_weight = false;
    for (int64_t i = 0; i < parts; ++i) any_weight = any_weight || ctx->needs_input_grad(2 + i);
    torch::Tensor dw, db;
    if (any_weight) dw = dy.t().mm(x2);  // [Σ out, in]
    if (has_biases) db = dy.sum(0);
    int64_t offset = 0;
    for (int64_t i = 0; i < parts; ++i) {
      const int64_t width = widths[i];
      if (ctx->needs_input_grad(2 + i)) result[2 + i] = dw.narrow(0, offset, width);
      if (has_biases && ctx->needs_input_grad(2 + parts + i)) {
        result[2 + parts + i] = db.narrow(0, offset, width);
      }
      offset += width;
    }
    if (!has_biases) result.resize(2 + parts);
    return result;
  }
};

// down-projection input silu(x Wg^T) * (x Wu^T) with gate and up as one product, and the
// backward writing d(gate) and d(up) straight into one buffer for the two products back.
class GatedUpFunction : public torch::autograd::Function<GatedUpFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& stacked, const torch::Tensor& gate,
                               const torch::Tensor& up) {
    const int64_t in = stacked.size(1), width = gate.size(0);
    auto x2 = x.reshape({-1, in});
    const int64_t rows = x2.size(0);
    auto y = x2.mm(stacked.t());  // [N, 2I]: gate | up
    auto g = y.narrow(1, 0, width);
    auto s = torch::sigmoid(g);  // contiguous [N, I]
    auto out = torch::empty({rows, width}, x2.options());
    const float* yp = y.data_ptr<float>();
    SiluMulForwardKernel(yp, 2 * width, yp + width, 2 * width, s.data_ptr<float>(),
                         out.data_ptr<float>(), rows, width);
    ctx->save_for_backward({x2, stacked, y, s});
    ctx->saved_data["x_sizes"] = x.sizes().vec();
    std::vector<int64_t> out_sizes = x.sizes().vec();
    out_sizes.back() = width;
    return out.view(out_sizes);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& x2 = saved[0];
    const auto& stacked = saved[1];
    const auto& y = saved[2];
    const auto& s = saved[3];
    const int64_t rows = x2.size(0), width = stacked.size(0) / 2;
    auto dout = grads[0].reshape({rows, width}).contiguous();
    auto dy = torch::empty({rows, 2 * width}, x2.options());
    float* dyp = dy.data_ptr<float>();
    const float* yp = y.data_ptr<float>();
    SiluMulBackwardKernel(dout.data_ptr<float>(), yp, 2 * width, yp + width, 2 * width,
                          s.data_ptr<float>(), dyp, 2 * width, dyp + width, 2 * width, rows, width);
    variable_list result(4);
    if (ctx->needs_input_grad(0)) {
      result[0] = dy.mm(stacked).view(ctx->saved_data["x_sizes"].toIntVector());
    }
    if (ctx->needs_input_grad(2) || ctx->needs_input_grad(3)) {
      auto dw = dy.t().mm(x2);  // [2I, in]
      if (ctx->needs_input_grad(2)) result[2] = dw.narrow(0, 0, width);
      if (ctx->needs_input_grad(3)) result[3] = dw.narrow(0, width, width);
    }
    return result;
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

std::vector<torch::Tensor> GroupedLinear(const torch::Tensor& x,
                                         const std::vector<torch::Tensor>& weights,
                                         const std::vector<torch::Tensor>& biases) {
  // Under autocast the products would run in bf16: leave them to the autocast-aware path.
  if (!Applies(x) || at::autocast::is_autocast_enabled(at::kCPU)) return {};
  auto stacked = StackedView(weights);
  if (!stacked.defined()) return {};
  std::vector<torch::Tensor> b;
  for (const auto& bias : biases) {
    if (!bias.defined()) continue;
    if (!Applies(bias)) return {};
    b.push_back(bias);
  }
  if (!b.empty() && b.size() != weights.size()) return {};
  return GroupedLinearFunction::apply(x, stacked, at::TensorList(weights), at::TensorList(b));
}

torch::Tensor GatedUp(const torch::Tensor& x, const torch::Tensor& gate, const torch::Tensor& up) {
  if (!Applies(x) || at::autocast::is_autocast_enabled(at::kCPU) || gate.sizes() != up.sizes()) {
    return {};
  }
  auto stacked = StackedView({gate, up});
  if (!stacked.defined()) return {};
  return GatedUpFunction::apply(x, stacked, gate, up);
}

}  // namespace stemma::engine::model::fused
