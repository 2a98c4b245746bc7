// What an attempt's output says, read as it arrives: progress (STEMMA_PROGRESS lines and
// engine step events), metric points (step and metric events), published outputs and their
// artifacts (output events), and the engine's error line (common/engine_contract.h). Pure: no
// I/O, no clock, no lock; the executor keeps one per attempt under its own mutex and feeds it
// the bytes it reads from the attempt's pipe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "stemma/v1/job.pb.h"
#include "stemma/v1/worker_service.pb.h"

namespace stemma::worker {

struct AttemptOutput {
  // Past this many metric points further ones are counted in metrics_dropped, not kept.
  static constexpr size_t kMaxMetricPoints = 200000;

  // Feeds output bytes; complete lines are parsed, stamped with `wall_ms`. Lines that cannot
  // be structured (or longer than 4 KiB) are skipped as they arrive, without being kept.
  void Feed(const char* data, size_t n, int64_t wall_ms);

  uint64_t progress_version = 0;  // grows with each progress or step line
  v1::Progress progress;
  std::vector<v1::AttemptEvent::Metric> metrics;
  int64_t metrics_dropped = 0;
  std::map<std::string, std::string> outputs;   // output name → path (at most 64 names)
  std::vector<v1::OutputArtifact> artifacts;    // typed output events, first per name
  std::string engine_error;                     // text of the last "stemma-engine: error:" line

 private:
  void ParseLine(int64_t wall_ms);
  std::string line;  // the current line, while it may still be a structured one
  bool line_overflow = false;
};

}  // namespace stemma::worker
