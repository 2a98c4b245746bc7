// -o jsonpath=TEMPLATE: kubectl's JSONPath subset over the JSON a command prints, and the
// durations flags take (--timeout 10m, --since 1h, --older-than 30d).
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "cli/output.h"
#include "common/status.h"

namespace stemma::cli {
namespace {

// One step of a path: a key, an index (negative from the end), or every element.
struct Step {
  enum Kind { kKey, kIndex, kAll } kind = kKey;
  std::string key;
  int64_t index = 0;
};

struct Node {
  enum Kind { kText, kPath, kRange } kind = kText;
  std::string text;        // kText
  std::vector<Step> path;  // kPath, kRange
  std::vector<Node> body;  // kRange
};

absl::Status Bad(const std::string& what) {
  return UsageError(absl::StrCat("-o jsonpath: ", what));
}

absl::StatusOr<std::vector<Step>> ParsePath(std::string expr) {
  std::vector<Step> steps;
  size_t i = 0;
  if (i < expr.size() && (expr[i] == '$' || expr[i] == '@')) ++i;
  while (i < expr.size()) {
    if (expr[i] == '.') {
      ++i;
      size_t end = i;
      while (end < expr.size() && expr[end] != '.' && expr[end] != '[') ++end;
      if (end == i) {
        if (i >= expr.size()) break;  // a trailing "." (the root itself: "{.}")
        return Bad(absl::StrCat("'", expr, "': '..' (recursive descent) is not supported"));
      }
      std::string key = expr.substr(i, end - i);
      if (key == "*") {
        steps.push_back({Step::kAll, "", 0});
      } else {
        steps.push_back({Step::kKey, key, 0});
      }
      i = end;
    } else if (expr[i] == '[') {
      size_t close = expr.find(']', i);
      if (close == std::string::npos) return Bad(absl::StrCat("'", expr, "': no closing ]"));
      std::string inner =
          std::string(absl::StripAsciiWhitespace(expr.substr(i + 1, close - i - 1)));
      int64_t n = 0;
      if (inner == "*") {
        steps.push_back({Step::kAll, "", 0});
      } else if (inner.size() >= 2 && (inner[0] == '\'' || inner[0] == '"') &&
                 inner.back() == inner[0]) {
        steps.push_back({Step::kKey, inner.substr(1, inner.size() - 2), 0});
      } else if (absl::SimpleAtoi(inner, &n)) {
        steps.push_back({Step::kIndex, "", n});
      } else {
        return Bad(
            absl::StrCat("'", expr, "': [", inner, "] is not supported (use [N], [*] or ['key'])"));
      }
      i = close + 1;
    } else {
      return Bad(absl::StrCat("'", expr, "': expected . or [ at '", expr.substr(i), "'"));
    }
  }
  return steps;
}

std::string Unescape(const std::string& text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\\' && i + 1 < text.size()) {
      const char c = text[++i];
      out += c == 'n' ? '\n' : c == 't' ? '\t' : c == 'r' ? '\r' : c;
    } else {
      out += text[i];
    }
  }
  return out;
}

// Parses nodes until `{end}` (when `in_range`) or the end of the template.
absl::StatusOr<std::vector<Node>> ParseNodes(const std::string& t, size_t* pos, bool in_range) {
  std::vector<Node> nodes;
  while (*pos < t.size()) {
    size_t open = t.find('{', *pos);
    if (open == std::string::npos) open = t.size();
    if (open > *pos) nodes.push_back({Node::kText, Unescape(t.substr(*pos, open - *pos)), {}, {}});
    if (open >= t.size()) break;
    size_t close = t.find('}', open);
    if (close == std::string::npos) return Bad("a { without its }");
    std::string expr =
        std::string(absl::StripAsciiWhitespace(t.substr(open + 1, close - open - 1)));
    *pos = close + 1;
    if (expr == "end") {
      if (!in_range) return Bad("{end} without {range}");
      return nodes;
    }
    if (expr.size() >= 2 && (expr[0] == '"' || expr[0] == '\'') && expr.back() == expr[0]) {
      nodes.push_back({Node::kText, Unescape(expr.substr(1, expr.size() - 2)), {}, {}});
    } else if (absl::StartsWith(expr, "range ")) {
      Node range{Node::kRange, "", {}, {}};
      ASSIGN_OR_RETURN(range.path,
                       ParsePath(std::string(absl::StripAsciiWhitespace(expr.substr(6)))));
      ASSIGN_OR_RETURN(range.body, ParseNodes(t, pos, true));
      nodes.push_back(std::move(range));
    } else if (!expr.empty() &&
               (expr[0] == '.' || expr[0] == '$' || expr[0] == '@' || expr[0] == '[')) {
      Node path{Node::kPath, "", {}, {}};
      ASSIGN_OR_RETURN(path.path, ParsePath(expr));
      nodes.push_back(std::move(path));
    } else {
      return Bad(absl::StrCat("{", expr, "}: expected a path such as {.items[*].id}"));
    }
  }
  if (in_range) return Bad("{range} without its {end}");
  return nodes;
}

void Select(const nlohmann::json& at, const std::vector<Step>& path, size_t i,
            std::vector<const nlohmann::json*>* out) {
  if (i == path.size()) {
    out->push_back(&at);
    return;
  }
  const Step& s = path[i];
  if (s.kind == Step::kKey) {
    if (!at.is_object()) return;
    auto it = at.find(s.key);
    if (it != at.end()) Select(*it, path, i + 1, out);
  } else if (s.kind == Step::kIndex) {
    if (!at.is_array()) return;
    const int64_t n = static_cast<int64_t>(at.size());
    const int64_t k = s.index < 0 ? n + s.index : s.index;
    if (k >= 0 && k < n) Select(at[static_cast<size_t>(k)], path, i + 1, out);
  } else if (at.is_array() || at.is_object()) {
    for (const auto& item : at) Select(item, path, i + 1, out);
  }
}

std::string Print(const nlohmann::json& v) {
  return v.is_string() ? v.get<std::string>() : v.dump();
}

void Render(const std::vector<Node>& nodes, const nlohmann::json& at, std::string* out) {
  for (const Node& n : nodes) {
    if (n.kind == Node::kText) {
      *out += n.text;
      continue;
    }
    std::vector<const nlohmann::json*> found;
    Select(at, n.path, 0, &found);
    if (n.kind == Node::kRange) {
      for (const nlohmann::json* item : found) Render(n.body, *item, out);
      continue;
    }
    for (size_t i = 0; i < found.size(); ++i) {
      if (i > 0) *out += " ";
      *out += Print(*found[i]);
    }
  }
}

}  // namespace

absl::StatusOr<std::string> ApplyJsonPath(const nlohmann::json& value,
                                          const std::string& template_text) {
  size_t pos = 0;
  ASSIGN_OR_RETURN(std::vector<Node> nodes, ParseNodes(template_text, &pos, false));
  std::string out;
  Render(nodes, value, &out);
  return out;
}

absl::StatusOr<double> ParseDurationSeconds(const std::string& text, const std::string& flag) {
  const std::string s(absl::StripAsciiWhitespace(text));
  double plain = 0;
  if (absl::SimpleAtod(s, &plain) && std::isfinite(plain) && plain >= 0) return plain;
  double total = 0;
  size_t i = 0;
  while (i < s.size()) {
    size_t end = i;
    while (end < s.size() &&
           (absl::ascii_isdigit(static_cast<unsigned char>(s[end])) || s[end] == '.'))
      ++end;
    double n = 0;
    if (end == i || !absl::SimpleAtod(s.substr(i, end - i), &n)) break;
    size_t unit_end = end;
    while (unit_end < s.size() && absl::ascii_isalpha(static_cast<unsigned char>(s[unit_end])))
      ++unit_end;
    const std::string unit = s.substr(end, unit_end - end);
    double scale = unit == "ms"  ? 0.001
                   : unit == "s" ? 1
                   : unit == "m" ? 60
                   : unit == "h" ? 3600
                   : unit == "d" ? 86400
                   : unit == "w" ? 604800
                                 : -1;
    if (scale < 0) break;
    total += n * scale;
    i = unit_end;
    if (i == s.size()) return total;
  }
  return UsageError(absl::StrCat(flag, ": '", text,
                                 "' is not a duration (seconds, or 500ms, 90s, 10m, 2h, 30d)"));
}

}  // namespace stemma::cli
