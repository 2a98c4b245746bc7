#include "engine/train/overlapped_all_reduce.h"

#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <utility>

namespace stemma::engine::train {
namespace {

// Calls back into ReadyBuckets once autograd has accumulated a parameter's gradient.
class ReadyHook : public torch::autograd::PostAccumulateGradHook {
 public:
  ReadyHook(ReadyBuckets* owner, size_t index) : owner_(owner), index_(index) {}
  void operator()(const torch::autograd::Variable& /*param*/) override {
    owner_->GradReady(index_);
  }

 private:
  ReadyBuckets* owner_;
  size_t index_;
};

std::vector<torch::Tensor> RequiringGrad(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> out;
  for (const torch::Tensor& p : params) {
    if (p.requires_grad()) out.push_back(p);
  }
  return out;
}

}  // namespace

bool ShardOverlapEnabled(const std::string& shard, const torch::Device& device) {
  if (const char* forced = std::getenv("STEMMA_SHARD_OVERLAP"); forced != nullptr) {
    return std::string(forced) != "0";
  }
  return device.is_cuda() || shard != "gradients";
}

ReadyBuckets::ReadyBuckets(std::vector<torch::Tensor> params,
                           std::vector<std::vector<size_t>> members,
                           std::function<void(size_t bucket)> start)
    : params_(std::move(params)),
      members_(std::move(members)),
      start_(std::move(start)),
      bucket_of_(params_.size()),
      final_(params_.size()),
      waiting_(members_.size()),
      started_grad_(params_.size()) {
  for (size_t b = 0; b < members_.size(); ++b) {
    for (size_t i : members_[b]) bucket_of_[i] = b;
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    torch::autograd::impl::set_post_acc_grad_hooks(params_[i],
                                                   std::make_unique<ReadyHook>(this, i));
  }
}

ReadyBuckets::~ReadyBuckets() {
  for (const torch::Tensor& p : params_) {
    torch::autograd::impl::set_post_acc_grad_hooks(p, nullptr);
  }
}

void ReadyBuckets::Arm() {
  std::fill(final_.begin(), final_.end(), false);
  for (size_t b = 0; b < members_.size(); ++b) {
    waiting_[b] = static_cast<int64_t>(members_[b].size());
  }
  next_ = 0;
  armed_ = true;
}

std::pair<const void*, int64_t> ReadyBuckets::GradState(size_t index) const {
  const torch::Tensor& grad = params_[index].grad();
  if (!grad.defined()) return {nullptr, 0};
  return {grad.unsafeGetTensorImpl(), static_cast<int64_t>(grad._version())};
}

void ReadyBuckets::GradReady(size_t index) {
  if (!armed_) return;
  if (final_[index]) {
    TORCH_CHECK(bucket_of_[index] >= next_ || GradState(index) == started_grad_[index],
                "a parameter's gradient changed after its bucket's reduction started; run with "
                "STEMMA_SHARD_OVERLAP=0");
    return;
  }
  final_[index] = true;
  if (--waiting_[bucket_of_[index]] > 0) return;
  while (next_ < members_.size() && waiting_[next_] == 0) Start(next_++);
}

void ReadyBuckets::Start(size_t bucket) {
  start_(bucket);
  for (size_t i : members_[bucket]) started_grad_[i] = GradState(i);
}

void ReadyBuckets::StartRest() {
  armed_ = false;
  while (next_ < members_.size()) Start(next_++);
}

OverlappedAllReduce::OverlappedAllReduce(const std::vector<torch::Tensor>& params,
                                         DataParallel& ranks, int64_t bucket_bytes)
    : params_(RequiringGrad(params)),
      offset_(params_.size()),
      bucket_of_(params_.size()),
      ranks_(ranks) {
  const int64_t cap = std::max<int64_t>(1, bucket_bytes / 4);  // fp32 elements
  for (size_t i = params_.size(); i-- > 0;) {
    const int64_t numel = params_[i].numel();
    if (buckets_.empty() || (buckets_.back().numel > 0 && buckets_.back().numel + numel > cap)) {
      buckets_.emplace_back();
    }
    Bucket& bucket = buckets_.back();
    bucket_of_[i] = buckets_.size() - 1;
    offset_[i] = bucket.numel;
    bucket.params.push_back(i);
    bucket.numel += numel;
  }
  std::vector<std::vector<size_t>> members;
  for (const Bucket& bucket : buckets_) members.push_back(bucket.params);
  ready_ = std::make_unique<ReadyBuckets>(params_, std::move(members),
                                          [this](size_t b) { Start(buckets_[b]); });
}

OverlappedAllReduce::~OverlappedAllReduce() = default;

void OverlappedAllReduce::Start(Bucket& bucket) {
  torch::NoGradGuard no_grad;
  if (!bucket.flat.defined()) {
    bucket.flat = torch::empty(
        {bucket.numel},
        params_[bucket.params[0]].options().dtype(torch::kFloat32).requires_grad(false));
  }
  for (size_t i : bucket.params) {
    auto slot = bucket.flat.narrow(0, offset_[i], params_[i].numel());
    const torch::Tensor& grad = params_[i].grad();
    if (grad.defined()) {
      slot.copy_(grad.reshape(-1));
    } else {
      slot.zero_();
    }
  }
  bucket.reducing = ranks_.AllReduceAsync(bucket.flat, /*mean=*/true, nullptr);
}

void OverlappedAllReduce::Finish() {
  ready_->StartRest();
  for (Bucket& bucket : buckets_) {
    std::unique_ptr<DataParallel::Pending> pending = std::move(bucket.reducing);
    if (pending != nullptr) pending->Wait();
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    const Bucket& bucket = buckets_[bucket_of_[i]];
    params_[i].mutable_grad() =
        bucket.flat.narrow(0, offset_[i], params_[i].numel()).view(params_[i].sizes());
  }
}

}  // namespace stemma::engine::train
