// stemma-engine merge|revert|interpolate|graft|upcycle --spec FILE (docs/merge.md).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include <chrono>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/spec_file.h"
#include "common/status.h"
#include "engine/merge/checkpoint_stream.h"
#include "engine/merge/commands.h"
#include "engine/merge/kernels.h"
#include "engine/merge/merge_plan.h"

namespace stemma::engine {
namespace {

using nlohmann::json;

void Emit(const json& event) {
  std::string line = event.dump() + "\n";
  std::fwrite(line.data(), 1, line.size(), stdout);
  std::fflush(stdout);
}

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

absl::Status Run(const std::string& command, const std::string& spec_path) {
  const auto start = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(json spec, ReadSpecFile(spec_path));
  ASSIGN_OR_RETURN(merge::MergePlan plan, merge::PlanFromSpec(command, spec, spec_path));
  size_t total = 0;
  for (const auto& o : plan.outputs) total += o.tensors.size();
  Emit({{"event", "start"}, {"command", command}, {"spec", spec_path},
        {"outputs", plan.outputs.size()}, {"tensors", total}});

  size_t done_before = 0;
  uint64_t bytes = 0;
  json outputs = json::array();
  for (const merge::PlannedOutput& o : plan.outputs) {
    merge::StreamWriterOptions options;
    options.max_shard_bytes = plan.max_shard_bytes;
    options.overwrite = plan.overwrite;
    options.tensor_hashes = plan.tensor_hashes;
    options.direct_io = plan.direct_io;
    options.files = o.files;
    options.carry_from = o.carry_from;
    options.parents = o.parents;
    options.producer = {Env("STEMMA_JOB_ID"), Env("STEMMA_ATTEMPT_ID"), command, o.params};
    // Progress per batch of tensors: at most ~100 events per job, and the last one.
    const size_t every = std::max<size_t>(1, total / 100);
    options.on_tensor = [&](size_t n) {
      const size_t step = done_before + n;
      if (step % every != 0 && step != total) return;
      Emit({{"event", "progress"}, {"step", step}, {"total_steps", total},
            {"message", absl::StrCat(o.out, ": ", n, "/", o.tensors.size(), " tensors")}});
    };
    // Test hook (tests/engine merge kill test): stop after the first shard so a test can
    // kill the process at a known point.
    if (const std::string pause = Env("STEMMA_MERGE_TEST_PAUSE_S"); !pause.empty()) {
      options.after_first_shard_for_test = [pause] {
        std::fprintf(stderr, "stemma-engine: test pause after the first shard\n");
        std::this_thread::sleep_for(std::chrono::seconds(std::atoi(pause.c_str())));
      };
    }
    merge::RecipeFiller filler(o.tensors, o.recipes);
    RETURN_IF_ERROR(merge::WriteCheckpoint(
        o.out, o.tensors,
        [&](size_t i, int64_t b, int64_t e, bool first, uint8_t* out) { return filler(i, b, e, first, out); },
        options));
    for (const auto& t : o.tensors) bytes += t.nbytes();
    done_before += o.tensors.size();
    Emit({{"event", "output"}, {"name", "model"}, {"path", o.out}});
    outputs.push_back(o.out);
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  Emit({{"event", "done"}, {"command", command}, {"outputs", outputs}, {"tensors", total},
        {"tensor_bytes", bytes}, {"seconds", seconds}});
  return absl::OkStatus();
}

}  // namespace

int RunMerge(int argc, char** argv) {
  const std::string command = argv[0];
  std::string spec;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--spec") == 0 && i + 1 < argc) {
      spec = argv[++i];
    } else if (std::strncmp(argv[i], "--spec=", 7) == 0) {
      spec = argv[i] + 7;
    } else {
      std::fprintf(stderr, "stemma-engine: error: %s: unknown argument %s\nusage: stemma-engine %s --spec FILE\n",
                   command.c_str(), argv[i], command.c_str());
      return 2;
    }
  }
  if (spec.empty()) {
    std::fprintf(stderr, "usage: stemma-engine %s --spec FILE (docs/merge.md)\n", command.c_str());
    return 2;
  }
  absl::Status s = Run(command, spec);
  if (!s.ok()) {
    std::fprintf(stderr, "stemma-engine: error: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}

}  // namespace stemma::engine
