#include "engine/train/sharded_optimizer.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <optional>

namespace stemma::engine::train {
namespace {

// OverlapReduction's started buckets not yet waited for (their memory, under NCCL).
constexpr size_t kBucketsInFlight = 4;

// A reduction's result copied into `target` (the first micro-batch's, `fresh`) or added to it:
// the same arithmetic whether the reduction ran synchronously or overlapped.
DataParallel::Done AccumulateInto(at::Tensor target, bool fresh) {
  return [target = std::move(target), fresh](const at::Tensor& mine) {
    if (fresh) {
      target.copy_(mine);
    } else {
      target.add_(mine);
    }
  };
}

}  // namespace

ShardedAdamW::ShardedAdamW(const std::vector<ParamPlan>& plans,
                           const std::vector<torch::Tensor>& params,
                           const v1::TrainOptimizer& options, DataParallel& ranks, Level level,
                           int64_t bucket_bytes, const InitialValues& initial)
    : options_(options),
      ranks_(ranks),
      level_(level),
      world_(ranks.world_size()),
      rank_(ranks.rank()),
      bucket_bytes_(bucket_bytes) {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < plans.size(); ++i) {
    if (!plans[i].trainable) {
      params[i].set_requires_grad(false);
      continue;
    }
    TORCH_CHECK(params[i].scalar_type() == torch::kFloat32, "trainable parameter ", plans[i].name,
                " must be float32");
    Segment s;
    s.name = plans[i].name;
    s.param = params[i];
    s.offset = numel_;
    s.numel = params[i].numel();
    s.decay = plans[i].weight_decay && options.weight_decay() > 0;
    s.lambda = plans[i].l2sp_lambda;
    s.plan = i;
    numel_ += s.numel;
    segments_.push_back(std::move(s));
  }
  chunk_ = (numel_ + world_ - 1) / world_;
  const auto opts =
      torch::TensorOptions()
          .dtype(torch::kFloat32)
          .device(segments_.empty() ? torch::Device(torch::kCPU) : segments_[0].param.device());
  InitialValues values = initial;
  if (!values) {
    values = [&params](size_t i, int64_t begin, int64_t end, const torch::Tensor& out) {
      out.copy_(params[i].detach().reshape(-1).narrow(0, begin, end - begin));
    };
  }
  // kFull: only this rank's slice is read, into its own master copy; the buffer the
  // parameters are views of is never allocated here. Otherwise the whole replica.
  const int64_t lo = level_ == Level::kFull ? rank_ * chunk_ : 0;
  const int64_t hi = level_ == Level::kFull ? std::clamp(numel_, lo, lo + chunk_) : numel_;
  torch::Tensor target =
      level_ == Level::kFull ? torch::empty({chunk_}, opts) : torch::empty({world_ * chunk_}, opts);
  for (const Segment& s : segments_) {
    const int64_t begin = std::max(lo, s.offset), end = std::min(hi, s.offset + s.numel);
    if (begin < end) {
      values(s.plan, begin - s.offset, end - s.offset, target.narrow(0, begin - lo, end - begin));
    }
  }
  target.narrow(0, hi - lo, target.numel() - (hi - lo)).zero_();  // the padding
  values_ = level_ == Level::kFull ? UnallocatedFlat(world_ * chunk_, opts) : target;
  for (Segment& s : segments_) {
    s.param.set_data(values_.narrow(0, s.offset, s.numel).view(s.param.sizes()));
    s.param.set_requires_grad(true);  // the module keeps its parameter object, now a view
  }
  packed_.assign(segments_.size(), 0);
  master_ = level_ == Level::kFull ? target : values_.narrow(0, rank_ * chunk_, chunk_);
  exp_avg_ = torch::zeros({chunk_}, opts);
  exp_avg_sq_ = torch::zeros({chunk_}, opts);
  if (level_ == Level::kOptimizer) {
    flat_grads_ = torch::zeros({world_ * chunk_}, opts);
    grad_ = flat_grads_.narrow(0, rank_ * chunk_, chunk_);
  } else {
    grad_ = torch::zeros({chunk_}, opts);
  }
  BuildPieces(plans);
  if (level_ == Level::kFull) Release();
}

// This rank's pieces of the segments (with their masks) and the L2-SP anchor of its slice.
void ShardedAdamW::BuildPieces(const std::vector<ParamPlan>& plans) {
  bool any_lambda = false;
  const int64_t lo = rank_ * chunk_, hi = std::min(lo + chunk_, numel_);
  for (size_t i = 0; i < segments_.size(); ++i) {
    const Segment& s = segments_[i];
    const int64_t begin = std::max(lo, s.offset), end = std::min(hi, s.offset + s.numel);
    if (begin >= end) continue;
    Piece p{i, begin, end, torch::Tensor()};
    if (plans[s.plan].mask != ParamPlan::Mask::kNone) {
      p.mask = BuildPieceMask(s, plans[s.plan], begin, end);
    }
    pieces_.push_back(std::move(p));
    any_lambda = any_lambda || s.lambda > 0;
  }
  if (any_lambda) anchor_ = master_.clone();
}

// The segment's 0/1 mask (rows or columns of plan.indices) at flat elements [begin, end).
torch::Tensor ShardedAdamW::BuildPieceMask(const Segment& s, const ParamPlan& plan, int64_t begin,
                                           int64_t end) const {
  const bool rows = plan.mask == ParamPlan::Mask::kRows;
  const int64_t dim = rows ? 0 : 1;
  const int64_t extent = s.param.size(dim);
  int64_t inner = 1;  // elements per step along `dim`
  for (int64_t d = dim + 1; d < s.param.dim(); ++d) inner *= s.param.size(d);
  auto device = s.param.device();
  auto chosen = torch::zeros({extent}, torch::dtype(torch::kBool).device(device));
  chosen.index_fill_(0, torch::tensor(plan.indices, torch::dtype(torch::kLong).device(device)),
                     true);
  auto index =
      torch::arange(begin - s.offset, end - s.offset, torch::dtype(torch::kLong).device(device))
          .div_(inner, "floor")
          .remainder_(extent);
  return chosen.index_select(0, index);
}

std::vector<torch::Tensor> ShardedAdamW::parameters() const {
  std::vector<torch::Tensor> out;
  for (const Segment& s : segments_) out.push_back(s.param);
  return out;
}

void ShardedAdamW::ZeroGrad() {
  FinishReduce();
  for (Segment& s : segments_) s.param.mutable_grad() = torch::Tensor();
  grad_fresh_ = true;
}

void ShardedAdamW::PackGrads(int64_t begin, int64_t end, torch::Tensor out, bool free_packed) {
  // The first segment that ends after `begin` (segments are in offset order).
  auto it = std::upper_bound(segments_.begin(), segments_.end(), begin,
                             [](int64_t at, const Segment& s) { return at < s.offset + s.numel; });
  int64_t at = begin;
  for (; it != segments_.end() && it->offset < end; ++it) {
    Segment& s = *it;
    const int64_t from = std::max(begin, s.offset), to = std::min(end, s.offset + s.numel);
    auto slot = out.narrow(0, from - begin, to - from);
    const torch::Tensor& g = s.param.grad();
    if (g.defined()) {
      slot.copy_(g.reshape(-1).narrow(0, from - s.offset, to - from));
    } else {
      slot.zero_();
    }
    at = to;
    const size_t i = static_cast<size_t>(it - segments_.begin());
    packed_[i] += to - from;
    if (free_packed && packed_[i] == s.numel) {
      s.param.mutable_grad() = torch::Tensor();
      packed_[i] = 0;
    }
  }
  if (at < end) out.narrow(0, at - begin, end - at).zero_();  // padding past the last segment
}

void ShardedAdamW::ReduceBuckets(bool overlap) {
  FinishReduce();  // an earlier micro-batch's reduction adds into grad_ first
  // Each bucket holds `piece` elements of every rank's slice: [W, piece] row-major.
  int64_t piece = std::max<int64_t>(1, std::min<int64_t>(chunk_, bucket_bytes_ / (4 * world_)));
  // kFull reduces one layer at a time, and all of its autograd gradients are alive when the
  // first bucket is packed (each is freed once wholly packed): a bucket as large as the layer
  // would double its gradients' memory. A quarter of it at most; the sums are the same.
  if (level_ == Level::kFull) piece = std::min(piece, std::max<int64_t>(1, (chunk_ + 3) / 4));
  if (!overlap && (!bucket_.defined() || bucket_.numel() < world_ * piece)) {
    bucket_ = torch::empty({world_ * piece}, values_.options());
  }
  for (int64_t first = 0; first < chunk_; first += piece) {
    const int64_t n = std::min(piece, chunk_ - first);
    // Overlapped: a bucket of its own, freed once its reduction has finished.
    auto flat =
        overlap ? torch::empty({world_ * n}, values_.options()) : bucket_.narrow(0, 0, world_ * n);
    for (int64_t r = 0; r < world_; ++r) {
      const int64_t begin = r * chunk_ + first;
      PackGrads(std::min(begin, numel_), std::min(begin + n, numel_), flat.narrow(0, r * n, n),
                /*free_packed=*/true);
      // Padding beyond numel_ in this piece: PackGrads zeroed what it was given; the rest is
      // past the end of the buffer's real elements.
      if (begin + n > numel_) {
        const int64_t real = std::max<int64_t>(0, numel_ - begin);
        flat.narrow(0, r * n + real, n - real).zero_();
      }
    }
    // The same arithmetic either way: the mean of the piece, copied or added into grad_.
    const DataParallel::Done accumulate = AccumulateInto(grad_.narrow(0, first, n), grad_fresh_);
    if (overlap) {
      reducing_.push_back(ranks_.ReduceScatterAsync(flat, /*mean=*/true, accumulate));
    } else {
      accumulate(ranks_.ReduceScatter(flat, /*mean=*/true));
    }
  }
  grad_fresh_ = false;
}

void ShardedAdamW::FinishReduce() {
  std::vector<std::unique_ptr<DataParallel::Pending>> pending = std::move(reducing_);
  reducing_.clear();
  for (auto& p : pending) p->Wait();
}

void ShardedAdamW::OverlapReduction() {
  if (level_ == Level::kFull || segments_.empty() || ready_ != nullptr) return;
  const int64_t cap = std::max<int64_t>(1, bucket_bytes_ / 4);  // fp32 elements
  std::vector<std::vector<size_t>> members;
  // `end`: of the bucket being filled (the padding goes with the last tensor).
  int64_t end = world_ * chunk_;
  for (size_t i = segments_.size(); i-- > 0;) {
    const int64_t begin = segments_[i].offset;
    if (!members.empty() && end - begin > cap) end = ranges_.back().first;  // full: a new one
    if (members.empty() || ranges_.back().second != end) {
      members.emplace_back();
      ranges_.emplace_back(begin, end);
    }
    members.back().push_back(i);
    ranges_.back().first = begin;
  }
  std::vector<torch::Tensor> params;
  for (const Segment& s : segments_) params.push_back(s.param);
  ready_ = std::make_unique<ReadyBuckets>(std::move(params), std::move(members),
                                          [this](size_t b) { StartRange(b); });
}

void ShardedAdamW::BeforeBackward(bool last) {
  if (ready_ != nullptr && (level_ == Level::kGradients || last)) ready_->Arm();
}

void ShardedAdamW::StartRange(size_t bucket) {
  torch::NoGradGuard no_grad;
  const auto [begin, end] = ranges_[bucket];
  const int64_t real_end = std::min(end, numel_);
  // ZeRO-1 reduces in place in its flat gradient (this rank's part of it is grad_).
  torch::Tensor flat = level_ == Level::kOptimizer ? flat_grads_.narrow(0, begin, end - begin)
                                                   : torch::empty({end - begin}, values_.options());
  if (begin < real_end) {
    PackGrads(begin, real_end, flat.narrow(0, 0, real_end - begin), /*free_packed=*/true);
  }
  if (end > real_end) flat.narrow(0, real_end - begin, end - real_end).zero_();
  std::vector<int64_t> counts(static_cast<size_t>(world_));
  for (int64_t r = 0; r < world_; ++r) {
    counts[r] = std::max<int64_t>(0, std::min(end, (r + 1) * chunk_) - std::max(begin, r * chunk_));
  }
  DataParallel::Done done;
  if (level_ == Level::kGradients && counts[rank_] > 0) {
    done = AccumulateInto(
        grad_.narrow(0, std::max(begin, rank_ * chunk_) - rank_ * chunk_, counts[rank_]),
        grad_fresh_);
  }
  // NCCL keeps each bucket until its Wait: at most a few in flight, not a whole gradient.
  while (reducing_.size() >= kBucketsInFlight) {
    std::unique_ptr<DataParallel::Pending> oldest = std::move(reducing_.front());
    reducing_.erase(reducing_.begin());
    oldest->Wait();
  }
  reducing_.push_back(ranks_.ReduceScatterVAsync(flat, counts, /*mean=*/true, std::move(done)));
}

void ShardedAdamW::AfterBackward(bool last) {
  torch::NoGradGuard no_grad;
  if (ready_ != nullptr && ready_->armed()) {
    ready_->StartRest();
    grad_fresh_ = false;
    return;
  }
  if (level_ == Level::kGradients) {
    ReduceBuckets(/*overlap=*/false);
    return;
  }
  if (level_ == Level::kFull) return;  // LayerShards calls ReduceGrads per unit
  if (!last) return;                   // ZeRO-1: autograd accumulates over the micro-batches
  PackGrads(0, numel_, flat_grads_.narrow(0, 0, numel_), /*free_packed=*/true);
  flat_grads_.narrow(0, numel_, flat_grads_.numel() - numel_).zero_();  // the padding
  ranks_.ReduceScatter(flat_grads_, /*mean=*/true);  // grad_ is this rank's chunk of it
  grad_fresh_ = false;
}

ShardedAdamW::LocalSums ShardedAdamW::PrepareStep() {
  torch::NoGradGuard no_grad;
  LocalSums sums;
  FinishReduce();
  if (grad_fresh_) grad_.zero_();  // no micro-batch reached the parameters
  for (const Piece& p : pieces_) {
    const Segment& s = segments_[p.segment];
    auto g = SliceOf(grad_, p);
    if (s.lambda > 0) {
      auto diff = SliceOf(master_, p) - SliceOf(anchor_, p);
      sums.l2sp += s.lambda * at::dot(diff, diff).item<double>();
      g.add_(diff, 2.0 * s.lambda);
    }
    if (p.mask.defined()) g.mul_(p.mask);
  }
  sums.sum_squares = at::dot(grad_, grad_).item<double>();
  return sums;
}

double ShardedAdamW::ClipFactor(double grad_norm, double max_norm) {
  return max_norm > 0 && grad_norm > max_norm ? max_norm / (grad_norm + 1e-6) : 1.0;
}

void ShardedAdamW::ApplyStep(double lr, double clip) {
  torch::NoGradGuard no_grad;
  ++step_;
  std::optional<torch::Tensor> grad_scale;
  if (clip != 1.0) grad_scale = torch::full({}, 1.0 / clip, master_.options());
  std::vector<size_t> decayed, plain;
  for (size_t i = 0; i < pieces_.size(); ++i) {
    if (pieces_[i].mask.defined()) continue;
    (segments_[pieces_[i].segment].decay ? decayed : plain).push_back(i);
  }
  AdamPieces(decayed, true, lr, grad_scale);
  AdamPieces(plain, false, lr, grad_scale);
  for (const Piece& p : pieces_) {
    if (!p.mask.defined()) continue;
    if (clip != 1.0) SliceOf(grad_, p).mul_(clip);
    AdamMasked(p, lr);
  }
}

FlatAdamW::StepStats ShardedAdamW::Step(double lr, double max_norm) {
  torch::NoGradGuard no_grad;
  const LocalSums sums = PrepareStep();
  FlatAdamW::StepStats stats;
  stats.l2sp = ranks_.AllReduceSum(sums.l2sp);
  stats.grad_norm = std::sqrt(ranks_.AllReduceSum(sums.sum_squares));
  ApplyStep(lr, ClipFactor(stats.grad_norm, max_norm));
  if (level_ != Level::kFull) ranks_.AllGather(values_);
  return stats;
}

void ShardedAdamW::AdamPieces(const std::vector<size_t>& pieces, bool decay, double lr,
                              const std::optional<torch::Tensor>& grad_scale) {
  if (pieces.empty()) return;
  std::vector<torch::Tensor> p, g, m, v, steps;
  auto step = torch::full({}, static_cast<double>(step_), master_.options());
  for (size_t i : pieces) {
    const Piece& piece = pieces_[i];
    p.push_back(SliceOf(master_, piece));
    g.push_back(SliceOf(grad_, piece));
    m.push_back(SliceOf(exp_avg_, piece));
    v.push_back(SliceOf(exp_avg_sq_, piece));
    steps.push_back(step);
  }
  at::_fused_adamw_(p, g, m, v, {}, steps, lr, options_.betas(0), options_.betas(1),
                    decay ? options_.weight_decay() : 0.0, options_.eps(), /*amsgrad=*/false,
                    /*maximize=*/false, grad_scale);
}

// FlatAdamW::AdamMasked on a piece: the whole update, decay included, zeroed outside the mask.
void ShardedAdamW::AdamMasked(const Piece& piece, double lr) {
  const Segment& s = segments_[piece.segment];
  auto p = SliceOf(master_, piece);
  auto g = SliceOf(grad_, piece), m = SliceOf(exp_avg_, piece), v = SliceOf(exp_avg_sq_, piece);
  const double beta1 = options_.betas(0), beta2 = options_.betas(1);
  const double bias_correction1 = 1.0 - std::pow(beta1, static_cast<double>(step_));
  const double bias_correction2 = 1.0 - std::pow(beta2, static_cast<double>(step_));
  const double decay_factor = s.decay ? lr * options_.weight_decay() : 0.0;
  m.lerp_(g, 1.0 - beta1);
  v.mul_(beta2).addcmul_(g, g, 1.0 - beta2);
  auto update = v.sqrt().div_(std::sqrt(bias_correction2)).add_(options_.eps());
  at::div_out(update, m, update);
  update.mul_(lr / bias_correction1);
  if (decay_factor > 0) update.add_(p, decay_factor);
  update.mul_(piece.mask);
  p.sub_(update);
}

std::vector<std::pair<std::string, torch::Tensor>> ShardedAdamW::SliceTensors() const {
  const int64_t n = slice_end() - slice_begin();
  return {{"values", master_.narrow(0, 0, n)},
          {"exp_avg", exp_avg_.narrow(0, 0, n)},
          {"exp_avg_sq", exp_avg_sq_.narrow(0, 0, n)}};
}

void ShardedAdamW::RestoreRange(const std::string& name, int64_t begin,
                                const torch::Tensor& piece) {
  torch::NoGradGuard no_grad;
  const int64_t from = std::max(begin, slice_begin());
  const int64_t to = std::min(begin + piece.numel(), slice_end());
  if (from >= to) return;
  auto source = piece.narrow(0, from - begin, to - from);
  auto& target = name == "values" ? master_ : name == "exp_avg" ? exp_avg_ : exp_avg_sq_;
  target.narrow(0, from - rank_ * chunk_, to - from).copy_(source);
}

void ShardedAdamW::FinishRestore(int64_t step) {
  torch::NoGradGuard no_grad;
  if (level_ != Level::kFull) ranks_.AllGather(values_);
  step_ = step;
}

void FreeFlatStorage(const torch::Tensor& flat) {
  c10::StorageImpl* storage = flat.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(c10::DataPtr(nullptr, flat.device()));
  storage->set_nbytes(0);
}

torch::Tensor UnallocatedFlat(int64_t numel, const torch::TensorOptions& options) {
  torch::Tensor flat = torch::empty({0}, options);
  flat.unsafeGetTensorImpl()->set_sizes_contiguous({numel});
  c10::StorageImpl* storage = flat.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(c10::DataPtr(nullptr, flat.device()));
  storage->set_nbytes(static_cast<size_t>(numel) * flat.element_size());
  return flat;
}

void AllocateFlatStorage(const torch::Tensor& flat) {
  c10::StorageImpl* storage = flat.storage().unsafeGetStorageImpl();
  const size_t bytes = static_cast<size_t>(flat.numel()) * flat.element_size();
  storage->set_data_ptr_noswap(storage->allocator()->allocate(bytes));
  storage->set_nbytes(bytes);
}

void ShardedAdamW::AllowBf16Gather() {
  std::vector<std::vector<int64_t>> owned(static_cast<size_t>(world_));  // per rank
  bool any_matrix = false;
  for (const Segment& s : segments_) {
    if (s.param.dim() >= 2) {
      any_matrix = true;
      continue;
    }
    for (int64_t e = s.offset; e < s.offset + s.numel; ++e) owned[e / chunk_].push_back(e);
  }
  bf16_allowed_ = any_matrix;
  if (!any_matrix) return;
  std::vector<int64_t> positions, sources;
  for (const auto& mine : owned) {
    fp32_chunk_ = std::max(fp32_chunk_, static_cast<int64_t>(mine.size()));
  }
  for (int64_t r = 0; r < world_; ++r) {
    for (size_t j = 0; j < owned[r].size(); ++j) {
      positions.push_back(owned[r][j]);
      sources.push_back(r * fp32_chunk_ + static_cast<int64_t>(j));
    }
  }
  std::vector<int64_t> local;
  for (int64_t e : owned[rank_]) local.push_back(e - rank_ * chunk_);
  auto to_tensor = [&](const std::vector<int64_t>& v) {
    return torch::tensor(v, torch::dtype(torch::kInt64)).to(values_.device());
  };
  fp32_positions_ = to_tensor(positions);
  fp32_sources_ = to_tensor(sources);
  fp32_local_ = to_tensor(local);
}

void ShardedAdamW::PackBf16Gather() {
  wire16_ = torch::empty({world_ * chunk_}, values_.options().dtype(torch::kBFloat16));
  wire16_.narrow(0, rank_ * chunk_, chunk_).copy_(master_);  // rounds to nearest even
  if (fp32_chunk_ == 0) return;
  wire32_ = torch::zeros({world_ * fp32_chunk_}, values_.options());
  wire32_.narrow(0, rank_ * fp32_chunk_, fp32_local_.numel())
      .copy_(master_.index_select(0, fp32_local_));
}

void ShardedAdamW::UnpackBf16Gather() {
  values_.copy_(wire16_);
  if (fp32_chunk_ > 0)
    values_.index_copy_(0, fp32_positions_, wire32_.index_select(0, fp32_sources_));
  wire16_ = wire32_ = torch::Tensor();
}

void ShardedAdamW::Gather(bool bf16) {
  if (gathered_) {
    FinishGather();
    return;
  }
  torch::NoGradGuard no_grad;
  AllocateFlatStorage(values_);
  gathered_ = true;
  rounded_ = bf16 && bf16_allowed_;
  if (rounded_) {
    PackBf16Gather();
    ranks_.AllGather(wire16_);
    if (wire32_.defined()) ranks_.AllGather(wire32_);
    UnpackBf16Gather();
    return;
  }
  values_.narrow(0, rank_ * chunk_, chunk_).copy_(master_);
  ranks_.AllGather(values_);
}

void ShardedAdamW::StartGather(bool bf16) {
  if (gathered_) return;
  torch::NoGradGuard no_grad;
  AllocateFlatStorage(values_);
  gathered_ = true;
  rounded_ = bf16 && bf16_allowed_;
  if (rounded_) {
    PackBf16Gather();
    gathering_ = ranks_.AllGatherAsync(wire16_);
    if (wire32_.defined()) gathering32_ = ranks_.AllGatherAsync(wire32_);
    return;
  }
  values_.narrow(0, rank_ * chunk_, chunk_).copy_(master_);
  gathering_ = ranks_.AllGatherAsync(values_);
}

void ShardedAdamW::FinishGather() {
  if (gathering_ == nullptr) return;
  std::unique_ptr<DataParallel::Pending> pending = std::move(gathering_);
  std::unique_ptr<DataParallel::Pending> pending32 = std::move(gathering32_);
  pending->Wait();
  if (pending32 != nullptr) pending32->Wait();
  if (wire16_.defined()) {
    torch::NoGradGuard no_grad;
    UnpackBf16Gather();
  }
}

void ShardedAdamW::Release() {
  if (!gathered_ || level_ != Level::kFull) return;
  FinishGather();  // the transfer must not write into freed memory
  FreeFlatStorage(values_);
  gathered_ = rounded_ = false;
}

void ShardedAdamW::ReduceGrads(bool overlap) {
  torch::NoGradGuard no_grad;
  ReduceBuckets(overlap);
  bucket_ = torch::Tensor();  // one unit's bucket; the next unit allocates its own
}

void ShardedAdamW::FreeOptimizerState() {
  FinishReduce();
  exp_avg_ = exp_avg_sq_ = grad_ = flat_grads_ = anchor_ = bucket_ = torch::Tensor();
  pieces_.clear();
}

}  // namespace stemma::engine::train
