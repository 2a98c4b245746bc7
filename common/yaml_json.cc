#include "common/yaml_json.h"

#include <yaml.h>

#include <cstdio>
#include <cstring>
#include <map>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace stemma {
namespace {

const char kStrTag[] = "tag:yaml.org,2002:str";

bool IsStrTag(const yaml_char_t* tag) {
  return tag != nullptr && std::strcmp(reinterpret_cast<const char*>(tag), kStrTag) == 0;
}

YamlNode ScalarNode(const yaml_event_t& e) {
  YamlNode n;
  n.line = static_cast<int>(e.start_mark.line) + 1;
  const auto& s = e.data.scalar;
  std::string text(reinterpret_cast<const char*>(s.value), s.length);
  const bool plain = s.style == YAML_PLAIN_SCALAR_STYLE && !IsStrTag(s.tag);
  if (plain && s.tag == nullptr &&
      (text.empty() || text == "~" || text == "null" || text == "Null" || text == "NULL")) {
    return n;  // null
  }
  n.kind = YamlNode::Kind::kScalar;
  n.scalar = std::move(text);
  n.plain = plain;
  return n;
}

// Builds the documents from libyaml's event stream. Containers being filled are on a stack
// of pointers into their parent's `items` (or into `docs`); a parent never grows while a
// child is open, so the pointers stay valid.
//
// Bounds, so that refusing a hostile file costs time linear in its size: nesting depth,
// alias count, and a budget of nodes built (an alias costs the size of what it copies,
// and so does remembering an anchor) that is linear in the input.
class Builder {
 public:
  Builder(std::string_view text, std::string_view source)
      : text_(text),
        source_(source),
        node_budget_(kYamlNodesPerByte * text.size() + kYamlBaseNodes) {}

  absl::StatusOr<std::vector<YamlNode>> Run() {
    yaml_parser_t parser;
    if (!yaml_parser_initialize(&parser)) return absl::InternalError("libyaml: out of memory");
    yaml_parser_set_input_string(&parser, reinterpret_cast<const unsigned char*>(text_.data()),
                                 text_.size());
    absl::Status status;
    for (bool done = false; !done && status.ok();) {
      yaml_event_t e;
      if (!yaml_parser_parse(&parser, &e)) {
        status = absl::InvalidArgumentError(absl::StrCat(
            source_, ": line ", parser.problem_mark.line + 1, ", column ",
            parser.problem_mark.column + 1, ": ", parser.problem ? parser.problem : "syntax error",
            parser.context ? absl::StrCat(" (", parser.context, ")") : ""));
        break;
      }
      status = Handle(e, &done);
      yaml_event_delete(&e);
    }
    yaml_parser_delete(&parser);
    if (!status.ok()) return status;
    return std::move(docs_);
  }

 private:
  absl::Status Handle(const yaml_event_t& e, bool* done) {
    switch (e.type) {
      case YAML_STREAM_END_EVENT:
        *done = true;
        return absl::OkStatus();
      case YAML_DOCUMENT_START_EVENT:
        docs_.emplace_back();
        in_document_ = true;
        return absl::OkStatus();
      case YAML_DOCUMENT_END_EVENT:
        in_document_ = false;
        return absl::OkStatus();
      case YAML_SCALAR_EVENT: {
        const size_t weight = 1 + e.data.scalar.length / 16;
        RETURN_IF_ERROR(Charge(weight, e));
        YamlNode* n = Add(ScalarNode(e), weight);
        if (e.data.scalar.anchor != nullptr) {
          RETURN_IF_ERROR(Charge(weight, e));
          anchors_[reinterpret_cast<const char*>(e.data.scalar.anchor)] = {*n, weight};
        }
        return absl::OkStatus();
      }
      case YAML_SEQUENCE_START_EVENT:
      case YAML_MAPPING_START_EVENT: {
        if (stack_.size() >= kMaxYamlDepth) {
          return absl::InvalidArgumentError(absl::StrCat(source_, ": line ", e.start_mark.line + 1,
                                                         ": nested deeper than ", kMaxYamlDepth,
                                                         " levels"));
        }
        RETURN_IF_ERROR(Charge(1, e));
        YamlNode n;
        n.line = static_cast<int>(e.start_mark.line) + 1;
        const bool map = e.type == YAML_MAPPING_START_EVENT;
        n.kind = map ? YamlNode::Kind::kMapping : YamlNode::Kind::kSequence;
        const yaml_char_t* anchor =
            map ? e.data.mapping_start.anchor : e.data.sequence_start.anchor;
        stack_.push_back(Add(std::move(n), 1, /*opening=*/true));
        open_weights_.push_back(1);
        anchors_open_.push_back(anchor ? reinterpret_cast<const char*>(anchor) : "");
        return absl::OkStatus();
      }
      case YAML_SEQUENCE_END_EVENT:
      case YAML_MAPPING_END_EVENT: {
        YamlNode* closed = stack_.back();
        const size_t weight = open_weights_.back();
        stack_.pop_back();
        open_weights_.pop_back();
        if (!open_weights_.empty()) open_weights_.back() += weight;
        if (closed->IsMap()) RETURN_IF_ERROR(CheckDuplicateKeys(*closed));
        if (!anchors_open_.back().empty()) {
          RETURN_IF_ERROR(Charge(weight, e));
          anchors_[anchors_open_.back()] = {*closed, weight};
        }
        anchors_open_.pop_back();
        return absl::OkStatus();
      }
      case YAML_ALIAS_EVENT: {
        const std::string name = reinterpret_cast<const char*>(e.data.alias.anchor);
        auto it = anchors_.find(name);
        if (it == anchors_.end()) {
          return absl::InvalidArgumentError(
              absl::StrCat(source_, ": line ", e.start_mark.line + 1, ": unknown alias *", name));
        }
        if (++aliases_ > kMaxYamlAliases) {
          return absl::InvalidArgumentError(absl::StrCat(source_, ": line ", e.start_mark.line + 1,
                                                         ": more than ", kMaxYamlAliases,
                                                         " aliases"));
        }
        RETURN_IF_ERROR(Charge(it->second.weight, e));
        Add(it->second.node, it->second.weight)->line =
            static_cast<int>(e.start_mark.line) + 1;  // errors point here
        return absl::OkStatus();
      }
      default:
        return absl::OkStatus();
    }
  }

  // `weight`: the node's size in the budget's units (its nodes, and scalar bytes / 16),
  // added to the open parent's; a container that opens here is added when it closes.
  YamlNode* Add(YamlNode node, size_t weight, bool opening = false) {
    if (!opening && !open_weights_.empty()) open_weights_.back() += weight;
    if (stack_.empty()) {  // the document's root
      if (!in_document_) docs_.emplace_back();
      docs_.back() = std::move(node);
      return &docs_.back();
    }
    stack_.back()->items.push_back(std::move(node));
    return &stack_.back()->items.back();
  }

  absl::Status Charge(size_t weight, const yaml_event_t& e) {
    spent_ += weight;
    if (spent_ > node_budget_) {
      return absl::InvalidArgumentError(absl::StrCat(
          source_, ": line ", e.start_mark.line + 1, ": expands to more than ", node_budget_,
          " nodes (", kYamlNodesPerByte, " per input byte); aliases are bounded"));
    }
    return absl::OkStatus();
  }

  // A key twice in one mapping is refused: silently keeping the last value hides typos.
  absl::Status CheckDuplicateKeys(const YamlNode& map) {
    if (map.items.size() <= 2) return absl::OkStatus();
    absl::flat_hash_map<std::string_view, int> seen;
    seen.reserve(map.items.size() / 2);
    for (size_t i = 0; i + 1 < map.items.size(); i += 2) {
      const YamlNode& k = map.items[i];
      if (k.kind != YamlNode::Kind::kScalar) continue;
      auto [it, fresh] = seen.emplace(k.scalar, k.line);
      if (!fresh) {
        return absl::InvalidArgumentError(absl::StrCat(source_, ": line ", k.line,
                                                       ": duplicate key '", k.scalar,
                                                       "' (first at line ", it->second, ")"));
      }
    }
    return absl::OkStatus();
  }

  std::string_view text_;
  std::string source_;
  std::vector<YamlNode> docs_;
  std::vector<YamlNode*> stack_;
  std::vector<std::string> anchors_open_;  // parallel to stack_: "" when none
  std::vector<size_t> open_weights_;       // parallel to stack_: weight so far
  struct Anchor {
    YamlNode node;
    size_t weight = 1;
  };
  std::map<std::string, Anchor> anchors_;
  bool in_document_ = false;
  const size_t node_budget_;
  size_t spent_ = 0;
  size_t aliases_ = 0;
};

// The JSON number grammar: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
bool IsJsonNumber(const std::string& s) {
  size_t i = 0, n = s.size();
  auto digits = [&] {
    size_t start = i;
    while (i < n && s[i] >= '0' && s[i] <= '9') ++i;
    return i > start;
  };
  if (i < n && s[i] == '-') ++i;
  if (i < n && s[i] == '0') {
    ++i;
  } else if (!digits()) {
    return false;
  }
  if (i < n && s[i] == '.') {
    ++i;
    if (!digits()) return false;
  }
  if (i < n && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < n && (s[i] == '+' || s[i] == '-')) ++i;
    if (!digits()) return false;
  }
  return i == n;
}

void AppendString(const std::string& s, std::string* out) {
  *out += '"';
  for (char c : s) {
    switch (c) {
      case '"':
        *out += "\\\"";
        break;
      case '\\':
        *out += "\\\\";
        break;
      case '\n':
        *out += "\\n";
        break;
      case '\t':
        *out += "\\t";
        break;
      case '\r':
        *out += "\\r";
        break;
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
}

}  // namespace

const YamlNode* YamlNode::Find(std::string_view key) const {
  if (kind != Kind::kMapping) return nullptr;
  for (size_t i = 0; i + 1 < items.size(); i += 2) {
    if (items[i].kind == Kind::kScalar && items[i].scalar == key) return &items[i + 1];
  }
  return nullptr;
}

absl::StatusOr<std::vector<YamlNode>> LoadYamlDocuments(std::string_view text,
                                                        std::string_view source) {
  return Builder(text, source).Run();
}

void AppendYamlAsJson(const YamlNode& node, std::string* out) {
  switch (node.kind) {
    case YamlNode::Kind::kNull:
      *out += "null";
      return;
    case YamlNode::Kind::kScalar: {
      const std::string& s = node.scalar;
      if (node.plain) {
        if (s == "true" || s == "false") {
          *out += s;
          return;
        }
        if (IsJsonNumber(s)) {
          *out += s;
          return;
        }
      }
      AppendString(s, out);
      return;
    }
    case YamlNode::Kind::kSequence: {
      *out += '[';
      for (size_t i = 0; i < node.items.size(); ++i) {
        if (i > 0) *out += ',';
        AppendYamlAsJson(node.items[i], out);
      }
      *out += ']';
      return;
    }
    case YamlNode::Kind::kMapping: {
      *out += '{';
      for (size_t i = 0; i + 1 < node.items.size(); i += 2) {
        if (i > 0) *out += ',';
        AppendString(node.items[i].kind == YamlNode::Kind::kScalar ? node.items[i].scalar : "",
                     out);
        *out += ':';
        AppendYamlAsJson(node.items[i + 1], out);
      }
      *out += '}';
      return;
    }
  }
}

}  // namespace stemma
