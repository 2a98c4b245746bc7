// YAML nodes as JSON text: what job files and engine spec files share. Include only from .cc
// files (it brings in yaml-cpp).
#pragma once

#include <yaml-cpp/yaml.h>

#include <string>

namespace stemma {

// Appends `node` to `out` as JSON. Quoted scalars stay strings; plain ones become numbers or
// booleans when they read as such; keys are always strings.
void AppendYamlAsJson(const YAML::Node& node, std::string* out);

}  // namespace stemma
