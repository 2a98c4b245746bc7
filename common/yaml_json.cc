#include "common/yaml_json.h"

#include <cstdio>
#include <cstdlib>

namespace stemma {

// YAML scalar → JSON value. Quoted scalars stay strings; plain ones become numbers or
// booleans when they read as such (protobuf's JSON parser accepts numbers as strings too).
void AppendYamlAsJson(const YAML::Node& node, std::string* out) {
  switch (node.Type()) {
    case YAML::NodeType::Null:
      *out += "null";
      return;
    case YAML::NodeType::Scalar: {
      const std::string& s = node.Scalar();
      if (node.Tag() != "!") {  // plain (unquoted)
        if (s == "true" || s == "false") {
          *out += s;
          return;
        }
        char* end = nullptr;
        std::strtod(s.c_str(), &end);
        if (!s.empty() && end == s.c_str() + s.size() && s != "." && s != "-") {
          *out += s;
          return;
        }
      }
      *out += '"';
      for (char c : s) {
        switch (c) {
          case '"': *out += "\\\""; break;
          case '\\': *out += "\\\\"; break;
          case '\n': *out += "\\n"; break;
          case '\t': *out += "\\t"; break;
          case '\r': *out += "\\r"; break;
          default:
            if (static_cast<unsigned char>(c) < 0x20) {
              char buf[8];
              std::snprintf(buf, sizeof buf, "\\u%04x", c);
              *out += buf;
            } else {
              *out += c;
            }
        }
      }
      *out += '"';
      return;
    }
    case YAML::NodeType::Sequence: {
      *out += '[';
      bool first = true;
      for (const auto& item : node) {
        if (!first) *out += ',';
        first = false;
        AppendYamlAsJson(item, out);
      }
      *out += ']';
      return;
    }
    case YAML::NodeType::Map: {
      *out += '{';
      bool first = true;
      for (const auto& kv : node) {
        if (!first) *out += ',';
        first = false;
        YAML::Node key = kv.first;
        key.SetTag("!");  // keys are always strings
        AppendYamlAsJson(key, out);
        *out += ':';
        AppendYamlAsJson(kv.second, out);
      }
      *out += '}';
      return;
    }
    default:
      *out += "null";
  }
}

}  // namespace stemma
