// JSON-line events on stdout (docs/engine-events.md): one object per line with "event"
// first, flushed at once so the worker sees progress as it happens. Human logs go to stderr.
#pragma once

#include <cstdio>
#include <string>

#include "nlohmann/json.hpp"

namespace stemma::engine::train {

// Ordered, so that "event" stays the first key as the worker expects.
using Event = nlohmann::ordered_json;

// Writes `event` as one line; does nothing when !enabled (data-parallel ranks other than 0).
class EventWriter {
 public:
  explicit EventWriter(bool enabled, std::FILE* out = stdout) : enabled_(enabled), out_(out) {}
  void Emit(const Event& event) const {
    if (!enabled_) return;
    const std::string line = event.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
    std::fwrite(line.data(), 1, line.size(), out_);
    std::fputc('\n', out_);
    std::fflush(out_);
  }
  bool enabled() const { return enabled_; }

 private:
  bool enabled_;
  std::FILE* out_;
};

}  // namespace stemma::engine::train
