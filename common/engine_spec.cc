#include "common/engine_spec.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "common/layer_range.h"
#include "common/spec_checks.h"
#include "common/status.h"
#include "common/yaml_json.h"
#include "google/protobuf/util/json_util.h"
#include "stemma/v1/job.pb.h"
#include "stemma/v1/spec_options.pb.h"

namespace stemma {
namespace {

namespace pb = google::protobuf;
using FD = pb::FieldDescriptor;

const v1::FieldRules& Rules(const FD* f) { return f->options().GetExtension(v1::rules); }

std::string Join(const std::string& path, std::string_view name) {
  return path.empty() ? std::string(name) : absl::StrCat(path, ".", std::string(name));
}

// A member of a tagged message's oneof (MessageRules.tag): files write its fields flat.
const std::string* TagOf(const FD* f) {
  if (f->real_containing_oneof() == nullptr) return nullptr;
  const std::string& tag = f->containing_type()->options().GetExtension(v1::message_rules).tag();
  return tag.empty() ? nullptr : &tag;
}

// The path of field `f` of a message at `rel`; a tagged member adds nothing to it.
std::string FieldPath(const std::string& rel, const FD* f) {
  return TagOf(f) != nullptr ? rel : Join(rel, f->name());
}

bool IsNumeric(const FD* f) {
  switch (f->cpp_type()) {
    case FD::CPPTYPE_INT32:
    case FD::CPPTYPE_INT64:
    case FD::CPPTYPE_UINT32:
    case FD::CPPTYPE_UINT64:
    case FD::CPPTYPE_DOUBLE:
    case FD::CPPTYPE_FLOAT:
      return true;
    default:
      return false;
  }
}

double NumberAt(const pb::Message& m, const FD* f, int index) {
  const pb::Reflection* r = m.GetReflection();
  const bool rep = index >= 0;
  switch (f->cpp_type()) {
    case FD::CPPTYPE_INT32:
      return rep ? r->GetRepeatedInt32(m, f, index) : r->GetInt32(m, f);
    case FD::CPPTYPE_INT64:
      return static_cast<double>(rep ? r->GetRepeatedInt64(m, f, index) : r->GetInt64(m, f));
    case FD::CPPTYPE_UINT32:
      return rep ? r->GetRepeatedUInt32(m, f, index) : r->GetUInt32(m, f);
    case FD::CPPTYPE_UINT64:
      return static_cast<double>(rep ? r->GetRepeatedUInt64(m, f, index) : r->GetUInt64(m, f));
    case FD::CPPTYPE_DOUBLE:
      return rep ? r->GetRepeatedDouble(m, f, index) : r->GetDouble(m, f);
    case FD::CPPTYPE_FLOAT:
      return rep ? r->GetRepeatedFloat(m, f, index) : r->GetFloat(m, f);
    default:
      return 0;
  }
}

std::string FormatNumber(double v) {
  if (v == std::floor(v) && std::fabs(v) < 1e15) return absl::StrCat(static_cast<int64_t>(v));
  return absl::StrCat(v);
}

// What is wrong with number `v` under `rules` ("must be a finite number", "3 must be >= 8"),
// or nothing.
std::optional<std::string> RangeViolation(const v1::FieldRules& rules, double v) {
  if (!std::isfinite(v)) return "must be a finite number";
  if (rules.has_min() && (v < rules.min() || (rules.min_exclusive() && v == rules.min()))) {
    return absl::StrCat(FormatNumber(v), " must be ",
                        rules.min_exclusive() ? "> " : ">= ", FormatNumber(rules.min()));
  }
  if (rules.has_max() && (v > rules.max() || (rules.max_exclusive() && v == rules.max()))) {
    return absl::StrCat(FormatNumber(v), " must be ",
                        rules.max_exclusive() ? "< " : "<= ", FormatNumber(rules.max()));
  }
  return std::nullopt;
}

// A singular number as written: integers exactly (a double would round 2^63 - 1), doubles as
// absl prints them.
std::string NumberText(const pb::Message& m, const FD* f) {
  const pb::Reflection* r = m.GetReflection();
  switch (f->cpp_type()) {
    case FD::CPPTYPE_INT32:
      return absl::StrCat(r->GetInt32(m, f));
    case FD::CPPTYPE_INT64:
      return absl::StrCat(r->GetInt64(m, f));
    case FD::CPPTYPE_UINT32:
      return absl::StrCat(r->GetUInt32(m, f));
    case FD::CPPTYPE_UINT64:
      return absl::StrCat(r->GetUInt64(m, f));
    case FD::CPPTYPE_FLOAT:
      return absl::StrCat(r->GetFloat(m, f));
    default:
      return absl::StrCat(r->GetDouble(m, f));
  }
}

// Whether a field holds something: presence where the field has it, else non-default.
bool IsSet(const pb::Message& m, const FD* f) {
  const pb::Reflection* r = m.GetReflection();
  if (f->is_repeated()) return r->FieldSize(m, f) > 0;
  if (f->has_presence()) return r->HasField(m, f);
  if (f->cpp_type() == FD::CPPTYPE_STRING) return !r->GetString(m, f).empty();
  if (IsNumeric(f)) return NumberAt(m, f, -1) != 0;
  if (f->cpp_type() == FD::CPPTYPE_BOOL) return r->GetBool(m, f);
  if (f->cpp_type() == FD::CPPTYPE_ENUM) return r->GetEnumValue(m, f) != 0;
  return false;
}

// A value that names another job's output or a registered checkpoint rather than a path.
bool IsReference(std::string_view value) {
  return value.starts_with("ckpt:") || value.starts_with("${{") || value.starts_with("hf:");
}

bool IsPathRole(int role) {
  return role == v1::ROLE_INPUT_MODEL || role == v1::ROLE_INPUT_PATH ||
         role == v1::ROLE_OUTPUT_PATH;
}

// Copies singular or repeated scalar field `f` from `from` to `to` (same type).
void CopyField(const pb::Message& from, pb::Message* to, const FD* f) {
  const pb::Reflection* r = from.GetReflection();
  if (f->is_repeated()) {
    r->ClearField(to, f);
    for (int k = 0; k < r->FieldSize(from, f); ++k) {
      switch (f->cpp_type()) {
        case FD::CPPTYPE_INT32:
          r->AddInt32(to, f, r->GetRepeatedInt32(from, f, k));
          break;
        case FD::CPPTYPE_INT64:
          r->AddInt64(to, f, r->GetRepeatedInt64(from, f, k));
          break;
        case FD::CPPTYPE_UINT32:
          r->AddUInt32(to, f, r->GetRepeatedUInt32(from, f, k));
          break;
        case FD::CPPTYPE_UINT64:
          r->AddUInt64(to, f, r->GetRepeatedUInt64(from, f, k));
          break;
        case FD::CPPTYPE_DOUBLE:
          r->AddDouble(to, f, r->GetRepeatedDouble(from, f, k));
          break;
        case FD::CPPTYPE_FLOAT:
          r->AddFloat(to, f, r->GetRepeatedFloat(from, f, k));
          break;
        case FD::CPPTYPE_BOOL:
          r->AddBool(to, f, r->GetRepeatedBool(from, f, k));
          break;
        case FD::CPPTYPE_ENUM:
          r->AddEnumValue(to, f, r->GetRepeatedEnumValue(from, f, k));
          break;
        case FD::CPPTYPE_STRING:
          r->AddString(to, f, r->GetRepeatedString(from, f, k));
          break;
        default:
          break;
      }
    }
    return;
  }
  switch (f->cpp_type()) {
    case FD::CPPTYPE_INT32:
      return r->SetInt32(to, f, r->GetInt32(from, f));
    case FD::CPPTYPE_INT64:
      return r->SetInt64(to, f, r->GetInt64(from, f));
    case FD::CPPTYPE_UINT32:
      return r->SetUInt32(to, f, r->GetUInt32(from, f));
    case FD::CPPTYPE_UINT64:
      return r->SetUInt64(to, f, r->GetUInt64(from, f));
    case FD::CPPTYPE_DOUBLE:
      return r->SetDouble(to, f, r->GetDouble(from, f));
    case FD::CPPTYPE_FLOAT:
      return r->SetFloat(to, f, r->GetFloat(from, f));
    case FD::CPPTYPE_BOOL:
      return r->SetBool(to, f, r->GetBool(from, f));
    case FD::CPPTYPE_ENUM:
      return r->SetEnumValue(to, f, r->GetEnumValue(from, f));
    case FD::CPPTYPE_STRING:
      return r->SetString(to, f, r->GetString(from, f));
    default:
      return;
  }
}

// A message of type `d` holding the default of each of its own fields that has one, read
// from the YAML text once per type: the job defaults are filled for every submitted job, and
// a YAML parse per field per job would show in a 1,000-job submission. Null when `d` has no
// defaults. Thread-safe; the messages live as long as the process.
const pb::Message* DefaultsOf(const pb::Descriptor* d) {
  static std::mutex mu;
  static auto* cache = new absl::flat_hash_map<const pb::Descriptor*, const pb::Message*>();
  std::lock_guard<std::mutex> lock(mu);
  auto [it, fresh] = cache->try_emplace(d, nullptr);
  if (!fresh) return it->second;
  pb::Message* defaults = pb::MessageFactory::generated_factory()->GetPrototype(d)->New();
  bool any = false;
  for (int i = 0; i < d->field_count(); ++i) {
    const FD* f = d->field(i);
    const std::string& def = Rules(f).default_value();
    if (def.empty() || f->cpp_type() == FD::CPPTYPE_MESSAGE) continue;
    absl::StatusOr<std::vector<YamlNode>> doc =
        LoadYamlDocuments(absl::StrCat(f->name(), ": ", def), "default");
    if (!doc.ok() || doc->empty()) continue;
    any |= ReadYamlInto((*doc)[0], defaults, "default", "", nullptr).ok();
  }
  if (!any) {
    delete defaults;
    return nullptr;
  }
  it->second = defaults;
  return defaults;
}

class Validator {
 public:
  Validator(const SpecContext& ctx, std::optional<int64_t> layers) : ctx_(ctx), layers_(layers) {}

  absl::Status Message(const pb::Message& m, const std::string& rel) {
    const pb::Descriptor* d = m.GetDescriptor();
    const pb::Reflection* r = m.GetReflection();
    for (int i = 0; i < d->field_count(); ++i) {
      const FD* f = d->field(i);
      const v1::FieldRules& rules = Rules(f);
      const std::string path = FieldPath(rel, f);
      const bool set = IsSet(m, f);
      if (rules.required() && !set) return Error(path, "is required");
      if (!set) continue;
      if (f->is_repeated()) {
        const int n = r->FieldSize(m, f);
        if (n < rules.min_items()) {
          return Error(path, absl::StrCat("needs at least ", rules.min_items(), " item",
                                          rules.min_items() == 1 ? "" : "s"));
        }
        for (int k = 0; k < n; ++k) {
          RETURN_IF_ERROR(Value(m, f, k, absl::StrCat(path, "[", k, "]")));
        }
      } else {
        RETURN_IF_ERROR(Value(m, f, -1, path));
      }
    }
    (void)r;
    return absl::OkStatus();
  }

 private:
  absl::Status Error(const std::string& rel, std::string_view what) const {
    return SpecChecker(ctx_).Error(rel, what);
  }

  absl::Status Value(const pb::Message& m, const FD* f, int index, const std::string& path) {
    const pb::Reflection* r = m.GetReflection();
    const v1::FieldRules& rules = Rules(f);
    if (f->cpp_type() == FD::CPPTYPE_MESSAGE) {
      const pb::Message& sub =
          index >= 0 ? r->GetRepeatedMessage(m, f, index) : r->GetMessage(m, f);
      return Message(sub, path);
    }
    if (IsNumeric(f)) {
      const double v = NumberAt(m, f, index);
      if (std::optional<std::string> what = RangeViolation(rules, v)) return Error(path, *what);
      if (rules.role() == v1::ROLE_THREADS && ctx_.job_cpus > 0 &&
          v > static_cast<double>(ctx_.job_cpus)) {
        return Error(
            path, absl::StrCat(FormatNumber(v), " threads is more than the job's ", ctx_.job_cpus,
                               " CPUs (resources.cpus); ask for more CPUs or "
                               "leave threads at 0 to use them all"));
      }
      return absl::OkStatus();
    }
    if (f->cpp_type() != FD::CPPTYPE_STRING) return absl::OkStatus();
    const std::string v = index >= 0 ? r->GetRepeatedString(m, f, index) : r->GetString(m, f);
    if (rules.choices_size() > 0) {
      bool ok = false;
      for (const auto& c : rules.choices()) ok |= c == v;
      if (!ok) {
        return Error(
            path, absl::StrCat("'", v, "' is not one of ", absl::StrJoin(rules.choices(), ", ")));
      }
    }
    if (v.find('\0') != std::string::npos) return Error(path, "contains a NUL byte");
    if (rules.role() == v1::ROLE_LAYER_RANGE) {
      if (IsReference(v)) return absl::OkStatus();
      absl::StatusOr<LayerRange> range = ParseLayerRange(v, "");
      if (!range.ok()) return Error(path, std::string(range.status().message()).substr(2));
      if (layers_.has_value()) {
        absl::StatusOr<LayerRange> resolved = ResolveLayerRange(*range, *layers_, "");
        if (!resolved.ok()) return Error(path, std::string(resolved.status().message()).substr(2));
      }
    }
    if (IsPathRole(rules.role()) && v.empty() && rules.required())
      return Error(path, "is required");
    return absl::OkStatus();
  }

  const SpecContext& ctx_;
  std::optional<int64_t> layers_;
};

template <typename T>
absl::Status CommandCheck(const pb::Message& spec, const SpecChecker& checker) {
  const T* typed = dynamic_cast<const T*>(&spec);
  if (typed == nullptr) return absl::OkStatus();
  return spec_checks::Check(*typed, checker);
}

absl::Status RunCommandChecks(const pb::Message& spec, const SpecChecker& checker) {
  const std::string& name = spec.GetDescriptor()->full_name();
  if (name == "stemma.v1.InitSpec") return CommandCheck<v1::InitSpec>(spec, checker);
  if (name == "stemma.v1.TokenizeSpec") return CommandCheck<v1::TokenizeSpec>(spec, checker);
  if (name == "stemma.v1.TrainSpec") return CommandCheck<v1::TrainSpec>(spec, checker);
  if (name == "stemma.v1.MergeSpec") return CommandCheck<v1::MergeSpec>(spec, checker);
  if (name == "stemma.v1.RevertSpec") return CommandCheck<v1::RevertSpec>(spec, checker);
  if (name == "stemma.v1.InterpolateSpec") return CommandCheck<v1::InterpolateSpec>(spec, checker);
  if (name == "stemma.v1.GraftSpec") return CommandCheck<v1::GraftSpec>(spec, checker);
  if (name == "stemma.v1.UpcycleSpec") return CommandCheck<v1::UpcycleSpec>(spec, checker);
  if (name == "stemma.v1.EvalSpec") return CommandCheck<v1::EvalSpec>(spec, checker);
  if (name == "stemma.v1.AnalyzeSpec") return CommandCheck<v1::AnalyzeSpec>(spec, checker);
  if (name == "stemma.v1.PrepareSpec") return CommandCheck<v1::PrepareSpec>(spec, checker);
  return absl::OkStatus();
}

void CollectPaths(const pb::Message& m, const std::string& rel, std::vector<SpecPath>* out) {
  const pb::Descriptor* d = m.GetDescriptor();
  const pb::Reflection* r = m.GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const FD* f = d->field(i);
    const std::string path = FieldPath(rel, f);
    if (f->cpp_type() == FD::CPPTYPE_MESSAGE) {
      if (f->is_map()) continue;
      if (f->is_repeated()) {
        for (int k = 0; k < r->FieldSize(m, f); ++k) {
          CollectPaths(r->GetRepeatedMessage(m, f, k), absl::StrCat(path, "[", k, "]"), out);
        }
      } else if (r->HasField(m, f)) {
        CollectPaths(r->GetMessage(m, f), path, out);
      }
      continue;
    }
    const int role = Rules(f).role();
    if (!IsPathRole(role) || f->cpp_type() != FD::CPPTYPE_STRING) continue;
    if (f->is_repeated()) {
      for (int k = 0; k < r->FieldSize(m, f); ++k) {
        out->push_back({absl::StrCat(path, "[", k, "]"), r->GetRepeatedString(m, f, k), role});
      }
    } else if (IsSet(m, f)) {
      out->push_back({path, r->GetString(m, f), role});
    }
  }
}

void ResolvePaths(pb::Message* m, const std::filesystem::path& root) {
  const pb::Descriptor* d = m->GetDescriptor();
  const pb::Reflection* r = m->GetReflection();
  auto resolve = [&](const std::string& v) -> std::optional<std::string> {
    if (v.empty() || IsReference(v) || std::filesystem::path(v).is_absolute()) return std::nullopt;
    return (root / v).lexically_normal().string();
  };
  for (int i = 0; i < d->field_count(); ++i) {
    const FD* f = d->field(i);
    if (f->cpp_type() == FD::CPPTYPE_MESSAGE) {
      if (f->is_map()) continue;
      if (f->is_repeated()) {
        for (int k = 0; k < r->FieldSize(*m, f); ++k)
          ResolvePaths(r->MutableRepeatedMessage(m, f, k), root);
      } else if (r->HasField(*m, f)) {
        ResolvePaths(r->MutableMessage(m, f), root);
      }
      continue;
    }
    if (!IsPathRole(Rules(f).role()) || f->cpp_type() != FD::CPPTYPE_STRING) continue;
    if (f->is_repeated()) {
      for (int k = 0; k < r->FieldSize(*m, f); ++k) {
        if (auto p = resolve(r->GetRepeatedString(*m, f, k))) r->SetRepeatedString(m, f, k, *p);
      }
    } else if (auto p = resolve(r->GetString(*m, f))) {
      r->SetString(m, f, *p);
    }
  }
}

// --- Reference pages -------------------------------------------------------------------

std::string TypeText(const FD* f) {
  const v1::FieldRules& rules = Rules(f);
  std::string t;
  switch (rules.role()) {
    case v1::ROLE_INPUT_MODEL:
      t = "model (path or `ckpt:ID`)";
      break;
    case v1::ROLE_INPUT_PATH:
      t = "path (read)";
      break;
    case v1::ROLE_OUTPUT_PATH:
      t = "path (written)";
      break;
    case v1::ROLE_LAYER_RANGE:
      t = "layer range";
      break;
    default:
      switch (f->cpp_type()) {
        case FD::CPPTYPE_STRING:
          t = "string";
          break;
        case FD::CPPTYPE_BOOL:
          t = "bool";
          break;
        case FD::CPPTYPE_DOUBLE:
        case FD::CPPTYPE_FLOAT:
          t = "number";
          break;
        case FD::CPPTYPE_ENUM:
          t = "enum";
          break;
        case FD::CPPTYPE_MESSAGE:
          t = f->is_map() ? "mapping" : "mapping (below)";
          break;
        default:
          t = "integer";
          break;
      }
  }
  if (f->is_repeated() && !f->is_map()) t = absl::StrCat("list of ", t);
  if (rules.choices_size() > 0)
    t = absl::StrCat("one of `", absl::StrJoin(rules.choices(), "`, `"), "`");
  if (rules.has_min() || rules.has_max()) {
    std::string range;
    if (rules.has_min())
      absl::StrAppend(&range, rules.min_exclusive() ? "> " : "≥ ", FormatNumber(rules.min()));
    if (rules.has_min() && rules.has_max()) range += ", ";
    if (rules.has_max())
      absl::StrAppend(&range, rules.max_exclusive() ? "< " : "≤ ", FormatNumber(rules.max()));
    absl::StrAppend(&t, " ", range);
  }
  if (rules.min_items() > 0) absl::StrAppend(&t, ", at least ", rules.min_items());
  return t;
}

std::string Cell(std::string text) {
  return absl::StrReplaceAll(text, {{"|", "\\|"}, {"\n", " "}});
}

// A sub-message's table: its field prefix and its heading.
struct SubTable {
  const pb::Descriptor* d;
  std::string prefix, heading;
};

void MessageTable(const pb::Descriptor* d, const std::string& prefix, std::string* out,
                  std::vector<SubTable>* subs) {
  absl::StrAppend(out, "| field | type | default | meaning |\n| --- | --- | --- | --- |\n");
  std::vector<std::string> kinds;
  for (int i = 0; i < d->field_count(); ++i) {
    const FD* f = d->field(i);
    if (const std::string* tag = TagOf(f)) {
      // One row for the tag; each member's fields get a table of their own.
      kinds.push_back(f->name());
      subs->push_back({f->message_type(), prefix,
                       absl::StrCat("`", prefix, "` with `", *tag, ": ", f->name(), "`")});
      if (i + 1 < d->field_count() && TagOf(d->field(i + 1)) != nullptr) continue;
      absl::StrAppend(out, "| `", Join(prefix, *tag), "` | one of `", absl::StrJoin(kinds, "`, `"),
                      "` | **required** | The kind; its own fields are in the sections below. |\n");
      continue;
    }
    const v1::FieldRules& rules = Rules(f);
    const std::string name = Join(prefix, f->name());
    std::string def =
        rules.required()
            ? "**required**"
            : (rules.default_value().empty() ? "—" : absl::StrCat("`", rules.default_value(), "`"));
    std::string doc = rules.doc();
    if (!rules.example().empty()) absl::StrAppend(&doc, " Example: `", rules.example(), "`.");
    absl::StrAppend(out, "| `", name, "` | ", Cell(TypeText(f)), " | ", Cell(def), " | ", Cell(doc),
                    " |\n");
    if (f->cpp_type() == FD::CPPTYPE_MESSAGE && !f->is_map()) {
      const std::string sub = f->is_repeated() ? absl::StrCat(name, "[]") : name;
      subs->push_back({f->message_type(), sub, absl::StrCat("`", sub, "`")});
    }
  }
}

}  // namespace

const std::vector<std::string>& EngineCommands() {
  static const std::vector<std::string>* commands = [] {
    auto* out = new std::vector<std::string>;
    const pb::OneofDescriptor* kind = v1::JobSpec::descriptor()->FindOneofByName("kind");
    for (int i = 0; i < kind->field_count(); ++i) {
      const std::string& name = kind->field(i)->name();
      if (name != "noop" && name != "exec") out->push_back(name);
    }
    return out;
  }();
  return *commands;
}

const pb::Descriptor* EngineSpecDescriptor(std::string_view command) {
  const FD* f = v1::JobSpec::descriptor()->FindFieldByName(std::string(command));
  if (f == nullptr || f->containing_oneof() == nullptr || f->cpp_type() != FD::CPPTYPE_MESSAGE ||
      command == "noop" || command == "exec") {
    return nullptr;
  }
  return f->message_type();
}

std::unique_ptr<pb::Message> NewEngineSpec(std::string_view command) {
  const pb::Descriptor* d = EngineSpecDescriptor(command);
  if (d == nullptr) return nullptr;
  return std::unique_ptr<pb::Message>(
      pb::MessageFactory::generated_factory()->GetPrototype(d)->New());
}

void FillFieldDefaults(pb::Message* message) {
  const pb::Descriptor* d = message->GetDescriptor();
  for (int i = 0; i < d->field_count(); ++i) {
    const FD* f = d->field(i);
    if (f->cpp_type() == FD::CPPTYPE_MESSAGE || Rules(f).default_value().empty()) continue;
    if (!f->is_repeated() && !f->has_presence() && !Rules(f).zero_is_unset()) {
      continue;  // 0 would be a value of its own; schema_test refuses a default here
    }
    if (IsSet(*message, f)) continue;
    if (const pb::Message* defaults = DefaultsOf(d)) CopyField(*defaults, message, f);
  }
}

void FillSpecDefaults(pb::Message* spec) {
  FillFieldDefaults(spec);
  const pb::Descriptor* d = spec->GetDescriptor();
  const pb::Reflection* r = spec->GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const FD* f = d->field(i);
    if (f->cpp_type() != FD::CPPTYPE_MESSAGE || f->is_map()) continue;
    if (f->is_repeated()) {
      for (int k = 0; k < r->FieldSize(*spec, f); ++k)
        FillSpecDefaults(r->MutableRepeatedMessage(spec, f, k));
    } else if (r->HasField(*spec, f)) {
      FillSpecDefaults(r->MutableMessage(spec, f));
    }
  }
}

absl::Status CheckFieldRanges(const pb::Message& message, const std::string& path) {
  const pb::Descriptor* d = message.GetDescriptor();
  const pb::Reflection* r = message.GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const FD* f = d->field(i);
    const v1::FieldRules& rules = Rules(f);
    if (f->is_repeated() || !IsNumeric(f) || (!rules.has_min() && !rules.has_max())) continue;
    if (f->has_presence() ? !r->HasField(message, f)
                          : (rules.zero_is_unset() && !IsSet(message, f)))
      continue;
    const double v = NumberAt(message, f, -1);
    const bool inclusive =
        rules.has_min() && rules.has_max() && !rules.min_exclusive() && !rules.max_exclusive();
    const std::string field = Join(path, f->name());
    if (inclusive) {
      if (v >= rules.min() && v <= rules.max()) continue;  // NaN fails both
      return absl::InvalidArgumentError(absl::StrCat(field, ": ", NumberText(message, f),
                                                     " is outside ", FormatNumber(rules.min()),
                                                     "..", FormatNumber(rules.max())));
    }
    if (std::optional<std::string> what = RangeViolation(rules, v)) {
      return absl::InvalidArgumentError(absl::StrCat(field, ": ", *what));
    }
  }
  return absl::OkStatus();
}

absl::Status SpecChecker::Error(std::string_view field, std::string_view what) const {
  std::string path = context_.path;
  if (!field.empty()) path = Join(path, field);
  const int line = context_.lines != nullptr ? context_.lines->Line(path) : 0;
  return SpecError(context_.where, line, path, what);
}

std::optional<int64_t> SpecChecker::ModelLayers(const std::string& model_path) const {
  if (!context_.model_layers) return std::nullopt;
  return context_.model_layers(model_path);
}

std::string FirstInputModel(const pb::Message& spec) {
  for (const SpecPath& p : SpecPaths(spec)) {
    if (p.role == v1::ROLE_INPUT_MODEL && !p.value.empty()) return p.value;
  }
  return "";
}

absl::Status ValidateEngineSpec(const pb::Message& spec, const SpecContext& context) {
  std::optional<int64_t> layers;
  if (context.model_layers) {
    const std::string model = FirstInputModel(spec);
    if (!model.empty()) layers = context.model_layers(model);
  }
  Validator validator(context, layers);
  RETURN_IF_ERROR(validator.Message(spec, ""));
  return RunCommandChecks(spec, SpecChecker(context));
}

std::vector<SpecPath> SpecPaths(const pb::Message& spec) {
  std::vector<SpecPath> out;
  CollectPaths(spec, "", &out);
  return out;
}

void ResolveSpecPaths(pb::Message* spec, const std::string& root) {
  ResolvePaths(spec, std::filesystem::path(root));
}

std::string SpecToJson(const pb::Message& spec) {
  std::string json;
  pb::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  (void)pb::util::MessageToJsonString(spec, &json, options);
  return json;
}

std::string SpecReferenceMarkdown(std::string_view command) {
  const pb::Descriptor* d = EngineSpecDescriptor(command);
  if (d == nullptr) return "";
  std::string out;
  const v1::MessageRules& mr = d->options().GetExtension(v1::message_rules);
  if (!mr.doc().empty()) absl::StrAppend(&out, mr.doc(), "\n\n");
  std::vector<SubTable> subs;
  MessageTable(d, "", &out, &subs);
  for (size_t i = 0; i < subs.size(); ++i) {  // grows while iterating: breadth first
    const SubTable sub = subs[i];
    absl::StrAppend(&out, "\n### ", sub.heading, "\n\n");
    const v1::MessageRules& sr = sub.d->options().GetExtension(v1::message_rules);
    if (!sr.doc().empty()) absl::StrAppend(&out, sr.doc(), "\n\n");
    MessageTable(sub.d, sub.prefix, &out, &subs);
  }
  return out;
}

std::string SpecHelpText(std::string_view command) {
  const pb::Descriptor* d = EngineSpecDescriptor(command);
  if (d == nullptr) return "";
  std::string out;
  std::vector<std::pair<const pb::Descriptor*, std::string>> todo = {{d, ""}};
  for (size_t i = 0; i < todo.size(); ++i) {
    auto [m, prefix] = todo[i];
    for (int k = 0; k < m->field_count(); ++k) {
      const FD* f = m->field(k);
      if (const std::string* tag = TagOf(f)) {
        absl::StrAppend(&out, "  ", Join(prefix, *tag), ": ", f->name(), "  (the fields below)\n");
        todo.push_back({f->message_type(), prefix});
        continue;
      }
      const v1::FieldRules& rules = Rules(f);
      const std::string name = Join(prefix, f->name());
      std::string def = rules.required() ? "required"
                                         : (rules.default_value().empty()
                                                ? ""
                                                : absl::StrCat("default ", rules.default_value()));
      absl::StrAppend(&out, "  ", name, "  (", TypeText(f), def.empty() ? "" : "; ", def,
                      ")\n      ", rules.doc(), "\n");
      if (f->cpp_type() == FD::CPPTYPE_MESSAGE && !f->is_map()) {
        todo.push_back({f->message_type(), f->is_repeated() ? absl::StrCat(name, "[]") : name});
      }
    }
  }
  return out;
}

}  // namespace stemma
