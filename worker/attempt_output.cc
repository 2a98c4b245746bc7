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
        return;
      }
      v1::AttemptEvent::Metric m;
      m.set_name(name);
      m.set_value(value);
      m.set_step(step);
      m.set_time_ms(wall);
      metrics.push_back(std::move(m));
    };
    const auto* step_field = number("step");
    const int64_t step = step_field != nullptr ? step_field->get<int64_t>() : 0;
    if (event == "metric") {
      const std::string* name = string("name");
      const auto* value = number("value");
      if (name != nullptr && value != nullptr && !name->empty() && name->size() <= 200) {
        add(*name, value->get<double>(), step);
        if (auto it = j.find("labels"); it != j.end() && it->is_object() && !metrics.empty() &&
            metrics.back().name() == *name) {
          auto* labels = metrics.back().mutable_labels();
          for (const auto& [k, v] : it->items()) {
            if (v.is_string() && labels->size() < 16) (*labels)[k] = v.get<std::string>();
          }
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
