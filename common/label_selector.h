// Label selectors as kubectl writes them (`stemma ls -l family=slavic,size!=big`): a comma
// list of requirements that must all hold.
//
//   k=v, k==v   the label is there with value v
//   k!=v        the label is absent, or has another value
//   k in (a,b)  the label is there with one of the values
//   k notin (a,b)  the label is absent, or has none of the values
//   k           the label is there (any value)
//   !k          the label is absent
//
// Keys are 1-253 characters of [A-Za-z0-9._/-]; values up to 63 of [A-Za-z0-9._-] (may be
// empty for = and !=). Pure; a parsed selector is immutable and thread-safe.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "google/protobuf/map.h"

namespace stemma {

class LabelSelector {
 public:
  enum class Op { kEquals, kNotEquals, kIn, kNotIn, kExists, kNotExists };
  struct Requirement {
    std::string key;
    Op op;
    std::vector<std::string> values;  // one for = and !=, several for in / notin
  };

  // INVALID_ARGUMENT naming the requirement and what is wrong with it. "" selects all.
  static absl::StatusOr<LabelSelector> Parse(const std::string& text);

  bool Matches(const google::protobuf::Map<std::string, std::string>& labels) const;
  bool Matches(const std::map<std::string, std::string>& labels) const;
  bool empty() const { return requirements_.empty(); }
  const std::vector<Requirement>& requirements() const { return requirements_; }

 private:
  template <typename MapT>
  bool MatchesMap(const MapT& labels) const;
  std::vector<Requirement> requirements_;
};

}  // namespace stemma
