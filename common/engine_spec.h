// The engine commands and their typed specs (stemma/v1/specs/*.proto): one schema that the
// CLI, the coordinator and `stemma-engine` read, checked by the same code everywhere.
//
// A spec's fields carry rules (stemma/v1/spec_options.proto): a default, required, a range,
// allowed choices, a role (input model, input path, output path, layer range, threads).
// This file enforces them generically; each command's cross-field rules live in
// common/spec_checks_<area>.cc and run after the generic ones. Errors are InvalidArgument
// "<where>: line L: <field path>: <problem>" — one line naming the file, line and field.
//
// Thread-safety: everything here is a pure function of its arguments.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/proto_yaml.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"

namespace stemma {

// "init", "tokenize", "train", "merge", ... (the engine kinds of v1::JobSpec, in order).
const std::vector<std::string>& EngineCommands();
// The spec message of `command`, or null when it is not an engine command.
const google::protobuf::Descriptor* EngineSpecDescriptor(std::string_view command);
std::unique_ptr<google::protobuf::Message> NewEngineSpec(std::string_view command);

// Sets every unset field that has a default_value, in the message and in every
// sub-message that is set. The defaults are YAML text read like the field itself (once per
// field: later calls copy the parsed value). A scalar without presence counts as unset only
// when its rules say zero_is_unset and it is 0.
void FillSpecDefaults(google::protobuf::Message* spec);
// The same for `message`'s own fields only, not descending into sub-messages (JobSpec, whose
// sub-messages include the engine spec that keeps its defaults as submitted).
void FillFieldDefaults(google::protobuf::Message* message);

// The range rules (min, max) of `message`'s own numeric fields, not descending: what the
// job's own fields (JobSpec, Resources, Backoff, NoopSpec in job.proto) are checked with.
// InvalidArgument "<path>.<field>: <value> is outside <min>..<max>" (the wording of the job
// limits; "must be >= min" where a bound is exclusive or missing). A zero_is_unset field
// that is 0 is not checked (it is unset); other scalars without presence are, 0 included.
absl::Status CheckFieldRanges(const google::protobuf::Message& message, const std::string& path);

// What a check knows besides the spec.
struct SpecContext {
  std::string where;  // the file (or "job 3"), for errors
  std::string path;   // the spec's own field path in that file ("train"), or ""
  const FieldLines* lines = nullptr;
  // The layer count of an input model when the caller can read its config.json (the CLI
  // on the submitting machine, the engine); nullopt when unknown. May be empty.
  std::function<std::optional<int64_t>(const std::string& model_path)> model_layers;
  // The job's cores (resources.cpus rounded up); 0: not a job (a spec run by hand).
  int64_t job_cpus = 0;
};

// Helper for the per-command checks: errors carrying the file, line and full field path.
class SpecChecker {
 public:
  explicit SpecChecker(const SpecContext& context) : context_(context) {}
  // InvalidArgument for `field` (relative to the spec, e.g. "optimizer.lr").
  absl::Status Error(std::string_view field, std::string_view what) const;
  // The layer count of the model named by `model_path`, when the context can learn it.
  std::optional<int64_t> ModelLayers(const std::string& model_path) const;
  const SpecContext& context() const { return context_; }

 private:
  const SpecContext& context_;
};

// The generic rules of every field (recursively), then the command's own checks.
absl::Status ValidateEngineSpec(const google::protobuf::Message& spec, const SpecContext& context);

// The first input model the spec names (its first ROLE_INPUT_MODEL field that is set), used
// to learn the layer count for layer-range checks; "" when none.
std::string FirstInputModel(const google::protobuf::Message& spec);

// Every path-valued field (roles input model, input path, output path), as
// (field path, value) pairs, repeated fields item by item ("models[2]").
struct SpecPath {
  std::string field;
  std::string value;
  int role = 0;  // v1::FieldRole
};
std::vector<SpecPath> SpecPaths(const google::protobuf::Message& spec);

// Rewrites every relative path-valued field as root/path. `root` must be absolute.
void ResolveSpecPaths(google::protobuf::Message* spec, const std::string& root);

// The spec as JSON with the proto's field names (what the worker writes for the engine).
std::string SpecToJson(const google::protobuf::Message& spec);

// The reference of a command's spec as Markdown: every field (sub-messages included) with
// its type, default, range or choices, and meaning. docs/engine/<command>.md embeds it
// between `<!-- BEGIN GENERATED -->` and `<!-- END GENERATED -->`; a test keeps the two equal.
std::string SpecReferenceMarkdown(std::string_view command);
// The same as plain text for `stemma-engine <command> --help`.
std::string SpecHelpText(std::string_view command);

}  // namespace stemma
