// `stemma-engine train --spec FILE [--<field> VALUE ...] [--stop-after-step N]`
// (docs/engine/train.md).
#include <malloc.h>

#include <cstdio>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/engine_contract.h"
#include "common/status.h"
#include "engine/commands.h"
#include "engine/train/commands.h"
#include "engine/train/spec.h"
#include "engine/train/trainer.h"

namespace stemma::engine {
namespace {

constexpr char kUsage[] =
    "stemma-engine train --spec FILE [--<field> VALUE ...] [--stop-after-step N]\n"
    "  --stop-after-step N  stop right after step N as if preempted (exit 3); run again to resume";

// A training step frees and reallocates the same few-megabyte activations and gradients
// every step. glibc serves blocks that large with fresh mmaps by default, so each step paid
// for its memory again in page faults (half of the process's page faults; ~2 % of a CPU
// step in kernel time). Served from the heap and not trimmed, they are reused instead.
void KeepLargeBlocksInTheHeap() {
  mallopt(M_MMAP_THRESHOLD, 32 << 20);  // glibc's maximum
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

absl::StatusOr<int> Run(const SpecCall& call) {
  int64_t stop_after_step = 0;
  if (auto it = call.flags.find("stop-after-step"); it != call.flags.end()) {
    if (!absl::SimpleAtoi(it->second, &stop_after_step) || stop_after_step < 1) {
      return absl::InvalidArgumentError("--stop-after-step wants a positive step number");
    }
  }
  v1::TrainSpec& spec = call.Get<v1::TrainSpec>();
  train::FillTrainDefaults(&spec);
  KeepLargeBlocksInTheHeap();
  train::RunOptions options;
  options.source = call.source;
  options.stop_after_step = stop_after_step;
  ASSIGN_OR_RETURN(train::RunResult result,
                   train::Train(spec, options, EventWriter(/*enabled=*/true)));
  if (result == train::RunResult::kStopped) {
    std::fprintf(stderr,
                 "%sstopped after step %lld as asked (--stop-after-step); run again to resume from "
                 "the checkpoint\n",
                 std::string(engine_contract::kErrorPrefix).c_str(),
                 static_cast<long long>(stop_after_step));
    return engine_contract::kExitStopped;
  }
  if (result == train::RunResult::kPreempted) return engine_contract::kExitPreempted;
  return engine_contract::kExitOk;
}

}  // namespace

int RunTrain(int argc, char** argv) {
  return RunSpecCommand({kUsage, {"stop-after-step"}, Run}, argc, argv);
}

}  // namespace stemma::engine
