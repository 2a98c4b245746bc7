#include "common/logging.h"

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_color_sinks.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <memory>
#include <nlohmann/json.hpp>

#include "common/log_format.h"

namespace stemma {
namespace {

// key=value fields of a message that become JSON fields of their own (bounded: names the
// code uses, not whatever a message happens to contain).
constexpr const char* kLiftedFields[] = {"job",    "attempt", "worker", "experiment", "stage",
                                         "method", "reason",  "peer",   "subject",    "role"};

bool IsLifted(const std::string& key) {
  for (const char* k : kLiftedFields) {
    if (key == k) return true;
  }
  return false;
}

class JsonFormatter final : public spdlog::formatter {
 public:
  explicit JsonFormatter(std::string process) : process_(std::move(process)) {}

  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    const int64_t ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(msg.time.time_since_epoch()).count();
    const auto level = spdlog::level::to_string_view(msg.level);
    const std::string line = JsonLogLine(process_, std::string(level.data(), level.size()), ms,
                                         std::string(msg.payload.data(), msg.payload.size()));
    dest.append(line.data(), line.data() + line.size());
    dest.push_back('\n');
  }

  std::unique_ptr<spdlog::formatter> clone() const override {
    return std::make_unique<JsonFormatter>(process_);
  }

 private:
  const std::string process_;
};

}  // namespace

std::string JsonLogLine(const std::string& process, const std::string& level, int64_t unix_ms,
                        const std::string& message) {
  const std::time_t seconds = static_cast<std::time_t>(unix_ms / 1000);
  std::tm tm{};
  gmtime_r(&seconds, &tm);
  char stamp[40];
  std::snprintf(stamp, sizeof stamp, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                static_cast<int>(unix_ms % 1000));
  // nlohmann sorts keys: build the object in the order a reader expects by hand.
  nlohmann::ordered_json j;
  j["time"] = stamp;
  j["level"] = level;
  j["process"] = process;
  j["msg"] = message;
  size_t pos = 0;
  while (pos < message.size()) {
    const size_t end = message.find(' ', pos);
    const std::string token = message.substr(pos, end == std::string::npos ? end : end - pos);
    pos = end == std::string::npos ? message.size() : end + 1;
    const size_t eq = token.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == token.size()) continue;
    const std::string key = token.substr(0, eq);
    std::string value = token.substr(eq + 1);
    while (!value.empty() && (value.back() == ',' || value.back() == ':' || value.back() == ';')) {
      value.pop_back();
    }
    if (IsLifted(key) && !j.contains(key) && !value.empty()) j[key] = value;
  }
  // Bytes that are not UTF-8 (a path, a child's output) are replaced rather than thrown on.
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

void InitLogging(const std::string& process, const std::string& level) {
  auto logger = spdlog::stderr_color_mt(process);
  logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%L%$ " + process + " %v");
  logger->set_level(spdlog::level::from_str(level));
  spdlog::set_default_logger(logger);
}

bool SetLogFormat(const std::string& format) {
  if (format == "text") return true;
  if (format != "json") return false;
  const std::shared_ptr<spdlog::logger> logger = spdlog::default_logger();
  logger->set_formatter(std::make_unique<JsonFormatter>(logger->name()));
  return true;
}

}  // namespace stemma
