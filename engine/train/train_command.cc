// `stemma-engine train --spec FILE [--<field> VALUE ...] [--stop-after-step N]`
// (docs/engine/train.md).
#include <malloc.h>

#include <cstdio>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/engine_cli.h"
#include "common/engine_contract.h"
#include "common/status.h"
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

}  // namespace

int RunTrain(int argc, char** argv) {
  absl::StatusOr<EngineInvocation> inv =
      ParseEngineCommandLine("train", argc, argv, {"stop-after-step"});
  if (!inv.ok()) return ReportEngineFailure(inv.status());
  if (inv->help) {
    std::fputs(EngineHelp("train", kUsage).c_str(), stdout);
    return engine_contract::kExitOk;
  }
  int64_t stop_after_step = 0;
  if (auto it = inv->flags.find("stop-after-step"); it != inv->flags.end()) {
    if (!absl::SimpleAtoi(it->second, &stop_after_step) || stop_after_step < 1) {
      return ReportEngineFailure(
          absl::InvalidArgumentError("--stop-after-step wants a positive step number"));
    }
  }
  const std::string source = inv->spec_file.empty() ? "command line" : inv->spec_file;
  absl::StatusOr<train::TrainSpec> spec =
      train::TrainSpecFromProto(static_cast<const v1::TrainSpec&>(*inv->spec), source);
  if (!spec.ok()) return ReportEngineFailure(spec.status());
  KeepLargeBlocksInTheHeap();
  train::RunOptions options;
  options.stop_after_step = stop_after_step;
  absl::StatusOr<train::RunResult> result =
      train::Train(*spec, options, EventWriter(/*enabled=*/true));
  if (!result.ok()) return ReportEngineFailure(result.status());
  if (*result == train::RunResult::kStopped) {
    std::fprintf(stderr,
                 "%sstopped after step %lld as asked (--stop-after-step); run again to resume from "
                 "the checkpoint\n",
                 std::string(engine_contract::kErrorPrefix).c_str(),
                 static_cast<long long>(stop_after_step));
    return engine_contract::kExitStopped;
  }
  return engine_contract::kExitOk;
}

}  // namespace stemma::engine
