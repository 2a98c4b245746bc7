#include "common/job_spec.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/engine_cli.h"
#include "common/engine_spec.h"
#include "common/files.h"
#include "common/job_ranks.h"
#include "common/path_confinement.h"
#include "common/proto_yaml.h"
#include "common/status.h"
#include "common/yaml_json.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "stemma/v1/spec_options.pb.h"

namespace stemma {
namespace {

bool ValidLabelKey(absl::string_view key) {
  if (key.empty() || key.size() > 63) return false;
  for (char c : key) {
    if (!absl::ascii_isalnum(c) && c != '-' && c != '_' && c != '.' && c != '/') return false;
  }
  return true;
}

// `engine: {command: C, spec: {...}}` (the form of earlier versions and of by-hand docs)
// becomes `C: {...}`, so both read into the typed field of the job's kind.
absl::Status RewriteEngineSugar(YamlNode* job, const std::string& where) {
  for (size_t k = 0; k + 1 < job->items.size(); k += 2) {
    if (!job->items[k].IsScalar() || job->items[k].scalar != "engine") continue;
    YamlNode& value = job->items[k + 1];
    const YamlNode* command = value.Find("command");
    const YamlNode* spec = value.Find("spec");
    if (!value.IsMap() || command == nullptr || !command->IsScalar() ||
        value.size() != (spec != nullptr ? 2u : 1u)) {
      return SpecError(where, value.line, "engine",
                       "write {command: <engine command>, spec: {...}} or the command as the kind "
                       "(e.g. train: {...})");
    }
    if (EngineSpecDescriptor(command->scalar) == nullptr) {
      return SpecError(where, command->line, "engine.command",
                       absl::StrCat("unknown engine command '", command->scalar,
                                    "' (commands: ", absl::StrJoin(EngineCommands(), ", "), ")"));
    }
    YamlNode key = job->items[k];
    key.scalar = command->scalar;
    YamlNode body = spec != nullptr ? *spec : YamlNode{};
    if (body.line == 0) body.line = value.line;
    job->items[k] = std::move(key);
    job->items[k + 1] = std::move(body);
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::JobSpec> SpecFromNode(const YamlNode& node, const std::string& where,
                                         FieldLines* lines) {
  if (!node.IsMap()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": a job must be a mapping"));
  }
  v1::JobSpec spec;
  if (node.Find("engine") != nullptr) {
    YamlNode copy = node;
    RETURN_IF_ERROR(RewriteEngineSugar(&copy, where));
    RETURN_IF_ERROR(ReadYamlInto(copy, &spec, where, "", lines));
  } else {
    RETURN_IF_ERROR(ReadYamlInto(node, &spec, where, "", lines));
  }
  return spec;
}

}  // namespace

std::string JobKind(const v1::JobSpec& spec) {
  if (spec.kind_case() == v1::JobSpec::KIND_NOT_SET) return "";
  return std::string(v1::JobSpec::descriptor()->FindFieldByNumber(spec.kind_case())->name());
}

bool IsEngineJob(const v1::JobSpec& spec) {
  return spec.kind_case() != v1::JobSpec::KIND_NOT_SET && spec.kind_case() != v1::JobSpec::kNoop &&
         spec.kind_case() != v1::JobSpec::kExec;
}

const google::protobuf::Message* EngineSpecOf(const v1::JobSpec& spec) {
  if (!IsEngineJob(spec)) return nullptr;
  const auto* field = v1::JobSpec::descriptor()->FindFieldByNumber(spec.kind_case());
  return &spec.GetReflection()->GetMessage(spec, field);
}

google::protobuf::Message* MutableEngineSpecOf(v1::JobSpec* spec) {
  if (!IsEngineJob(*spec)) return nullptr;
  const auto* field = v1::JobSpec::descriptor()->FindFieldByNumber(spec->kind_case());
  return spec->GetReflection()->MutableMessage(spec, field);
}

std::string StateName(v1::JobState state) {
  if (state == v1::JOB_STATE_UNSPECIFIED) return "UNSPECIFIED";
  return v1::JobState_Name(state);
}

bool IsTerminal(v1::JobState state) {
  return state == v1::SUCCEEDED || state == v1::FAILED || state == v1::CANCELLED;
}

void ApplyDefaults(v1::JobSpec* spec) {
  // The defaults are job.proto's rules; resources and backoff always exist once defaulted.
  // Not FillSpecDefaults: the engine spec inside keeps its defaults unfilled, as submitted.
  FillFieldDefaults(spec);
  FillFieldDefaults(spec->mutable_resources());
  FillFieldDefaults(spec->mutable_backoff());
}

namespace {

// An exec job's declared outputs (issue 23: names as identifiers, since the worker passes
// each as STEMMA_OUTPUT_<NAME>; a path; a known type), inputs, code and launcher.
absl::Status CheckExecOutputs(const v1::ExecSpec& e) {
  auto bad = [](auto... parts) { return absl::InvalidArgumentError(absl::StrCat(parts...)); };
  constexpr int kMaxOutputs = 64;
  constexpr int kMaxPaths = 1024;
  if (e.outputs_size() > kMaxOutputs) return bad("exec.outputs: more than ", kMaxOutputs);
  for (const auto& [name, out] : e.outputs()) {
    bool ok = !name.empty() && name.size() <= 64 && !absl::ascii_isdigit(name[0]);
    for (char c : name) ok = ok && (absl::ascii_isalnum(c) || c == '_');
    if (!ok) return bad("exec.outputs: bad output name '", name, "' (use [A-Za-z_][A-Za-z0-9_]*)");
    if (out.path().empty()) return bad("exec.outputs.", name, ".path: required");
    if (out.path().find('\0') != std::string::npos)
      return bad("exec.outputs.", name, ".path: contains a NUL byte");
    if (out.type() != "checkpoint" && out.type() != "dataset" && out.type() != "results" &&
        out.type() != "file") {
      return bad("exec.outputs.", name, ".type: '", out.type(),
                 "' is not checkpoint, dataset, results or file");
    }
  }
  if (e.inputs_size() > kMaxPaths) return bad("exec.inputs: more than ", kMaxPaths, " paths");
  if (e.code_size() > kMaxPaths) return bad("exec.code: more than ", kMaxPaths, " paths");
  for (int i = 0; i < e.inputs_size(); ++i) {
    if (e.inputs(i).empty()) return bad("exec.inputs[", i, "]: empty path");
  }
  for (int i = 0; i < e.code_size(); ++i) {
    if (e.code(i).empty()) return bad("exec.code[", i, "]: empty path");
  }
  if (!e.launcher().empty() && e.launcher() != "torchrun") {
    return bad("exec.launcher: '", e.launcher(), "' is not \"\" or torchrun");
  }
  return absl::OkStatus();
}

// An exec job's argv and environment: sizes that keep the job under every later send limit,
// and no variable that could hijack the programs a worker starts.
absl::Status CheckExecSpec(const v1::ExecSpec& e) {
  auto bad = [](auto... parts) { return absl::InvalidArgumentError(absl::StrCat(parts...)); };
  constexpr size_t kMaxArgBytes = 128 * 1024;
  constexpr size_t kMaxArgvBytes = 192 * 1024;
  constexpr int kMaxEnv = 1024;
  constexpr size_t kMaxEnvBytes = 64 * 1024;
  if (e.argv_size() == 0 || e.argv(0).empty()) return bad("exec.argv: must name a program");
  if (e.argv_size() > kMaxArgv) return bad("exec.argv: more than ", kMaxArgv, " arguments");
  size_t argv_bytes = 0;
  for (int i = 0; i < e.argv_size(); ++i) {
    const std::string& a = e.argv(i);
    if (a.find('\0') != std::string::npos) return bad("exec.argv[", i, "]: contains a NUL byte");
    if (a.size() > kMaxArgBytes)
      return bad("exec.argv[", i, "]: longer than ", kMaxArgBytes, " bytes");
    argv_bytes += a.size() + 1;
  }
  if (argv_bytes > kMaxArgvBytes) {
    return bad("exec.argv: ", argv_bytes, " bytes in all, more than ", kMaxArgvBytes);
  }
  if (e.env_size() > kMaxEnv) return bad("exec.env: more than ", kMaxEnv, " variables");
  size_t env_bytes = 0;
  for (const auto& [k, v] : e.env()) {
    bool ok = !k.empty() && (absl::ascii_isupper(k[0]) || k[0] == '_');
    for (char c : k) ok = ok && (absl::ascii_isupper(c) || absl::ascii_isdigit(c) || c == '_');
    if (!ok) return bad("exec.env: bad variable name '", k, "' (use [A-Z_][A-Z0-9_]*)");
    // The dynamic loader's variables run code of the job's choosing inside every
    // program it starts, setuid helpers included; the worker sets PATH, the STEMMA_*
    // contract and the GPUs it allocated.
    if (absl::StartsWith(k, "LD_")) {
      return bad("exec.env.", k, ": dynamic loader variables (LD_*) are not allowed");
    }
    if (k == "PATH") {
      return bad("exec.env.PATH: may not be overridden; give argv[0] as an absolute path");
    }
    if (absl::StartsWith(k, "STEMMA_") || k == "CUDA_VISIBLE_DEVICES") {
      return bad("exec.env.", k, ": set by the worker, not by the job");
    }
    if (v.find('\0') != std::string::npos) return bad("exec.env.", k, ": contains a NUL byte");
    env_bytes += k.size() + v.size() + 2;
  }
  if (env_bytes > kMaxEnvBytes) {
    return bad("exec.env: ", env_bytes, " bytes in all, more than ", kMaxEnvBytes);
  }
  return CheckExecOutputs(e);
}

// An eval or analyze on `cuda` / `cuda:N` runs on the job's GPUs: with resources.gpus 0 it
// would land on a worker slot without one (and N counts the job's GPUs, which the worker
// makes visible as 0..gpus-1). Refused naming both fields.
absl::Status CheckDeviceAgainstGpus(const v1::JobSpec& spec) {
  std::string device;
  if (spec.has_eval()) device = spec.eval().device();
  if (spec.has_analyze()) device = spec.analyze().device();
  if (!absl::StartsWith(device, "cuda")) return absl::OkStatus();
  int64_t index = 0;
  if (device.size() > 5 && !absl::SimpleAtoi(device.substr(5), &index)) return absl::OkStatus();
  const int64_t gpus = spec.resources().gpus();
  if (index < gpus) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(JobKind(spec), ".device: '", device, "' needs GPU ", index,
                   " of the job but resources.gpus is ", gpus,
                   gpus == 0 ? " (give resources.gpus: 1 or more, or device: cpu)" : ""));
}

}  // namespace

absl::Status ValidateJobSpec(const v1::JobSpec& spec) {
  auto bad = [](auto... parts) { return absl::InvalidArgumentError(absl::StrCat(parts...)); };
  // Limits that keep every accepted job far below gRPC's 4 MiB send limit wherever it
  // travels later (an assignment, a get, a watch event), and every number in range of the
  // arithmetic done on it (backoff in int64 milliseconds).
  constexpr size_t kMaxSpecBytes = 256 * 1024;
  auto has_control = [](absl::string_view text) {
    for (char c : text) {
      if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) return true;
    }
    return false;
  };
  if (const size_t size = spec.ByteSizeLong(); size > kMaxSpecBytes) {
    return bad("spec: ", size, " bytes, more than the ", kMaxSpecBytes, " a job may have");
  }
  if (spec.name().size() > kMaxNameLength) {
    return bad("name: longer than ", kMaxNameLength, " characters");
  }
  if (has_control(spec.name())) return bad("name: contains a control character");
  if (spec.experiment().size() > kMaxNameLength) {
    return bad("experiment: longer than ", kMaxNameLength, " characters");
  }
  if (has_control(spec.experiment())) return bad("experiment: contains a control character");
  // Ranges: job.proto's rules ("resources.gpus: 65 is outside 0..64").
  RETURN_IF_ERROR(CheckFieldRanges(spec.resources(), "resources"));
  const auto& r = spec.resources();
  if (r.gpus() > 0 && r.ranks_per_part() > 0 && r.ranks_per_part() != r.gpus()) {
    return bad("resources.ranks_per_part: ", r.ranks_per_part(), " must equal resources.gpus (",
               r.gpus(),
               ": one process per GPU) or be 0; several ranks per part share cores only "
               "without GPUs");
  }
  if (r.ranks_per_part() > 1 && spec.has_noop()) {
    return bad("resources.ranks_per_part: a noop job runs one process");
  }
  if (r.ranks_per_part() > 1 && IsEngineJob(spec) && !RunsRanks(JobKind(spec))) {
    return bad(
        "resources.ranks_per_part: ", JobKind(spec),
        " runs one process per part (of the engine commands, only train and eval run ranks)");
  }
  RETURN_IF_ERROR(CheckFieldRanges(spec, ""));
  RETURN_IF_ERROR(CheckFieldRanges(spec.backoff(), "backoff"));
  if (spec.labels_size() > kMaxLabels) return bad("labels: more than ", kMaxLabels);
  for (const auto& [k, v] : spec.labels()) {
    if (!ValidLabelKey(k)) return bad("labels: bad key '", k, "' (use [A-Za-z0-9._/-], 1..63)");
    if (v.size() > 253) return bad("labels.", k, ": value longer than 253 characters");
    if (has_control(v)) return bad("labels.", k, ": contains a control character");
  }
  if (spec.depends_on_size() > kMaxDependencies) {
    return bad("depends_on: more than ", kMaxDependencies, " dependencies");
  }
  for (const auto& d : spec.depends_on()) {
    if (d.empty() || d.size() > kMaxNameLength || has_control(d)) {
      return bad("depends_on: '", d.substr(0, 40), "' is not a job id or name");
    }
  }
  switch (spec.kind_case()) {
    case v1::JobSpec::kNoop:
      RETURN_IF_ERROR(CheckFieldRanges(spec.noop(), "noop"));
      break;
    case v1::JobSpec::kExec:
      RETURN_IF_ERROR(CheckExecSpec(spec.exec()));
      break;
    case v1::JobSpec::KIND_NOT_SET:
      return bad("kind: set one of noop, exec, ", absl::StrJoin(EngineCommands(), ", "));
    default:
      // Engine kinds: the typed spec's rules (common/engine_spec.h).
      {
        SpecContext context;
        context.path = JobKind(spec);
        context.job_cpus = static_cast<int64_t>(
            std::ceil(spec.resources().cpus() > 0 ? spec.resources().cpus() : 1));
        RETURN_IF_ERROR(ValidateEngineSpec(*EngineSpecOf(spec), context));
        // What no worker's roots could make right (the worker checks the rest).
        RETURN_IF_ERROR(CheckSpecPathSyntax(*EngineSpecOf(spec), context.path));
        RETURN_IF_ERROR(CheckDeviceAgainstGpus(spec));
      }
      break;
  }
  // Data parallel: each of the job's ranks keeps batch_size / ranks rows of a micro-batch.
  const int ranks = std::max(1, spec.nodes()) * RanksPerPart(spec);
  const int64_t batch = spec.train().has_batch_size() ? spec.train().batch_size() : 1;
  if (spec.has_train() && ranks > 1 && batch % ranks != 0) {
    return bad("train.batch_size: ", batch, " is not divisible by the job's ", ranks,
               " ranks (nodes x ranks per part: one per GPU, or resources.ranks_per_part)");
  }
  return absl::OkStatus();
}

int64_t BackoffMs(const v1::JobSpec& spec, int next_attempt) {
  // In double, clamped before any conversion: initial × multiplier^k overflows int64 (and
  // a cast of such a double is undefined) long before a loop bound would stop it.
  const auto& b = spec.backoff();
  const double initial = static_cast<double>(std::max<int64_t>(0, b.initial_ms()));
  const double mult = b.multiplier() >= 1 && std::isfinite(b.multiplier()) ? b.multiplier() : 1;
  // The longest delay: the upper bound of backoff.max_ms (job.proto), a day.
  static const double kCeiling =
      v1::Backoff::descriptor()->FindFieldByName("max_ms")->options().GetExtension(v1::rules).max();
  const double cap =
      b.max_ms() > 0 ? std::min<double>(static_cast<double>(b.max_ms()), kCeiling) : kCeiling;
  double delay = std::min(initial, cap);
  for (int i = 2; i < next_attempt && delay < cap; ++i) delay = std::min(delay * mult, cap);
  return static_cast<int64_t>(delay);
}

absl::StatusOr<std::vector<v1::JobSpec>> ParseJobsYaml(absl::string_view text,
                                                       absl::string_view source) {
  return ParseJobsYaml(text, source, nullptr);
}

absl::StatusOr<std::vector<v1::JobSpec>> ParseJobsYaml(absl::string_view text,
                                                       absl::string_view source,
                                                       std::vector<JobSource>* sources) {
  ASSIGN_OR_RETURN(std::vector<YamlNode> docs,
                   LoadYamlDocuments(std::string_view(text.data(), text.size()),
                                     std::string_view(source.data(), source.size())));
  std::vector<v1::JobSpec> specs;
  for (size_t d = 0; d < docs.size(); ++d) {
    const YamlNode& doc = docs[d];
    if (doc.IsNull()) continue;
    std::string where =
        docs.size() > 1 ? absl::StrCat(source, " document ", d + 1) : std::string(source);
    const YamlNode* jobs = doc.Find("jobs");
    if (jobs != nullptr && doc.size() == 1) {
      if (!jobs->IsSequence()) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": jobs must be a list"));
      }
      specs.reserve(specs.size() + jobs->items.size());
      for (size_t i = 0; i < jobs->items.size(); ++i) {
        JobSource js;
        js.where = absl::StrCat(where, " jobs[", i, "]");
        ASSIGN_OR_RETURN(auto spec,
                         SpecFromNode(jobs->items[i], js.where, sources ? &js.lines : nullptr));
        specs.push_back(std::move(spec));
        if (sources != nullptr) sources->push_back(std::move(js));
      }
    } else {
      JobSource js;
      js.where = where;
      ASSIGN_OR_RETURN(auto spec, SpecFromNode(doc, where, sources ? &js.lines : nullptr));
      specs.push_back(std::move(spec));
      if (sources != nullptr) sources->push_back(std::move(js));
    }
  }
  if (specs.empty()) return absl::InvalidArgumentError(absl::StrCat(source, ": no jobs"));
  return specs;
}

absl::StatusOr<std::vector<v1::JobSpec>> ReadJobsFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, files::ReadFile(path));
  return ParseJobsYaml(text, path);
}

absl::Status CheckJobAsSubmitted(const v1::JobSpec& spec, const std::string& where,
                                 const std::string& path, const FieldLines& lines) {
  v1::JobSpec job = spec;
  ApplyDefaults(&job);
  if (IsEngineJob(job)) {
    SpecContext context;
    context.where = where;
    context.path = path.empty() ? JobKind(job) : absl::StrCat(path, ".", JobKind(job));
    context.lines = &lines;
    context.model_layers = ModelLayersFromConfig;
    context.job_cpus = static_cast<int64_t>(std::ceil(job.resources().cpus()));
    google::protobuf::Message* engine = MutableEngineSpecOf(&job);
    FillSpecDefaults(engine);
    RETURN_IF_ERROR(ValidateEngineSpec(*engine, context));
  }
  absl::Status st = ValidateJobSpec(job);
  if (!st.ok()) {
    const std::string message(st.message());
    const std::string field = message.substr(0, message.find(':'));
    return SpecError(where, lines.Line(path.empty() ? field : absl::StrCat(path, ".", field)), path,
                     message);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<v1::JobSpec>> ReadAndCheckJobsFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, files::ReadFile(path));
  std::vector<JobSource> sources;
  ASSIGN_OR_RETURN(std::vector<v1::JobSpec> specs, ParseJobsYaml(text, path, &sources));
  for (size_t i = 0; i < specs.size(); ++i) {
    RETURN_IF_ERROR(CheckJobAsSubmitted(specs[i], sources[i].where, "", sources[i].lines));
  }
  return specs;
}

}  // namespace stemma
