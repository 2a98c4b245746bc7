// Rendering of metric points and artifacts for `stemma metrics`, `stemma get` and
// `stemma ckpt`. Pure functions: no I/O, no RPCs.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "stemma/v1/user_service.pb.h"

namespace stemma::cli {

// "j-12": a job id rather than an experiment name.
bool LooksLikeJobId(const std::string& s);

// [{job, cell, revision, attempt, name, step, value, labels, time_ms}, ...]
nlohmann::json MetricPointsToJson(const std::vector<v1::MetricPoint>& points);
// job,attempt,name,step,value,time_ms,labels (k=v;k=v),cell,revision: one line per point,
// with a header.
std::string RenderMetricsCsv(const std::vector<v1::MetricPoint>& points);
// JOB CELL STEP NAME VALUE (wide adds REVISION ATTEMPT LABELS TIME).
std::string RenderMetricsTable(const std::vector<v1::MetricPoint>& points, bool wide);
// "loss 2.31 @ step 30, tokens_per_s 5120 @ step 30": the last value of each name.
std::string RenderLastValues(const std::vector<v1::MetricPoint>& points);
// "%g"-style with 6 significant digits.
std::string FormatValue(double v);
// 1536 -> "1.5K", 3 GiB -> "3.0G"; "-" for 0.
std::string HumanBytes(int64_t bytes);

// The artifact as JSON with proto field names (enums as their names).
nlohmann::json ArtifactToJson(const v1::Artifact& artifact);
// ID NAME TYPE JOB EXPERIMENT SIZE CHECK AGE PATH (wide adds SHA256 PARENTS PIN).
// The metrics measured on an artifact grouped by the job that measured them, one line per
// job: "j-12 eval-dense: bpb/all=2.31 bpb/ru=2.5" (the latest per name of jobs that recorded
// no measurement fall back to "latest: ..."), oldest job first.
std::vector<std::string> MeasuredLines(const v1::Artifact& artifact);
std::string RenderArtifactsTable(const std::vector<v1::Artifact>& artifacts, bool wide,
                                 int64_t now_ms);
// The lineage as a tree from the root down to the base; an artifact reached twice is
// printed once and then "(see above)".
std::string RenderLineageTree(const v1::LineageResponse& lineage);

}  // namespace stemma::cli
