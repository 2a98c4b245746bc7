// The YAML reader every file goes through (job files, engine specs, config.json), and the
// JSON text it makes of a tree.
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/yaml_json.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto docs = stemma::LoadYamlDocuments(text, "fuzz.yaml");
  if (!docs.ok()) return 0;
  std::string json;
  for (const auto& doc : *docs) stemma::AppendYamlAsJson(doc, &json);
  return 0;
}
