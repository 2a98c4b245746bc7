// What an attempt's output says, read as it arrives: progress (STEMMA_PROGRESS lines and
// engine step events), metric points (step and metric events), published outputs and their
// artifacts (output events), and the engine's error line (common/engine_contract.h). Event
// lines are read as v1::EngineEvent (stemma/v1/engine_event.proto). Pure: no
// I/O, no clock, no lock; the executor keeps one per attempt under its own mutex and feeds it
// the bytes it reads from the attempt's pipe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "stemma/v1/engine_event.pb.h"
#include "stemma/v1/job.pb.h"
#include "stemma/v1/worker_service.pb.h"

namespace stemma::worker {

// The metric points of one attempt, packed: names interned once, a column per field. A
// point costs ~28 bytes here and leaves as part of one MetricBatch, not as a message of its
// own.
class MetricPoints {
 public:
  struct Point {  // one point, expanded (tests, logs)
    std::string name;
    double value = 0;
    int64_t step = 0;
    int64_t time_ms = 0;
    std::map<std::string, std::string> labels;
  };

  size_t size() const { return steps_.size(); }
  bool empty() const { return steps_.empty(); }
  void Add(std::string_view name, double value, int64_t step, int64_t time_ms);
  // Gives the last point added these labels.
  void SetLastLabels(std::map<std::string, std::string> labels);
  Point At(size_t i) const;
  // Appends points [from, from + max) to `batch` (empty on entry), names and label sets
  // interned per batch; returns how many.
  size_t Batch(size_t from, size_t max, v1::AttemptEvent::MetricBatch* batch) const;

 private:
  std::vector<std::string> names_;
  std::map<std::string, uint32_t, std::less<>> name_ids_;
  std::vector<uint32_t> name_;
  std::vector<int64_t> steps_;
  std::vector<double> values_;
  std::vector<int64_t> times_ms_;
  std::vector<std::map<std::string, std::string>> label_sets_;
  std::vector<uint32_t> label_;  // per point (0: none, k: label_sets_[k - 1]); empty until needed
};

struct AttemptOutput {
  // Past this many metric points further ones are counted in metrics_dropped, not kept.
  static constexpr size_t kMaxMetricPoints = 200000;

  // Feeds output bytes; complete lines are parsed, stamped with `wall_ms`. Lines that cannot
  // be structured (or longer than 4 KiB) are skipped as they arrive, without being kept.
  void Feed(const char* data, size_t n, int64_t wall_ms);

  uint64_t progress_version = 0;  // grows with each progress or step line
  // The latest progress (a step line's message is written when asked for: formatting it for
  // every line cost more than the rest of the line's parsing).
  const v1::Progress& progress() const;
  MetricPoints metrics;
  int64_t metrics_dropped = 0;
  std::map<std::string, std::string> outputs;  // output name → path (at most 64 names)
  std::vector<v1::OutputArtifact> artifacts;   // typed output events, first per name
  std::string engine_error;                    // text of the last "stemma-engine: error:" line

 private:
  // Reads the current line (through worker/event_scanner.h, else the schema's reader,
  // common/engine_events.h) and applies the event it holds.
  void ParseLine(int64_t wall_ms);
  void Apply(const v1::EngineEvent& event, int64_t wall_ms);
  void ApplyOutput(const v1::EngineEvent& event);
  // Adds bytes of the current line (no newline among them).
  void AddToLine(const char* data, size_t n);
  std::string line;        // the current line, while it may still be a structured one
  v1::EngineEvent event_;  // the current line's event (kept: its fields' memory is reused)
  bool line_overflow = false;
  mutable v1::Progress progress_;
  // The last step line's loss, lr, grad_norm, tokens_per_s (NaN: absent), while its message
  // is still to be written into progress_.
  mutable bool step_message_pending_ = false;
  double step_values_[4] = {0, 0, 0, 0};
};

}  // namespace stemma::worker
