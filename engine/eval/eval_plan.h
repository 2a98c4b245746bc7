// What `stemma-engine eval` knows before it loads anything (docs/eval.md): the spec with its
// run defaults and resolved sequence lengths, the task list its start event announces, each
// task's corpus suite, and the checkpoint's identity. Torch-free: the LibTorch engine
// (eval_command.cc) and the front that answers a fully cached eval without LibTorch
// (serve_cached.h) plan alike, so both write the same start event and results.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "stemma/v1/engine_event.pb.h"
#include "stemma/v1/specs/eval.pb.h"

namespace stemma::engine::eval {

using Json = nlohmann::ordered_json;  // results keep the order they are built in

struct EvalPlan {
  v1::EvalSpec given;     // as ParseEngineCommandLine read it: the results' spec.content
  v1::EvalSpec spec;      // run defaults filled, every perplexity task's seq_len resolved
  std::string spec_path;  // the --spec file, "" when only flags
  std::vector<std::string> seq_len_sources;  // per task; "" for other types
  std::vector<Json> suites;                  // per task: its corpus suite, or null
  Json task_plan;                            // the start event's task list
};

// FillRunDefaults, ReadModelFacts and ResolveSequenceLengths (resolve.h) on `given`, then the
// task plan. Errors as theirs (bad input: FailedPrecondition, InvalidArgument).
absl::StatusOr<EvalPlan> PlanEval(const v1::EvalSpec& given, const std::string& spec_path);

// The `start` event of the plan: spec, model, dtype, device, threads (and where they came
// from) and the task list.
v1::EngineEvent StartEvent(const EvalPlan& plan);

// What a result measured: {path, sha256, hash_of}, sha256 of the checkpoint's stemma.json
// when it has one (hash_of "stemma.json"), else of the sorted "<sha256>  <file>\n" lines
// (sha256sum's format) of config.json and every *.safetensors file (hash_of "weights").
// NotFound when the directory cannot be listed.
absl::StatusOr<Json> CheckpointIdentity(const std::string& dir);

// The spec as the results file shows it: each task flat, `type` beside its fields, as users
// write it (the proto's JSON nests them under the type's name).
Json SpecContent(const v1::EvalSpec& spec);

}  // namespace stemma::engine::eval
