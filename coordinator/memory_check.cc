#include "coordinator/memory_check.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "common/engine_spec.h"
#include "common/files.h"
#include "common/job_ranks.h"
#include "common/job_spec.h"

namespace stemma::coordinator {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;

// "" when `e` fits `memory`, else the refusal's text (without the job's name).
std::string DoesNotFit(const v1::JobSpec& job, const experiments::ModelShape& shape,
                       const experiments::MemoryEstimate& e, const DeviceMemory& memory) {
  double need = e.Bytes();
  double limit = e.gpu ? memory.gpu_bytes : memory.cpu_bytes;
  if (!e.gpu) {
    const int processes = RanksPerPart(job);
    need *= processes;
    limit = memory.cpu_bytes;
  }
  if (limit <= 0 || need <= limit) return "";
  std::string out = absl::StrCat("needs ", e.Short(), " (", e.Items(),
                                 e.world > 1 ? absl::StrCat("; ", e.world, " ranks") : "", ")");
  if (e.gpu) {
    absl::StrAppend(&out, "; the largest GPU of ", memory.gpu_source, " has ",
                    experiments::FormatGiB(limit));
  } else {
    absl::StrAppend(&out, "; the largest worker has ", experiments::FormatGiB(limit), " of memory");
  }
  if (std::string fix = experiments::WhatWouldFit(job, shape, limit); !fix.empty()) {
    absl::StrAppend(&out, "; ", fix);
  } else if (job.has_train()) {
    absl::StrAppend(&out,
                    "; no setting of parallel.shard, activation_checkpointing or "
                    "batch_size fits: more nodes (a larger world) or larger devices");
  } else {
    absl::StrAppend(&out, "; a smaller batch_size or dtype: bfloat16 would need less");
  }
  return out;
}

}  // namespace

DeviceMemory LargestDevices(const v1::ListWorkersResponse& workers) {
  DeviceMemory m;
  for (const v1::WorkerInfo& w : workers.workers()) {
    if (w.state() == v1::WORKER_LOST) continue;
    m.cpu_bytes = std::max(m.cpu_bytes, static_cast<double>(w.memory_mb()) * kMiB);
    for (const v1::Gpu& g : w.gpus())
      m.gpu_bytes = std::max(m.gpu_bytes, static_cast<double>(g.memory_mb()) * kMiB);
  }
  return m;
}

std::optional<experiments::ModelShape> ModelShapeOnDisk(const std::string& dir) {
  if (dir.empty() || dir.rfind("${{", 0) == 0) return std::nullopt;
  absl::StatusOr<std::string> text = files::ReadFile(dir + "/config.json");
  if (!text.ok()) return std::nullopt;
  return experiments::ShapeFromConfig(*text);
}

absl::Status CheckJobsFitMemory(const v1::SubmitRequest& request,
                                const std::function<DeviceMemory()>& devices) {
  std::optional<DeviceMemory> asked;
  std::map<std::string, std::optional<experiments::ModelShape>> shapes;  // one read per model
  for (int i = 0; i < request.jobs_size(); ++i) {
    const v1::JobSpec& job = request.jobs(i);
    if (!job.has_train() && !job.has_eval()) continue;
    if (!asked.has_value()) asked = devices();
    const DeviceMemory& memory = *asked;
    if (memory.gpu_bytes <= 0 && memory.cpu_bytes <= 0) return absl::OkStatus();
    const std::string model = FirstInputModel(*EngineSpecOf(job));
    auto it = shapes.find(model);
    if (it == shapes.end()) it = shapes.emplace(model, ModelShapeOnDisk(model)).first;
    if (!it->second.has_value()) continue;
    std::optional<experiments::MemoryEstimate> e = EstimateJobMemory(job, *it->second);
    if (!e.has_value()) continue;
    if (std::string why = DoesNotFit(job, *it->second, *e, memory); !why.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat(job.name().empty() ? absl::StrCat("jobs[", i, "]")
                                          : absl::StrCat("job '", job.name(), "'"),
                       ": ", why));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckPlanFitsMemory(const experiments::ExperimentPlan& plan,
                                 const DeviceMemory& memory) {
  int refused = 0;
  std::string first;
  for (const experiments::PlanCell& c : plan.cells) {
    if (!c.memory.has_value() || !c.model_shape.has_value()) continue;
    std::string why = DoesNotFit(c.spec, *c.model_shape, *c.memory, memory);
    if (why.empty()) continue;
    if (refused++ == 0) first = absl::StrCat(c.job_name, ": ", why);
  }
  if (refused == 0) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      plan.name, ": ", refused, refused == 1 ? " job does" : " jobs do",
      " not fit the memory of any worker (stemma plan shows each stage's estimate); ", first));
}

}  // namespace stemma::coordinator
