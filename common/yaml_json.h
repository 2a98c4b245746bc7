// YAML documents as a small tree, read with libyaml, and that tree as JSON text: what job
// files and engine spec files share.
//
// libyaml's scanner reads a 1,000-job file in ~2.5 ms where yaml-cpp took ~20 ms, and that
// parse sat on the critical path of every big `stemma submit`.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace stemma {

struct YamlNode {
  enum class Kind { kNull, kScalar, kSequence, kMapping };
  Kind kind = Kind::kNull;
  std::string scalar;  // kScalar: the text
  bool plain = true;   // kScalar: unquoted (may read as a number or boolean); false: a string
  int line = 0;        // 1-based line where the node starts
  // kSequence: the items; kMapping: key, value, key, value, ... in document order.
  std::vector<YamlNode> items;

  bool IsNull() const { return kind == Kind::kNull; }
  bool IsScalar() const { return kind == Kind::kScalar; }
  bool IsSequence() const { return kind == Kind::kSequence; }
  bool IsMap() const { return kind == Kind::kMapping; }
  // Mapping: the value for `key`, or null when there is none (or this is not a mapping).
  const YamlNode* Find(std::string_view key) const;
  // Mapping: number of entries; sequence: number of items.
  size_t size() const { return kind == Kind::kMapping ? items.size() / 2 : items.size(); }
};

// Bounds on what LoadYamlDocuments builds, so that a hostile file (an alias bomb, 100k
// levels of nesting) is refused at a cost linear in its size: at most kYamlNodesPerByte
// nodes per input byte (+ kYamlBaseNodes), counting every copy an alias makes (and a long
// scalar as one node per 16 bytes); kMaxYamlAliases aliases; kMaxYamlDepth levels.
inline constexpr size_t kYamlNodesPerByte = 4;
inline constexpr size_t kYamlBaseNodes = 100000;
inline constexpr size_t kMaxYamlAliases = 100000;
inline constexpr size_t kMaxYamlDepth = 128;

// Every document of a YAML stream (an empty document is a null node). Syntax errors are
// InvalidArgument "<source>: line L, column C: <problem>"; so are the bounds above and a
// key given twice in one mapping ("<source>: line L: duplicate key 'k' (first at line M)").
absl::StatusOr<std::vector<YamlNode>> LoadYamlDocuments(std::string_view text,
                                                        std::string_view source);

// Appends `node` to `out` as JSON. Quoted scalars stay strings; plain ones become numbers or
// booleans when they read as such; keys are always strings.
void AppendYamlAsJson(const YamlNode& node, std::string* out);

}  // namespace stemma
