// stemma-engine merge|revert|interpolate|graft|upcycle --spec FILE (docs/merge.md,
// docs/engine/<command>.md).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/engine_cli.h"
#include "common/engine_contract.h"
#include "common/status.h"
#include "engine/commands.h"
#include "engine/events.h"
#include "engine/io/durable.h"
#include "engine/io/fs.h"
#include "engine/merge/checkpoint_stream.h"
#include "engine/merge/commands.h"
#include "engine/merge/kernels.h"
#include "engine/merge/merge_plan.h"

namespace stemma::engine {
namespace {

std::string Env(std::string_view name) {
  const char* v = std::getenv(std::string(name).c_str());
  return v == nullptr ? "" : v;
}

// The registry's name for what a command made (common/engine_contract.h, `operation`).
std::string Operation(const std::string& command, const nlohmann::json& params) {
  if (command != "merge") return command;
  return params.value("method", "linear") == "linear" ? "soup" : "merge";
}

absl::StatusOr<int> Run(const SpecCall& call) {
  const std::string& command = call.command;
  const auto start = std::chrono::steady_clock::now();
  const EventWriter events;
  const std::string& where = call.source;
  // Everything that needs the checkpoints is checked here, before a byte is written.
  ASSIGN_OR_RETURN(merge::MergePlan plan, merge::PlanFromSpec(*call.spec, where));
  for (const merge::PlannedOutput& o : plan.outputs) {
    if (!io::PathExists(o.out)) continue;
    if (!plan.overwrite) {
      return absl::AlreadyExistsError(absl::StrCat(
          where, ": out: ", o.out, " already exists (set overwrite: true to replace it)"));
    }
    absl::Status replaceable = io::CheckReplaceable(o.out);
    if (!replaceable.ok())
      return absl::Status(replaceable.code(),
                          absl::StrCat(where, ": out: ", replaceable.message()));
  }
  size_t total = 0;
  for (const auto& o : plan.outputs) total += o.tensors.size();
  v1::EngineEvent start_event =
      CommandEvent(engine_contract::kEventStart, command, {{"spec", where}});
  AddDetails(plan.start, &start_event);
  AddDetails({{"outputs", plan.outputs.size()}, {"tensors", total}}, &start_event);
  events.Emit(start_event);

  size_t done_before = 0;
  uint64_t bytes = 0;
  EventDetails outputs = EventDetails::array();
  for (const merge::PlannedOutput& o : plan.outputs) {
    merge::StreamWriterOptions options;
    options.max_shard_bytes = plan.max_shard_bytes;
    options.overwrite = plan.overwrite;
    options.tensor_hashes = plan.tensor_hashes;
    options.direct_io = plan.direct_io;
    options.files = o.files;
    options.carry_from = o.carry_from;
    options.parents = o.parents;
    options.producer = {Env(engine_contract::kEnvJobId), Env(engine_contract::kEnvAttemptId),
                        command, o.params};
    // Progress per batch of tensors: at most ~100 events per job, and the last one.
    const size_t every = std::max<size_t>(1, total / 100);
    options.on_tensor = [&](size_t n) {
      const size_t step = done_before + n;
      if (step % every != 0 && step != total) return;
      v1::EngineEvent progress =
          ProgressEvent(total == 0 ? 1.0 : static_cast<double>(step) / static_cast<double>(total),
                        absl::StrCat(o.out, ": ", n, "/", o.tensors.size(), " tensors"));
      progress.set_step(static_cast<double>(step));
      progress.set_total_steps(static_cast<double>(total));
      events.Emit(progress);
    };
    // Test hook (merge_test's kill test): stop after the first shard so a test can kill the
    // process at a known point.
    if (const std::string pause = Env("STEMMA_MERGE_TEST_PAUSE_S"); !pause.empty()) {
      options.after_first_shard_for_test = [pause] {
        std::fprintf(stderr, "stemma-engine: test pause after the first shard\n");
        std::this_thread::sleep_for(std::chrono::seconds(std::atoi(pause.c_str())));
      };
    }
    merge::RecipeFiller filler(o.tensors, o.recipes);
    RETURN_IF_ERROR(merge::WriteCheckpoint(
        o.out, o.tensors,
        [&](size_t i, int64_t b, int64_t e, bool first, uint8_t* out) {
          return filler(i, b, e, first, out);
        },
        options));
    for (const auto& t : o.tensors) bytes += t.nbytes();
    done_before += o.tensors.size();
    ASSIGN_OR_RETURN(v1::EngineEvent output,
                     OutputEvent(o.name, o.out, Operation(command, o.params)));
    events.Emit(output);
    outputs.push_back(o.out);
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  events.Emit(CommandEvent(
      engine_contract::kEventDone, command,
      {{"outputs", outputs}, {"tensors", total}, {"tensor_bytes", bytes}, {"seconds", seconds}}));
  return engine_contract::kExitOk;
}

}  // namespace

int RunMerge(int argc, char** argv) {
  const std::string usage = absl::StrCat("stemma-engine ", argc > 0 ? argv[0] : "merge",
                                         " --spec FILE [--<field> VALUE ...]");
  return RunSpecCommand({usage, {}, Run}, argc, argv);
}

}  // namespace stemma::engine
