#include "common/proto_yaml.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "google/protobuf/descriptor.h"
#include "stemma/v1/spec_options.pb.h"

namespace stemma {
namespace {

// YAML straight into the proto by reflection (field names as in the .proto, or their JSON
// camelCase). It replaced a detour through JSON text and protobuf's JSON parser, which took
// half of `stemma submit`'s time for a file of 1,000 jobs; errors now name the field's path.
class YamlToProto {
 public:
  YamlToProto(std::string_view where, FieldLines* lines) : where_(where), lines_(lines) {}

  absl::Status Message(const YamlNode& node, google::protobuf::Message* msg,
                       const std::string& path) {
    namespace pb = google::protobuf;
    const pb::Descriptor* d = msg->GetDescriptor();
    if (node.IsNull()) return absl::OkStatus();  // `noop:` is an empty noop
    if (node.line > 0) line_ = node.line;
    if (!node.IsMap()) return Error(path, "must be a mapping");
    const std::string& tag = d->options().GetExtension(v1::message_rules).tag();
    if (!tag.empty() && node.Find(tag) != nullptr) return Tagged(node, msg, path, tag);
    const pb::Reflection* r = msg->GetReflection();
    for (size_t k = 0; k + 1 < node.items.size(); k += 2) {
      const YamlNode& key_node = node.items[k];
      const YamlNode& value = node.items[k + 1];
      if (!key_node.IsScalar()) return Error(path, "keys must be plain names");
      const std::string& key = key_node.scalar;
      const pb::FieldDescriptor* f = d->FindFieldByName(key);
      if (f == nullptr) f = d->FindFieldByCamelcaseName(key);
      const std::string field_path = path.empty() ? key : absl::StrCat(path, ".", key);
      line_ = key_node.line;
      if (lines_ != nullptr) lines_->Set(field_path, key_node.line);
      if (f == nullptr) {
        std::vector<std::string> names;
        for (int i = 0; i < d->field_count(); ++i) names.push_back(d->field(i)->name());
        return Error(field_path,
                     absl::StrCat("unknown field (allowed: ", absl::StrJoin(names, ", "), ")"));
      }
      if (const pb::OneofDescriptor* o = f->containing_oneof()) {
        const pb::FieldDescriptor* set = r->GetOneofFieldDescriptor(*msg, o);
        if (set != nullptr && set != f) {
          return Error(field_path, absl::StrCat("only one of a ", o->name(), " may be given (",
                                                set->name(), " is already)"));
        }
      }
      // A tagged message's member, nested ({choice: {k: 2}}), has the flat form's paths.
      const bool inline_member = !tag.empty() && f->real_containing_oneof() != nullptr;
      RETURN_IF_ERROR(Field(value, msg, f, inline_member ? path : field_path));
    }
    return absl::OkStatus();
  }

 private:
  // The flat form of a tagged message (MessageRules.tag): `<tag>: <member>` selects the
  // oneof member; every other key is a field of the message itself or of that member.
  absl::Status Tagged(const YamlNode& node, google::protobuf::Message* msg, const std::string& path,
                      const std::string& tag) {
    namespace pb = google::protobuf;
    const pb::Descriptor* d = msg->GetDescriptor();
    const YamlNode* kind = node.Find(tag);
    const std::string tag_path = path.empty() ? tag : absl::StrCat(path, ".", tag);
    std::vector<std::string> kinds;
    const pb::FieldDescriptor* member = nullptr;
    for (int i = 0; i < d->field_count(); ++i) {
      const pb::FieldDescriptor* f = d->field(i);
      if (f->real_containing_oneof() == nullptr || f->message_type() == nullptr) continue;
      kinds.push_back(f->name());
      if (kind->IsScalar() && kind->scalar == f->name()) member = f;
    }
    if (kind->line > 0) line_ = kind->line;
    if (lines_ != nullptr && kind->line > 0) lines_->Set(tag_path, kind->line);
    if (member == nullptr) {
      return Error(tag_path, absl::StrCat("'", kind->IsScalar() ? kind->scalar : "",
                                          "' is not one of ", absl::StrJoin(kinds, ", ")));
    }
    pb::Message* body = msg->GetReflection()->MutableMessage(msg, member);
    for (size_t k = 0; k + 1 < node.items.size(); k += 2) {
      const YamlNode& key_node = node.items[k];
      if (!key_node.IsScalar()) return Error(path, "keys must be plain names");
      const std::string& key = key_node.scalar;
      if (key == tag) continue;
      const std::string field_path = path.empty() ? key : absl::StrCat(path, ".", key);
      line_ = key_node.line;
      if (lines_ != nullptr) lines_->Set(field_path, key_node.line);
      const pb::FieldDescriptor* f = d->FindFieldByName(key);
      if (f == nullptr) f = d->FindFieldByCamelcaseName(key);
      if (f != nullptr && f->real_containing_oneof() == nullptr) {
        RETURN_IF_ERROR(Field(node.items[k + 1], msg, f, field_path));
        continue;
      }
      const pb::FieldDescriptor* own = body->GetDescriptor()->FindFieldByName(key);
      if (own == nullptr) own = body->GetDescriptor()->FindFieldByCamelcaseName(key);
      if (own != nullptr) {
        RETURN_IF_ERROR(Field(node.items[k + 1], body, own, field_path));
        continue;
      }
      const pb::OneofDescriptor* oneof = member->real_containing_oneof();
      for (int i = 0; i < oneof->field_count(); ++i) {
        const pb::Descriptor* other = oneof->field(i)->message_type();
        if (other != nullptr && other->FindFieldByName(key) != nullptr) {
          // "does not apply to a perplexity task": the member, then the message name's last word.
          const std::string& name = d->name();
          const size_t word = name.find_last_of("ABCDEFGHIJKLMNOPQRSTUVWXYZ");
          return Error(field_path, absl::StrCat("does not apply to a ", member->name(), " ",
                                                absl::AsciiStrToLower(name.substr(word))));
        }
      }
      std::vector<std::string> names = {tag};
      for (int i = 0; i < d->field_count(); ++i) {
        if (d->field(i)->real_containing_oneof() == nullptr) names.push_back(d->field(i)->name());
      }
      for (int i = 0; i < body->GetDescriptor()->field_count(); ++i) {
        names.push_back(body->GetDescriptor()->field(i)->name());
      }
      return Error(field_path,
                   absl::StrCat("unknown field (allowed: ", absl::StrJoin(names, ", "), ")"));
    }
    return absl::OkStatus();
  }

  absl::Status Error(const std::string& path, std::string_view what) const {
    return SpecError(where_, line_, path, what);
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
        if (lines_ != nullptr && key.line > 0) lines_->Set(entry_path, key.line);
        RETURN_IF_ERROR(Scalar(key, e, entry->map_key(), entry_path, -1));
        RETURN_IF_ERROR(Value(node.items[k + 1], e, entry->map_value(), entry_path, -1));
      }
      return absl::OkStatus();
    }
    if (f->is_repeated()) {
      if (node.IsNull()) return absl::OkStatus();
      if (!node.IsSequence()) {
        if (node.line > 0) line_ = node.line;
        return Error(path, "must be a list");
      }
      for (size_t i = 0; i < node.size(); ++i) {
        // Each item's own line, for errors about the item as a whole ("tasks[2]: ...").
        if (lines_ != nullptr && node.items[i].line > 0)
          lines_->Set(absl::StrCat(path, "[", i, "]"), node.items[i].line);
        RETURN_IF_ERROR(
            Value(node.items[i], msg, f, absl::StrCat(path, "[", i, "]"), static_cast<int>(i)));
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
    return Scalar(node, msg, f, path, index);
  }

  absl::Status Scalar(const YamlNode& node, google::protobuf::Message* msg,
                      const google::protobuf::FieldDescriptor* f, const std::string& path,
                      int index) {
    namespace pb = google::protobuf;
    const pb::Reflection* r = msg->GetReflection();
    if (node.IsNull() && index < 0) return absl::OkStatus();  // `field:` / `~`: the default
    if (node.line > 0) line_ = node.line;
    if (!node.IsScalar()) return Error(path, "must be a single value, not a list or mapping");
    const std::string& text = node.scalar;
    if (node.plain && f->options().GetExtension(v1::rules).role() == v1::ROLE_LAYER_RANGE) {
      int64_t number = 0;
      if (absl::SimpleAtoi(text, &number)) {
        return Error(path, absl::StrCat("write layer ranges as strings: \"", text, "\" for layer ",
                                        text, " alone, \"2:6\" for layers 2..5 (half-open)"));
      }
    }
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
          if (v < INT32_MIN || v > INT32_MAX)
            return Error(path, absl::StrCat(text, " is out of range"));
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
        if (e == nullptr && absl::SimpleAtoi(text, &number))
          e = f->enum_type()->FindValueByNumber(number);
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
  FieldLines* lines_;
  int line_ = 0;  // of the node being read, for errors
};

}  // namespace

int FieldLines::Line(std::string_view path) const {
  std::string p(path);
  while (true) {
    if (auto it = lines_.find(p); it != lines_.end()) return it->second;
    const size_t cut = p.find_last_of(".[");
    if (cut == std::string::npos) return 0;
    p.resize(cut);
  }
}

absl::Status SpecError(std::string_view where, int line, std::string_view path,
                       std::string_view what) {
  std::string text(where);
  if (line > 0) absl::StrAppend(&text, ": line ", line);
  if (!path.empty()) absl::StrAppend(&text, ": ", std::string(path));
  absl::StrAppend(&text, ": ", std::string(what));
  return absl::InvalidArgumentError(text);
}

absl::Status ReadYamlInto(const YamlNode& node, google::protobuf::Message* msg,
                          std::string_view where, const std::string& path, FieldLines* lines) {
  return YamlToProto(where, lines).Message(node, msg, path);
}

}  // namespace stemma
