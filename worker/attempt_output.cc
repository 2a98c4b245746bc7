#include "worker/attempt_output.h"

#include <algorithm>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "common/engine_contract.h"

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

// A short human summary of a training step event: "loss 2.3415 lr 3.0e-04".
std::string StepMessage(const nlohmann::json& j) {
  std::string message;
  for (const char* key : {"loss", "lr", "grad_norm", "tokens_per_s"}) {
    auto v = j.find(key);
    if (v == j.end() || !v->is_number()) continue;
    if (!message.empty()) message += ' ';
    char buf[64];
    std::snprintf(buf, sizeof buf, "%s %.4g", key, v->get<double>());
    message += buf;
  }
  return message;
}
}  // namespace

void MetricPoints::Add(const std::string& name, double value, int64_t step, int64_t time_ms) {
  auto it = name_ids_.find(name);
  if (it == name_ids_.end()) {
    it = name_ids_.emplace(name, static_cast<uint32_t>(names_.size())).first;
    names_.push_back(name);
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

size_t MetricPoints::Batch(size_t from, size_t max,
                           v1::AttemptEvent::MetricBatch* batch) const {
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
  for (size_t i = 0; i < n; ++i) {
    const char c = data[i];
    if (c == '\n') {
      if (!line_overflow) ParseLine(wall_ms);
      line.clear();
      line_overflow = false;
    } else if (!line_overflow) {
      // Only lines that may be progress or event lines are worth keeping.
      if (line.size() >= kMaxLine || !MayBeStructured(line, c)) {
        line_overflow = true;
        line.clear();
      } else {
        line.push_back(c);
      }
    }
  }
}

void AttemptOutput::ParseLine(int64_t wall_ms) {
  if (absl::StartsWith(line, kEngineErrorPrefix)) {
    engine_error = line.substr(kEngineErrorPrefix.size());
    return;
  }
  const bool legacy = absl::StartsWith(line, kProgressPrefix);
  if (!legacy && !absl::StartsWith(line, kEventPrefix)) return;
  nlohmann::json j =
      nlohmann::json::parse(legacy ? line.substr(kProgressPrefix.size()) : line, nullptr,
                            /*allow_exceptions=*/false);
  if (!j.is_object()) return;
  auto number = [&](const char* key) -> const nlohmann::json* {
    auto it = j.find(key);
    return it != j.end() && it->is_number() ? &*it : nullptr;
  };
  auto string = [&](const char* key) -> const std::string* {
    auto it = j.find(key);
    return it != j.end() && it->is_string() ? it->get_ptr<const std::string*>() : nullptr;
  };
  std::string event = legacy ? "progress" : (string("event") ? *string("event") : "");
  if (event == "output") {
    const std::string* name = string("name");
    const std::string* path = string("path");
    if (name != nullptr && path != nullptr &&
        (outputs.size() < kMaxOutputs || outputs.count(*name) > 0)) {
      const bool fresh = outputs.count(*name) == 0;
      outputs[*name] = *path;
      if (const std::string* type = string("type"); type != nullptr && fresh) {
        v1::OutputArtifact art;
        art.set_name(*name);
        art.set_path(*path);
        art.set_type(*type);
        if (const std::string* h = string("manifest_sha256")) art.set_manifest_sha256(*h);
        if (const std::string* op = string("operation")) art.set_operation(*op);
        if (const auto* bytes = number("bytes")) art.set_bytes(bytes->get<int64_t>());
        if (auto it = j.find("parents"); it != j.end() && it->is_array()) {
          for (const auto& p : *it) {
            if (p.is_string() && art.parents_size() < 64) art.add_parents(p.get<std::string>());
          }
        }
        artifacts.push_back(std::move(art));
      }
    }
    return;
  }
  if (event == "metric" || event == "step") {
    const int64_t wall = wall_ms;
    auto add = [&](const std::string& name, double value, int64_t step) {
      if (metrics.size() >= kMaxMetricPoints) {
        ++metrics_dropped;
        return false;
      }
      metrics.Add(name, value, step, wall);
      return true;
    };
    const auto* step_field = number("step");
    const int64_t step = step_field != nullptr ? step_field->get<int64_t>() : 0;
    if (event == "metric") {
      const std::string* name = string("name");
      const auto* value = number("value");
      if (name != nullptr && value != nullptr && !name->empty() && name->size() <= 200) {
        const bool added = add(*name, value->get<double>(), step);
        if (auto it = j.find("labels"); added && it != j.end() && it->is_object()) {
          std::map<std::string, std::string> labels;
          for (const auto& [k, v] : it->items()) {
            if (v.is_string() && labels.size() < 16) labels[k] = v.get<std::string>();
          }
          metrics.SetLastLabels(std::move(labels));
        }
      }
      return;
    }
    // A step event: every number but the step counters is a series of its own.
    for (const auto& [key, value] : j.items()) {
      if (!value.is_number() || key == "step" || key == "total_steps") continue;
      add(key, value.get<double>(), step);
    }
  }
  if (event != "progress" && event != "step") return;
  v1::Progress p;
  if (const auto* f = number("fraction")) {
    p.set_fraction(f->get<double>());
  } else if (const auto* step = number("step"), *total = number("total_steps");
             step != nullptr && total != nullptr && total->get<double>() > 0) {
    p.set_fraction(std::clamp(step->get<double>() / total->get<double>(), 0.0, 1.0));
  }
  if (const std::string* m = string("message")) {
    p.set_message(*m);
  } else if (event == "step") {
    p.set_message(StepMessage(j));
  }
  if (const auto* step = number("step")) p.set_step(step->get<int64_t>());
  progress = std::move(p);
  ++progress_version;
}

}  // namespace stemma::worker
