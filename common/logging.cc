#include "common/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>

namespace stemma {

void InitLogging(const std::string& process, const std::string& level) {
  auto logger = spdlog::stderr_color_mt(process);
  logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%L%$ " + process + " %v");
  logger->set_level(spdlog::level::from_str(level));
  spdlog::set_default_logger(logger);
}

}  // namespace stemma
