#include "common/job_spec.h"


#include <cmath>
#include <cstdint>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "common/yaml_json.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"

namespace stemma {
namespace {

bool ValidLabelKey(absl::string_view key) {
  if (key.empty() || key.size() > 63) return false;
  for (char c : key) {
    if (!absl::ascii_isalnum(c) && c != '-' && c != '_' && c != '.' && c != '/') return false;
  }
  return true;
}

// YAML straight into the proto by reflection (field names as in the .proto, or their JSON
// camelCase). It replaced a detour through JSON text and protobuf's JSON parser, which took
// half of `stemma submit`'s time for a file of 1,000 jobs; errors now name the field's path.
class YamlToProto {
 public:
  explicit YamlToProto(std::string where) : where_(std::move(where)) {}

  absl::Status Message(const YamlNode& node, google::protobuf::Message* msg,
                       const std::string& path) {
    namespace pb = google::protobuf;
    const pb::Descriptor* d = msg->GetDescriptor();
    if (node.IsNull()) return absl::OkStatus();  // `noop:` is an empty noop
    if (!node.IsMap()) return Error(path, "must be a mapping");
    const pb::Reflection* r = msg->GetReflection();
    for (size_t k = 0; k + 1 < node.items.size(); k += 2) {
      const YamlNode& key_node = node.items[k];
      const YamlNode& value = node.items[k + 1];
      if (!key_node.IsScalar()) return Error(path, "keys must be plain names");
      const std::string& key = key_node.scalar;
      const pb::FieldDescriptor* f = d->FindFieldByName(key);
      if (f == nullptr) f = d->FindFieldByCamelcaseName(key);
      const std::string field_path = path.empty() ? key : absl::StrCat(path, ".", key);
      if (f == nullptr) {
        std::vector<std::string> names;
        for (int i = 0; i < d->field_count(); ++i) names.push_back(d->field(i)->name());
        return Error(field_path, absl::StrCat("unknown field (allowed: ", absl::StrJoin(names, ", "), ")"));
      }
      if (const pb::OneofDescriptor* o = f->containing_oneof()) {
        const pb::FieldDescriptor* set = r->GetOneofFieldDescriptor(*msg, o);
        if (set != nullptr && set != f) {
          return Error(field_path, absl::StrCat("only one of a ", o->name(), " may be given (", set->name(),
                                                " is already)"));
        }
      }
      RETURN_IF_ERROR(Field(value, msg, f, field_path));
    }
    return absl::OkStatus();
  }

 private:
  absl::Status Error(const std::string& path, absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(where_, ": ", path, ": ", what));
  }

  absl::Status Field(const YamlNode& node, google::protobuf::Message* msg,
                     const google::protobuf::FieldDescriptor* f, const std::string& path) {
    namespace pb = google::protobuf;
    const pb::Reflection* r = msg->GetReflection();
    if (f->is_map()) {
      if (node.IsNull()) return absl::OkStatus();
      if (!node.IsMap()) return Error(path, "must be a mapping");
      const pb::Descriptor* entry = f->message_type();
      for (size_t k = 0; k + 1 < node.items.size(); k += 2) {
        pb::Message* e = r->AddMessage(msg, f);
        const YamlNode& key = node.items[k];
        const std::string entry_path = absl::StrCat(path, ".", key.scalar);
        RETURN_IF_ERROR(Scalar(key, e, entry->map_key(), entry_path, -1));
        RETURN_IF_ERROR(Value(node.items[k + 1], e, entry->map_value(), entry_path, -1));
      }
      return absl::OkStatus();
    }
    if (f->is_repeated()) {
      if (node.IsNull()) return absl::OkStatus();
      if (!node.IsSequence()) return Error(path, "must be a list");
      for (size_t i = 0; i < node.size(); ++i) {
        RETURN_IF_ERROR(Value(node.items[i], msg, f, absl::StrCat(path, "[", i, "]"), static_cast<int>(i)));
      }
      return absl::OkStatus();
    }
    return Value(node, msg, f, path, -1);
  }

  // One value of field `f` (index >= 0: appended to the repeated field).
  absl::Status Value(const YamlNode& node, google::protobuf::Message* msg,
                     const google::protobuf::FieldDescriptor* f, const std::string& path,
                     int index) {
    namespace pb = google::protobuf;
    const pb::Reflection* r = msg->GetReflection();
    if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE) {
      pb::Message* sub = index >= 0 ? r->AddMessage(msg, f) : r->MutableMessage(msg, f);
      return Message(node, sub, path);
    }
    // An engine job's spec may be written inline as a mapping (the natural way in YAML); it
    // travels as the JSON text that `stemma-engine <command> --spec FILE` reads.
    if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_STRING && (node.IsMap() || node.IsSequence()) &&
        f->containing_type() == v1::EngineSpec::descriptor() && f->name() == "spec") {
      std::string json;
      AppendYamlAsJson(node, &json);
      r->SetString(msg, f, json);
      return absl::OkStatus();
    }
    return Scalar(node, msg, f, path, index);
  }

  absl::Status Scalar(const YamlNode& node, google::protobuf::Message* msg,
                      const google::protobuf::FieldDescriptor* f, const std::string& path,
                      int index) {
    namespace pb = google::protobuf;
    const pb::Reflection* r = msg->GetReflection();
    if (node.IsNull() && index < 0) return absl::OkStatus();  // `field:` / `~`: the default
    if (!node.IsScalar()) return Error(path, "must be a single value, not a list or mapping");
    const std::string& text = node.scalar;
    const bool repeated = index >= 0;
    switch (f->cpp_type()) {
      case pb::FieldDescriptor::CPPTYPE_STRING:
        repeated ? r->AddString(msg, f, text) : r->SetString(msg, f, text);
        return absl::OkStatus();
      case pb::FieldDescriptor::CPPTYPE_INT32:
      case pb::FieldDescriptor::CPPTYPE_INT64: {
        int64_t v = 0;
        double dv = 0;
        // Also 1e3 or 5.0: a whole number written as a float.
        if (!absl::SimpleAtoi(text, &v)) {
          if (!absl::SimpleAtod(text, &dv) || dv != std::floor(dv) || std::fabs(dv) > 9.2e18) {
            return Error(path, absl::StrCat("must be an integer, not '", text, "'"));
          }
          v = static_cast<int64_t>(dv);
        }
        if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_INT32) {
          if (v < INT32_MIN || v > INT32_MAX) return Error(path, absl::StrCat(text, " is out of range"));
          repeated ? r->AddInt32(msg, f, static_cast<int32_t>(v))
                   : r->SetInt32(msg, f, static_cast<int32_t>(v));
        } else {
          repeated ? r->AddInt64(msg, f, v) : r->SetInt64(msg, f, v);
        }
        return absl::OkStatus();
      }
      case pb::FieldDescriptor::CPPTYPE_UINT32:
      case pb::FieldDescriptor::CPPTYPE_UINT64: {
        uint64_t v = 0;
        if (!absl::SimpleAtoi(text, &v)) {
          return Error(path, absl::StrCat("must be a non-negative integer, not '", text, "'"));
        }
        if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_UINT32) {
          if (v > UINT32_MAX) return Error(path, absl::StrCat(text, " is out of range"));
          repeated ? r->AddUInt32(msg, f, static_cast<uint32_t>(v))
                   : r->SetUInt32(msg, f, static_cast<uint32_t>(v));
        } else {
          repeated ? r->AddUInt64(msg, f, v) : r->SetUInt64(msg, f, v);
        }
        return absl::OkStatus();
      }
      case pb::FieldDescriptor::CPPTYPE_DOUBLE:
      case pb::FieldDescriptor::CPPTYPE_FLOAT: {
        double v = 0;
        if (!absl::SimpleAtod(text, &v) || !std::isfinite(v)) {
          return Error(path, absl::StrCat("must be a number, not '", text, "'"));
        }
        if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_DOUBLE) {
          repeated ? r->AddDouble(msg, f, v) : r->SetDouble(msg, f, v);
        } else {
          repeated ? r->AddFloat(msg, f, static_cast<float>(v))
                   : r->SetFloat(msg, f, static_cast<float>(v));
        }
        return absl::OkStatus();
      }
      case pb::FieldDescriptor::CPPTYPE_BOOL: {
        bool v = false;
        if (text == "true" || text == "True" || text == "TRUE") {
          v = true;
        } else if (!(text == "false" || text == "False" || text == "FALSE")) {
          return Error(path, absl::StrCat("must be true or false, not '", text, "'"));
        }
        repeated ? r->AddBool(msg, f, v) : r->SetBool(msg, f, v);
        return absl::OkStatus();
      }
      case pb::FieldDescriptor::CPPTYPE_ENUM: {
        const pb::EnumValueDescriptor* e = f->enum_type()->FindValueByName(text);
        int number = 0;
        if (e == nullptr && absl::SimpleAtoi(text, &number)) e = f->enum_type()->FindValueByNumber(number);
        if (e == nullptr) {
          std::vector<std::string> names;
          for (int i = 0; i < f->enum_type()->value_count(); ++i) {
            names.push_back(f->enum_type()->value(i)->name());
          }
          return Error(path, absl::StrCat("must be one of ", absl::StrJoin(names, ", ")));
        }
        repeated ? r->AddEnum(msg, f, e) : r->SetEnum(msg, f, e);
        return absl::OkStatus();
      }
      case pb::FieldDescriptor::CPPTYPE_MESSAGE:
        break;
    }
    return Error(path, "unsupported field type");
  }

  std::string where_;
};

absl::StatusOr<v1::JobSpec> SpecFromNode(const YamlNode& node, absl::string_view where) {
  if (!node.IsMap()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": a job must be a mapping"));
  }
  v1::JobSpec spec;
  RETURN_IF_ERROR(YamlToProto(std::string(where)).Message(node, &spec, ""));
  return spec;
}

}  // namespace

std::string JobKind(const v1::JobSpec& spec) {
  switch (spec.kind_case()) {
    case v1::JobSpec::kNoop: return "noop";
    case v1::JobSpec::kExec: return "exec";
    case v1::JobSpec::kEngine: return "engine";
    default: return "";
  }
}

std::string StateName(v1::JobState state) {
  if (state == v1::JOB_STATE_UNSPECIFIED) return "UNSPECIFIED";
  return v1::JobState_Name(state);
}

bool IsTerminal(v1::JobState state) {
  return state == v1::SUCCEEDED || state == v1::FAILED || state == v1::CANCELLED;
}

void ApplyDefaults(v1::JobSpec* spec) {
  if (spec->max_attempts() == 0) spec->set_max_attempts(3);
  if (spec->nodes() == 0) spec->set_nodes(1);
  auto* r = spec->mutable_resources();
  if (r->cpus() == 0) r->set_cpus(1);
  auto* b = spec->mutable_backoff();
  if (b->initial_ms() == 0) b->set_initial_ms(1000);
  if (b->max_ms() == 0) b->set_max_ms(300'000);
  if (b->multiplier() == 0) b->set_multiplier(2);
}

absl::Status ValidateJobSpec(const v1::JobSpec& spec) {
  auto bad = [](auto... parts) { return absl::InvalidArgumentError(absl::StrCat(parts...)); };
  if (spec.name().size() > kMaxNameLength) {
    return bad("name: longer than ", kMaxNameLength, " characters");
  }
  for (char c : spec.name()) {
    if (static_cast<unsigned char>(c) < 0x20) return bad("name: contains a control character");
  }
  const auto& r = spec.resources();
  if (r.gpus() < 0 || r.gpus() > kMaxGpusPerPart) {
    return bad("resources.gpus: ", r.gpus(), " is outside 0..", kMaxGpusPerPart);
  }
  if (!std::isfinite(r.cpus()) || r.cpus() < 0 || r.cpus() > kMaxCpusPerPart) {
    return bad("resources.cpus: ", r.cpus(), " is outside 0..", kMaxCpusPerPart);
  }
  if (r.memory_mb() < 0 || r.memory_mb() > kMaxMemoryMbPerPart) {
    return bad("resources.memory_mb: ", r.memory_mb(), " is outside 0..", kMaxMemoryMbPerPart);
  }
  if (spec.nodes() < 0 || spec.nodes() > kMaxNodes) {
    return bad("nodes: ", spec.nodes(), " is outside 1..", kMaxNodes);
  }
  if (spec.max_attempts() < 0 || spec.max_attempts() > kMaxAttempts) {
    return bad("max_attempts: ", spec.max_attempts(), " is outside 1..", kMaxAttempts);
  }
  if (spec.timeout_ms() < 0) return bad("timeout_ms: must not be negative");
  const auto& b = spec.backoff();
  if (b.initial_ms() < 0 || b.max_ms() < 0) return bad("backoff: delays must not be negative");
  if (!std::isfinite(b.multiplier()) || b.multiplier() < 0 || b.multiplier() > 100) {
    return bad("backoff.multiplier: ", b.multiplier(), " is outside 1..100");
  }
  if (spec.labels_size() > kMaxLabels) return bad("labels: more than ", kMaxLabels);
  for (const auto& [k, v] : spec.labels()) {
    if (!ValidLabelKey(k)) return bad("labels: bad key '", k, "' (use [A-Za-z0-9._/-], 1..63)");
    if (v.size() > 253) return bad("labels.", k, ": value longer than 253 characters");
  }
  if (spec.depends_on_size() > kMaxDependencies) {
    return bad("depends_on: more than ", kMaxDependencies, " dependencies");
  }
  switch (spec.kind_case()) {
    case v1::JobSpec::kNoop:
      if (spec.noop().duration_ms() < 0) return bad("noop.duration_ms: must not be negative");
      if (spec.noop().exit_code() < 0 || spec.noop().exit_code() > 255) {
        return bad("noop.exit_code: ", spec.noop().exit_code(), " is outside 0..255");
      }
      break;
    case v1::JobSpec::kExec: {
      const auto& e = spec.exec();
      if (e.argv_size() == 0 || e.argv(0).empty()) return bad("exec.argv: must name a program");
      if (e.argv_size() > kMaxArgv) return bad("exec.argv: more than ", kMaxArgv, " arguments");
      for (const auto& a : e.argv()) {
        if (a.find('\0') != std::string::npos) return bad("exec.argv: contains a NUL byte");
      }
      for (const auto& [k, v] : e.env()) {
        bool ok = !k.empty() && (absl::ascii_isupper(k[0]) || k[0] == '_');
        for (char c : k) ok = ok && (absl::ascii_isupper(c) || absl::ascii_isdigit(c) || c == '_');
        if (!ok) return bad("exec.env: bad variable name '", k, "' (use [A-Z_][A-Z0-9_]*)");
      }
      break;
    }
    case v1::JobSpec::kEngine:
      if (spec.engine().command().empty()) return bad("engine.command: must be set");
      break;
    default:
      return bad("kind: set one of noop, exec, engine");
  }
  return absl::OkStatus();
}

int64_t BackoffMs(const v1::JobSpec& spec, int next_attempt) {
  const auto& b = spec.backoff();
  double delay = static_cast<double>(b.initial_ms());
  double mult = b.multiplier() > 0 ? b.multiplier() : 1;
  for (int i = 2; i < next_attempt && delay < b.max_ms(); ++i) delay *= mult;
  int64_t cap = b.max_ms() > 0 ? b.max_ms() : static_cast<int64_t>(delay);
  return std::min(static_cast<int64_t>(delay), cap);
}

absl::StatusOr<std::vector<v1::JobSpec>> ParseJobsYaml(absl::string_view text,
                                                       absl::string_view source) {
  ASSIGN_OR_RETURN(std::vector<YamlNode> docs,
                   LoadYamlDocuments(std::string_view(text.data(), text.size()),
                                     std::string_view(source.data(), source.size())));
  std::vector<v1::JobSpec> specs;
  for (size_t d = 0; d < docs.size(); ++d) {
    const YamlNode& doc = docs[d];
    if (doc.IsNull()) continue;
    std::string where = docs.size() > 1 ? absl::StrCat(source, " document ", d + 1)
                                        : std::string(source);
    const YamlNode* jobs = doc.Find("jobs");
    if (jobs != nullptr && doc.size() == 1) {
      if (!jobs->IsSequence()) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": jobs must be a list"));
      }
      specs.reserve(specs.size() + jobs->items.size());
      for (size_t i = 0; i < jobs->items.size(); ++i) {
        ASSIGN_OR_RETURN(auto spec, SpecFromNode(jobs->items[i], absl::StrCat(where, " jobs[", i, "]")));
        specs.push_back(std::move(spec));
      }
    } else {
      ASSIGN_OR_RETURN(auto spec, SpecFromNode(doc, where));
      specs.push_back(std::move(spec));
    }
  }
  if (specs.empty()) return absl::InvalidArgumentError(absl::StrCat(source, ": no jobs"));
  return specs;
}

absl::StatusOr<std::vector<v1::JobSpec>> ReadJobsFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return ErrnoStatus(absl::StrCat("cannot read ", path), errno);
  std::stringstream ss;
  ss << in.rdbuf();
  return ParseJobsYaml(ss.str(), path);
}

}  // namespace stemma
