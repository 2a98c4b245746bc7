#include "worker/attempt_output.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string_view>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "common/engine_contract.h"
#include "common/engine_events.h"
#include "worker/event_scanner.h"

namespace stemma::worker {
namespace {

constexpr size_t kMaxLine = 4096;
constexpr absl::string_view kProgressPrefix = "STEMMA_PROGRESS ";
// stemma-engine's stdout contract (docs/engine-events.md): one JSON object per line with an
// "event" field, anywhere in the object (JSON writers may sort keys).
constexpr absl::string_view kEventPrefix = "{\"";
constexpr size_t kMaxOutputs = 64;
constexpr absl::string_view kEngineErrorPrefix(engine_contract::kErrorPrefix.data(),
                                               engine_contract::kErrorPrefix.size());

// True while `line` (plus the next char `c`) can still become one of the two kinds of line.
bool MayBeStructured(const std::string& line, char c) {
  auto fits = [&](absl::string_view prefix) {
    return line.size() >= prefix.size() ||
           (absl::StartsWith(prefix, line) && prefix[line.size()] == c);
  };
  return fits(kProgressPrefix) || fits(kEventPrefix) || fits(kEngineErrorPrefix);
}

constexpr const char* kStepMessageKeys[4] = {"loss", "lr", "grad_norm", "tokens_per_s"};

// A short human summary of a training step event: "loss 2.3415 lr 3.0e-04".
std::string StepMessage(const double (&values)[4]) {
  std::string message;
  for (int i = 0; i < 4; ++i) {
    if (std::isnan(values[i])) continue;
    if (!message.empty()) message += ' ';
    char buf[64];
    std::snprintf(buf, sizeof buf, "%s %.4g", kStepMessageKeys[i], values[i]);
    message += buf;
  }
  return message;
}
// A count from the wire (a double) as the int64 the protos hold, clamped.
int64_t ToInt64(double v) {
  if (!(v > -9.2e18)) return v < 0 ? INT64_MIN : 0;  // NaN: 0
  return v >= 9.2e18 ? INT64_MAX : static_cast<int64_t>(v);
}
}  // namespace

void MetricPoints::Add(std::string_view name, double value, int64_t step, int64_t time_ms) {
  auto it = name_ids_.find(name);
  if (it == name_ids_.end()) {
    it = name_ids_.emplace(name, static_cast<uint32_t>(names_.size())).first;
    names_.emplace_back(name);
  }
  name_.push_back(it->second);
  steps_.push_back(step);
  values_.push_back(value);
  times_ms_.push_back(time_ms);
  if (!label_.empty()) label_.push_back(0);
}

void MetricPoints::SetLastLabels(std::map<std::string, std::string> labels) {
  if (empty() || labels.empty()) return;
  label_.resize(size(), 0);
  label_sets_.push_back(std::move(labels));
  label_.back() = static_cast<uint32_t>(label_sets_.size());
}

MetricPoints::Point MetricPoints::At(size_t i) const {
  Point p;
  p.name = names_[name_[i]];
  p.value = values_[i];
  p.step = steps_[i];
  p.time_ms = times_ms_[i];
  if (!label_.empty() && label_[i] > 0) p.labels = label_sets_[label_[i] - 1];
  return p;
}

size_t MetricPoints::Batch(size_t from, size_t max, v1::AttemptEvent::MetricBatch* batch) const {
  if (from >= size()) return 0;
  const size_t end = from + std::min(max, size() - from);
  const size_t n = end - from;
  // Attempt-wide name and label-set ids -> this batch's (0: not in it yet).
  std::vector<uint32_t> batch_name(names_.size(), 0);
  batch->mutable_name_index()->Reserve(static_cast<int>(n));
  for (size_t i = from; i < end; ++i) {
    uint32_t& id = batch_name[name_[i]];
    if (id == 0) {
      batch->add_names(names_[name_[i]]);
      id = static_cast<uint32_t>(batch->names_size());
    }
    batch->add_name_index(id - 1);
  }
  batch->mutable_steps()->Add(steps_.begin() + from, steps_.begin() + end);
  batch->mutable_values()->Add(values_.begin() + from, values_.begin() + end);
  batch->mutable_times_ms()->Add(times_ms_.begin() + from, times_ms_.begin() + end);
  if (!label_.empty() &&
      std::any_of(label_.begin() + from, label_.begin() + end, [](uint32_t l) { return l > 0; })) {
    std::vector<uint32_t> batch_set(label_sets_.size() + 1, 0);
    batch->mutable_label_index()->Reserve(static_cast<int>(n));
    for (size_t i = from; i < end; ++i) {
      const uint32_t l = label_[i];
      if (l == 0) {
        batch->add_label_index(0);
        continue;
      }
      if (batch_set[l] == 0) {
        auto* set = batch->add_label_sets()->mutable_labels();
        for (const auto& [k, v] : label_sets_[l - 1]) (*set)[k] = v;
        batch_set[l] = static_cast<uint32_t>(batch->label_sets_size());
      }
      batch->add_label_index(batch_set[l]);
    }
  }
  return n;
}

void AttemptOutput::Feed(const char* data, size_t n, int64_t wall_ms) {
  while (n > 0) {
    const char* nl = static_cast<const char*>(std::memchr(data, '\n', n));
    const size_t part = nl == nullptr ? n : static_cast<size_t>(nl - data);
    if (!line_overflow) AddToLine(data, part);
    if (nl == nullptr) return;
    if (!line_overflow) ParseLine(wall_ms);
    line.clear();
    line_overflow = false;
    data += part + 1;
    n -= part + 1;
  }
}

void AttemptOutput::AddToLine(const char* data, size_t n) {
  // Only lines that may be progress or event lines are worth keeping: the first bytes decide
  // (MayBeStructured), the rest goes in whole up to kMaxLine.
  size_t i = 0;
  for (; i < n && line.size() < kEngineErrorPrefix.size(); ++i) {
    if (line.size() >= kMaxLine || !MayBeStructured(line, data[i])) {
      line_overflow = true;
      line.clear();
      return;
    }
    line.push_back(data[i]);
  }
  if (i == n) return;
  if (line.size() + (n - i) > kMaxLine) {
    line_overflow = true;
    line.clear();
    return;
  }
  line.append(data + i, n - i);
}

const v1::Progress& AttemptOutput::progress() const {
  if (step_message_pending_) {
    progress_.set_message(StepMessage(step_values_));
    step_message_pending_ = false;
  }
  return progress_;
}

void AttemptOutput::ParseLine(int64_t wall_ms) {
  if (absl::StartsWith(line, kEngineErrorPrefix)) {
    engine_error = line.substr(kEngineErrorPrefix.size());
    return;
  }
  const bool legacy = absl::StartsWith(line, kProgressPrefix);
  if (!legacy && !absl::StartsWith(line, kEventPrefix)) return;
  std::string_view text(line);
  if (legacy) text.remove_prefix(kProgressPrefix.size());
  // The scanner takes the flat lines (most of them); the schema's reader the rest.
  if (!ScanEngineEvent(text, &event_)) {
    absl::StatusOr<v1::EngineEvent> parsed = ParseEngineEvent(text);
    if (!parsed.ok()) return;
    event_ = std::move(*parsed);
  }
  if (legacy) event_.set_event(std::string(engine_contract::kEventProgress));
  Apply(event_, wall_ms);
}

void AttemptOutput::Apply(const v1::EngineEvent& e, int64_t wall_ms) {
  const std::string& event = e.event();
  if (event == engine_contract::kEventOutput) {
    ApplyOutput(e);
    return;
  }
  if (event == engine_contract::kEventCheckpoint) {
    if (!e.has_step()) return;
    if (metrics.size() >= kMaxMetricPoints) {
      ++metrics_dropped;
      return;
    }
    const int64_t step = ToInt64(e.step());
    metrics.Add(engine_contract::kCheckpointStepSeries, static_cast<double>(step), step, wall_ms);
    return;
  }
  const bool step_event = event == engine_contract::kEventStep;
  if (event == engine_contract::kEventMetric || step_event) {
    const int64_t step = e.has_step() ? ToInt64(e.step()) : 0;
    auto add = [&](const std::string& name, double value) {
      if (!std::isfinite(value)) return false;
      if (metrics.size() >= kMaxMetricPoints) {
        ++metrics_dropped;
        return false;
      }
      metrics.Add(name, value, step, wall_ms);
      return true;
    };
    if (!step_event) {
      if (e.has_value() && !e.name().empty() && e.name().size() <= 200 &&
          add(e.name(), e.value()) && !e.labels().empty()) {
        std::map<std::string, std::string> labels(e.labels().begin(), e.labels().end());
        while (labels.size() > 16) labels.erase(std::prev(labels.end()));
        metrics.SetLastLabels(std::move(labels));
      }
      return;
    }
    // A step event: each of its series (every number but the step counters) is a metric.
    for (const v1::EngineEvent::Series& s : e.series()) add(s.name(), s.value());
  }
  if (event != engine_contract::kEventProgress && !step_event) return;
  v1::Progress p;
  if (e.has_fraction()) {
    p.set_fraction(e.fraction());
  } else if (e.has_step() && e.has_total_steps() && e.total_steps() > 0) {
    p.set_fraction(std::clamp(e.step() / e.total_steps(), 0.0, 1.0));
  }
  step_message_pending_ = false;
  if (!e.message().empty()) {
    p.set_message(e.message());
  } else if (step_event) {
    for (int i = 0; i < 4; ++i) step_values_[i] = NAN;
    for (const v1::EngineEvent::Series& s : e.series()) {
      for (int i = 0; i < 4; ++i) {
        if (s.name() == kStepMessageKeys[i]) step_values_[i] = s.value();
      }
    }
    step_message_pending_ = true;
  }
  if (e.has_step()) p.set_step(ToInt64(e.step()));
  progress_ = std::move(p);
  ++progress_version;
}

void AttemptOutput::ApplyOutput(const v1::EngineEvent& e) {
  if (e.name().empty() || e.path().empty()) return;
  const bool fresh = outputs.count(e.name()) == 0;
  if (fresh && outputs.size() >= kMaxOutputs) return;
  outputs[e.name()] = e.path();
  if (!fresh || e.type().empty()) return;
  // The first typed event of each name is the artifact the registry records.
  v1::OutputArtifact art;
  art.set_name(e.name());
  art.set_path(e.path());
  art.set_type(e.type());
  art.set_manifest_sha256(e.manifest_sha256());
  art.set_operation(e.operation());
  if (e.has_bytes()) art.set_bytes(ToInt64(e.bytes()));
  for (const std::string& parent : e.parents()) {
    if (art.parents_size() < 64) art.add_parents(parent);
  }
  artifacts.push_back(std::move(art));
}

}  // namespace stemma::worker
