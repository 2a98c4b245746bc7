// One logging path: spdlog, with structured key=value fields in the message
// ("job=j-12 attempt=j-12.1 worker=w0"). Call InitLogging once in main.
#pragma once

#include <spdlog/spdlog.h>

#include <string>

namespace stemma {

// level: trace|debug|info|warn|error. `process` prefixes every line.
void InitLogging(const std::string& process, const std::string& level = "info");

}  // namespace stemma
