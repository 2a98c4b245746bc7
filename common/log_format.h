// The JSON log format (`--log-format json` of the daemons), beside common/logging.h: one JSON
// object per line for log collectors,
//   {"time":"2026-12-02T09:30:00.123Z","level":"info","process":"worker","msg":"...",
//    "job":"j-12","attempt":"j-12.1"}
// with the well-known key=value fields of the message (job, attempt, worker, experiment,
// stage, method, reason, peer, subject, role) lifted into fields of their own.
#pragma once

#include <cstdint>
#include <string>

namespace stemma {

// Switches the default logger (after InitLogging) to `format`: "text" (the default) or
// "json". False for any other name.
bool SetLogFormat(const std::string& format);

// One log record as a line of the JSON format (without the newline).
std::string JsonLogLine(const std::string& process, const std::string& level, int64_t unix_ms,
                        const std::string& message);

}  // namespace stemma
