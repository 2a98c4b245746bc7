#include "common/label_selector.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace stemma {
namespace {

bool KeyChar(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-' ||
         c == '/';
}
bool ValueChar(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
}

absl::Status Bad(absl::string_view req, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("selector: '", req, "': ", what));
}

absl::Status CheckKey(absl::string_view req, absl::string_view key) {
  if (key.empty()) return Bad(req, "no label key");
  if (key.size() > 253) return Bad(req, "the key is longer than 253 characters");
  if (!std::all_of(key.begin(), key.end(), KeyChar)) {
    return Bad(req, absl::StrCat("'", key, "' is not a label key (letters, digits, . _ - /)"));
  }
  return absl::OkStatus();
}

absl::Status CheckValue(absl::string_view req, absl::string_view value) {
  if (value.size() > 63) return Bad(req, "a value is longer than 63 characters");
  if (!std::all_of(value.begin(), value.end(), ValueChar)) {
    return Bad(req, absl::StrCat("'", value, "' is not a label value (letters, digits, . _ -)"));
  }
  return absl::OkStatus();
}

// Splits at commas outside parentheses.
absl::StatusOr<std::vector<std::string>> SplitTop(const std::string& text) {
  std::vector<std::string> parts;
  std::string cur;
  int depth = 0;
  for (char c : text) {
    if (c == '(') ++depth;
    if (c == ')' && --depth < 0) return Bad(text, "a ) without its (");
    if (c == ',' && depth == 0) {
      parts.push_back(cur);
      cur.clear();
      continue;
    }
    cur += c;
  }
  if (depth != 0) return Bad(text, "a ( without its )");
  parts.push_back(cur);
  return parts;
}

// `key in (a, b)` / `key notin (a, b)`; false when `req` is not of that form.
absl::StatusOr<bool> ParseSet(absl::string_view req, LabelSelector::Requirement* out) {
  const size_t open = req.find('(');
  if (open == absl::string_view::npos) return false;
  absl::string_view head = absl::StripTrailingAsciiWhitespace(req.substr(0, open));
  LabelSelector::Op op;
  if (absl::ConsumeSuffix(&head, " notin")) {
    op = LabelSelector::Op::kNotIn;
  } else if (absl::ConsumeSuffix(&head, " in")) {
    op = LabelSelector::Op::kIn;
  } else {
    return Bad(req, "expected 'KEY in (VALUES)' or 'KEY notin (VALUES)'");
  }
  if (req.back() != ')') return Bad(req, "text after the closing )");
  out->key = std::string(absl::StripAsciiWhitespace(head));
  out->op = op;
  if (absl::Status s = CheckKey(req, out->key); !s.ok()) return s;
  absl::string_view inner = req.substr(open + 1, req.size() - open - 2);
  for (absl::string_view v : absl::StrSplit(inner, ',')) {
    v = absl::StripAsciiWhitespace(v);
    if (v.empty()) return Bad(req, "an empty value in the set");
    if (absl::Status s = CheckValue(req, v); !s.ok()) return s;
    out->values.emplace_back(v);
  }
  return true;
}

absl::StatusOr<LabelSelector::Requirement> ParseOne(absl::string_view req) {
  LabelSelector::Requirement r;
  absl::StatusOr<bool> set = ParseSet(req, &r);
  if (!set.ok()) return set.status();
  if (*set) return r;
  size_t at;
  if ((at = req.find("!=")) != absl::string_view::npos) {
    r.op = LabelSelector::Op::kNotEquals;
    r.key = std::string(absl::StripAsciiWhitespace(req.substr(0, at)));
    r.values.emplace_back(absl::StripAsciiWhitespace(req.substr(at + 2)));
  } else if ((at = req.find('=')) != absl::string_view::npos) {
    r.op = LabelSelector::Op::kEquals;
    r.key = std::string(absl::StripAsciiWhitespace(req.substr(0, at)));
    absl::string_view value = req.substr(at + 1);
    if (absl::StartsWith(value, "=")) value.remove_prefix(1);  // k==v
    r.values.emplace_back(absl::StripAsciiWhitespace(value));
  } else if (absl::StartsWith(req, "!")) {
    r.op = LabelSelector::Op::kNotExists;
    r.key = std::string(absl::StripAsciiWhitespace(req.substr(1)));
  } else {
    r.op = LabelSelector::Op::kExists;
    r.key = std::string(req);
  }
  if (absl::Status s = CheckKey(req, r.key); !s.ok()) return s;
  for (const std::string& v : r.values) {
    if (absl::Status s = CheckValue(req, v); !s.ok()) return s;
  }
  return r;
}

}  // namespace

absl::StatusOr<LabelSelector> LabelSelector::Parse(const std::string& text) {
  LabelSelector selector;
  if (absl::StripAsciiWhitespace(text).empty()) return selector;
  absl::StatusOr<std::vector<std::string>> parts = SplitTop(text);
  if (!parts.ok()) return parts.status();
  for (const std::string& part : *parts) {
    absl::string_view req = absl::StripAsciiWhitespace(part);
    if (req.empty()) return Bad(text, "an empty requirement (two commas, or one at an end)");
    absl::StatusOr<Requirement> r = ParseOne(req);
    if (!r.ok()) return r.status();
    selector.requirements_.push_back(*std::move(r));
  }
  return selector;
}

template <typename MapT>
bool LabelSelector::MatchesMap(const MapT& labels) const {
  for (const Requirement& r : requirements_) {
    auto it = labels.find(r.key);
    const bool has = it != labels.end();
    const bool in =
        has && std::find(r.values.begin(), r.values.end(), it->second) != r.values.end();
    switch (r.op) {
      case Op::kEquals:
      case Op::kIn:
        if (!in) return false;
        break;
      case Op::kNotEquals:
      case Op::kNotIn:
        if (in) return false;
        break;
      case Op::kExists:
        if (!has) return false;
        break;
      case Op::kNotExists:
        if (has) return false;
        break;
    }
  }
  return true;
}

bool LabelSelector::Matches(const google::protobuf::Map<std::string, std::string>& labels) const {
  return MatchesMap(labels);
}

bool LabelSelector::Matches(const std::map<std::string, std::string>& labels) const {
  return MatchesMap(labels);
}

}  // namespace stemma
