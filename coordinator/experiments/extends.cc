#include "coordinator/experiments/extends.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/proto_yaml.h"
#include "common/status.h"

namespace stemma::experiments {
namespace {

constexpr int kMaxDepth = 8;

absl::StatusOr<YamlNode> Resolve(const YamlNode& root, std::string_view file,
                                 const std::map<std::string, std::string>& imports,
                                 std::vector<std::string>* chain) {
  const YamlNode* extends = root.Find("extends");
  if (extends == nullptr) return root;
  if (!extends->IsScalar() || extends->scalar.empty())
    return SpecError(file, extends->line, "extends", "must be the name of one experiment file");
  if (extends->scalar.find("${{") != std::string::npos)
    return SpecError(file, extends->line, "extends", "expressions are not evaluated here");
  const std::string& name = extends->scalar;
  for (const std::string& seen : *chain) {
    if (seen == name) {
      chain->push_back(name);
      return SpecError(
          file, extends->line, "extends",
          absl::StrCat("the files extend each other: ", absl::StrJoin(*chain, " -> ")));
    }
  }
  if (chain->size() > kMaxDepth)
    return SpecError(file, extends->line, "extends",
                     absl::StrCat("files extend each other more than ", kMaxDepth, " deep"));
  auto text = imports.find(name);
  if (text == imports.end()) {
    return SpecError(file, extends->line, "extends",
                     absl::StrCat("'", name,
                                  "' was not sent with the file (`stemma plan` and `stemma sweep` "
                                  "read it relative to the experiment file)"));
  }
  ASSIGN_OR_RETURN(std::vector<YamlNode> docs, LoadYamlDocuments(text->second, name));
  if (docs.size() != 1 || !docs[0].IsMap())
    return SpecError(file, extends->line, "extends",
                     absl::StrCat("'", name, "' is not one experiment file (one mapping)"));
  chain->push_back(name);
  ASSIGN_OR_RETURN(YamlNode base, Resolve(docs[0], name, imports, chain));
  YamlNode over = root;
  over.items.clear();
  for (size_t k = 0; k + 1 < root.items.size(); k += 2) {
    if (root.items[k].scalar == "extends") continue;
    over.items.push_back(root.items[k]);
    over.items.push_back(root.items[k + 1]);
  }
  return MergeYaml(base, over);
}

}  // namespace

YamlNode MergeYaml(const YamlNode& base, const YamlNode& over) {
  if (!base.IsMap() || !over.IsMap()) return over;
  YamlNode out = base;
  out.items.clear();
  for (size_t k = 0; k + 1 < base.items.size(); k += 2) {
    const YamlNode* o = over.Find(base.items[k].scalar);
    if (o != nullptr && o->IsNull()) continue;  // deleted
    out.items.push_back(base.items[k]);
    out.items.push_back(o == nullptr ? base.items[k + 1] : MergeYaml(base.items[k + 1], *o));
  }
  for (size_t k = 0; k + 1 < over.items.size(); k += 2) {
    if (base.Find(over.items[k].scalar) != nullptr || over.items[k + 1].IsNull()) continue;
    out.items.push_back(over.items[k]);
    out.items.push_back(over.items[k + 1]);
  }
  return out;
}

absl::Status RefuseExpressions(const YamlNode& node, std::string_view file,
                               const std::string& path) {
  if (node.IsScalar()) {
    if (node.scalar.find("${{") == std::string::npos) return absl::OkStatus();
    return SpecError(file, node.line, path,
                     absl::StrCat("expressions are not evaluated here ('", node.scalar,
                                  "'); they are in vars, matrix values, needs' where, include, "
                                  "exclude and the job's fields"));
  }
  for (size_t i = 0; i < node.items.size(); ++i) {
    std::string sub = path;
    if (node.IsMap()) {
      if (i % 2 == 0) {
        RETURN_IF_ERROR(RefuseExpressions(node.items[i], file, path));  // a key
        continue;
      }
      sub = absl::StrCat(path, ".", node.items[i - 1].scalar);
    } else {
      sub = absl::StrCat(path, "[", i, "]");
    }
    RETURN_IF_ERROR(RefuseExpressions(node.items[i], file, sub));
  }
  return absl::OkStatus();
}

absl::StatusOr<YamlNode> ResolveExtends(const YamlNode& root, std::string_view file,
                                        const std::map<std::string, std::string>& imports) {
  // The chain holds the names the files give each other (the file itself is named by the
  // client, perhaps by another path: a cycle through it shows one step later).
  std::vector<std::string> chain;
  return Resolve(root, file, imports, &chain);
}

}  // namespace stemma::experiments
