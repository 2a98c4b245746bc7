// Job specs: defaults, validation and the YAML form users write.
//
// The YAML form has exactly the proto's field names (snake_case), e.g.
//
//   name: prepare
//   resources: {gpus: 1, cpus: 2}
//   exec: {argv: [/usr/bin/env, python3, prep.py]}
//   ---
//   name: train
//   depends_on: [prepare]
//   noop: {duration_ms: 500}
//
// A file holds one job, several YAML documents, or a mapping with a `jobs:` list.
// Unknown fields are errors that name the file, the document and the field.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/proto_yaml.h"
#include "stemma/v1/job.pb.h"

namespace stemma {

// Limits that make a spec "absurd" (checked by ValidateJobSpec). The ranges of numeric
// fields (resources, nodes, max_attempts, timeout_ms, backoff, noop) are job.proto's rules.
inline constexpr int kMaxNameLength = 253;
inline constexpr int kMaxArgv = 4096;
inline constexpr int kMaxLabels = 64;
inline constexpr int kMaxDependencies = 10000;

// The kind's field name: "noop", "exec", or an engine command ("train", "merge", ...);
// "" when no kind is set.
std::string JobKind(const v1::JobSpec& spec);
// True for the engine commands (every kind but noop and exec).
bool IsEngineJob(const v1::JobSpec& spec);
// The typed engine spec of an engine job (a v1::TrainSpec, ...); null for noop, exec, unset.
const google::protobuf::Message* EngineSpecOf(const v1::JobSpec& spec);
google::protobuf::Message* MutableEngineSpecOf(v1::JobSpec* spec);
// "PENDING", "RUNNING", ...
std::string StateName(v1::JobState state);
bool IsTerminal(v1::JobState state);

// Fills defaults in place, job.proto's rules: max_attempts 3, nodes 1, cpus 1, backoff 1 s ×2
// up to 5 min (a 0 counts as unset). The engine spec inside is left as it is.
void ApplyDefaults(v1::JobSpec* spec);

// INVALID_ARGUMENT naming the field for negative or absurd resources, a missing kind,
// an empty argv, bad label keys, out-of-range attempts and the like. Does not look at
// dependencies (they need the job table).
absl::Status ValidateJobSpec(const v1::JobSpec& spec);

// The delay before attempt number `next_attempt` (2 for the first retry).
int64_t BackoffMs(const v1::JobSpec& spec, int next_attempt);

// Parses a job file (see above). `source` names it in error messages.
absl::StatusOr<std::vector<v1::JobSpec>> ParseJobsYaml(absl::string_view text,
                                                       absl::string_view source);
absl::StatusOr<std::vector<v1::JobSpec>> ReadJobsFile(const std::string& path);

// ReadJobsFile, then every job checked as the coordinator will check it (on a copy with
// defaults applied), engine specs with their rules; errors name the file, line and field.
// A layer range is checked against a model's layer count when the model's config.json is
// readable here. What `stemma submit` runs before it sends anything.
absl::StatusOr<std::vector<v1::JobSpec>> ReadAndCheckJobsFile(const std::string& path);

// One job checked as the coordinator will check it, on a copy with defaults applied: the
// engine spec's rules with file and line (the spec's fields lie under `path` in `lines`:
// "" for a job file, "stages.cpt" for an experiment stage), then ValidateJobSpec.
absl::Status CheckJobAsSubmitted(const v1::JobSpec& job, const std::string& where,
                                 const std::string& path, const FieldLines& lines);

// Where one job of a file came from, for errors found after parsing (e.g. an engine spec's
// rules): "jobs.yaml document 2" and the line of each field.
struct JobSource {
  std::string where;
  FieldLines lines;
};
// ParseJobsYaml that also returns each job's source (same order as the jobs).
absl::StatusOr<std::vector<v1::JobSpec>> ParseJobsYaml(absl::string_view text,
                                                       absl::string_view source,
                                                       std::vector<JobSource>* sources);

}  // namespace stemma
