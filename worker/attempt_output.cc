#include "worker/attempt_output.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string_view>

#include "absl/strings/ascii.h"
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

// One event line's top-level fields, sorted by key (as nlohmann's objects iterate). Filled by
// a scanner for flat objects of plain strings and numbers (what step and metric lines are:
// ~10x cheaper than building a DOM), or from a parsed DOM for anything else.
class EventFields {
 public:
  struct Field {
    std::string_view key;
    bool is_number = false, is_string = false;
    double number = 0;
    int64_t integer = 0;
    std::string_view text;                 // a string's value
    const nlohmann::json* json = nullptr;  // the value in the DOM (DOM path only)
  };

  // False when `text` is not a flat object this scanner takes (escapes, nesting, ...).
  bool Scan(std::string_view text) {
    size_t i = 0;
    auto ws = [&] {
      while (i < text.size() && (text[i] == ' ' || text[i] == '\t' || text[i] == '\r')) ++i;
    };
    auto plain_string = [&](std::string_view* out) {
      if (i >= text.size() || text[i] != '"') return false;
      const size_t from = ++i;
      while (i < text.size() && text[i] != '"') {
        if (text[i] == '\\' || static_cast<unsigned char>(text[i]) < 0x20) return false;
        ++i;
      }
      if (i >= text.size()) return false;
      *out = text.substr(from, i - from);
      ++i;
      return true;
    };
    ws();
    if (i >= text.size() || text[i++] != '{') return false;
    ws();
    if (i < text.size() && text[i] == '}') {
      ++i;
    } else {
      for (;;) {
        Field f;
        ws();
        if (!plain_string(&f.key)) return false;
        ws();
        if (i >= text.size() || text[i++] != ':') return false;
        ws();
        if (i >= text.size()) return false;
        const char c = text[i];
        if (c == '"') {
          if (!plain_string(&f.text)) return false;
          f.is_string = true;
        } else if (c == '-' || (c >= '0' && c <= '9')) {
          const size_t from = i;
          bool integral = true;
          while (i < text.size() &&
                 (absl::ascii_isdigit(static_cast<unsigned char>(text[i])) || text[i] == '-' ||
                  text[i] == '+' || text[i] == '.' || text[i] == 'e' || text[i] == 'E')) {
            integral &= text[i] != '.' && text[i] != 'e' && text[i] != 'E';
            ++i;
          }
          const char* b = text.data() + from;
          const char* e = text.data() + i;
          auto r = std::from_chars(b, e, f.number);
          if (r.ec != std::errc() || r.ptr != e) return false;
          if (!integral || std::from_chars(b, e, f.integer).ec != std::errc()) {
            f.integer = f.number >= 9.2e18    ? INT64_MAX
                        : f.number <= -9.2e18 ? INT64_MIN
                                              : static_cast<int64_t>(f.number);
          }
          f.is_number = true;
        } else if (text.substr(i, 4) == "true" || text.substr(i, 4) == "null") {
          i += 4;
        } else if (text.substr(i, 5) == "false") {
          i += 5;
        } else {
          return false;  // an object or an array: the DOM takes it
        }
        fields_.push_back(f);
        ws();
        if (i < text.size() && text[i] == ',') {
          ++i;
          continue;
        }
        if (i < text.size() && text[i] == '}') {
          ++i;
          break;
        }
        return false;
      }
    }
    ws();
    if (i != text.size()) return false;
    Sort();
    return true;
  }

  // From a parsed object (which must outlive this).
  void From(const nlohmann::json& j) {
    for (const auto& [key, value] : j.items()) {
      Field f;
      f.key = key;
      f.json = &value;
      if (value.is_number()) {
        f.is_number = true;
        f.number = value.get<double>();
        f.integer = value.get<int64_t>();
      } else if (value.is_string()) {
        f.is_string = true;
        f.text = *value.get_ptr<const std::string*>();
      }
      fields_.push_back(f);
    }
    Sort();
  }

  const std::vector<Field>& all() const { return fields_; }
  const Field* Find(std::string_view key) const {
    auto it = std::upper_bound(fields_.begin(), fields_.end(), key,
                               [](std::string_view k, const Field& f) { return k < f.key; });
    return it != fields_.begin() && std::prev(it)->key == key ? &*std::prev(it) : nullptr;
  }
  const Field* Number(std::string_view key) const {
    const Field* f = Find(key);
    return f != nullptr && f->is_number ? f : nullptr;
  }
  const std::string_view* String(std::string_view key) const {
    const Field* f = Find(key);
    return f != nullptr && f->is_string ? &f->text : nullptr;
  }
  // The DOM value of `key` (DOM path only), or null.
  const nlohmann::json* Json(std::string_view key) const {
    const Field* f = Find(key);
    return f != nullptr ? f->json : nullptr;
  }

 private:
  void Sort() {
    std::stable_sort(fields_.begin(), fields_.end(),
                     [](const Field& a, const Field& b) { return a.key < b.key; });
  }
  std::vector<Field> fields_;
};

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
  EventFields j;
  nlohmann::json dom;  // only for lines the flat scanner does not take
  if (!j.Scan(text)) {
    dom = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (!dom.is_object()) return;
    j = EventFields();
    j.From(dom);
  }
  auto string = [&](const char* key) -> std::string_view const* { return j.String(key); };
  auto number = [&](const char* key) { return j.Number(key); };
  std::string_view event = legacy ? "progress" : (string("event") ? *string("event") : "");
  if (event == "output") {
    const std::string_view* name_view = string("name");
    const std::string_view* path = string("path");
    if (name_view != nullptr && path != nullptr) {
      const std::string name(*name_view);
      if (outputs.size() < kMaxOutputs || outputs.count(name) > 0) {
        const bool fresh = outputs.count(name) == 0;
        outputs[name] = std::string(*path);
        if (const std::string_view* type = string("type"); type != nullptr && fresh) {
          v1::OutputArtifact art;
          art.set_name(name);
          art.set_path(std::string(*path));
          art.set_type(std::string(*type));
          if (const std::string_view* h = string("manifest_sha256"))
            art.set_manifest_sha256(std::string(*h));
          if (const std::string_view* op = string("operation")) art.set_operation(std::string(*op));
          if (const auto* bytes = number("bytes")) art.set_bytes(bytes->integer);
          if (const nlohmann::json* parents = j.Json("parents");
              parents != nullptr && parents->is_array()) {
            for (const auto& p : *parents) {
              if (p.is_string() && art.parents_size() < 64) art.add_parents(p.get<std::string>());
            }
          }
          artifacts.push_back(std::move(art));
        }
      }
    }
    return;
  }
  if (event == "metric" || event == "step") {
    const int64_t wall = wall_ms;
    auto add = [&](std::string_view name, double value, int64_t step) {
      if (metrics.size() >= kMaxMetricPoints) {
        ++metrics_dropped;
        return false;
      }
      metrics.Add(name, value, step, wall);
      return true;
    };
    const auto* step_field = number("step");
    const int64_t step = step_field != nullptr ? step_field->integer : 0;
    if (event == "metric") {
      const std::string_view* name = string("name");
      const auto* value = number("value");
      if (name != nullptr && value != nullptr && !name->empty() && name->size() <= 200) {
        const bool added = add(*name, value->number, step);
        if (const nlohmann::json* it = j.Json("labels");
            added && it != nullptr && it->is_object()) {
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
    for (const EventFields::Field& f : j.all()) {
      if (!f.is_number || f.key == "step" || f.key == "total_steps") continue;
      add(f.key, f.number, step);
    }
  }
  if (event != "progress" && event != "step") return;
  v1::Progress p;
  if (const auto* f = number("fraction")) {
    p.set_fraction(f->number);
  } else if (const auto* step = number("step"), *total = number("total_steps");
             step != nullptr && total != nullptr && total->number > 0) {
    p.set_fraction(std::clamp(step->number / total->number, 0.0, 1.0));
  }
  step_message_pending_ = false;
  if (const std::string_view* m = string("message")) {
    p.set_message(std::string(*m));
  } else if (event == "step") {
    for (int i = 0; i < 4; ++i) {
      const auto* v = number(kStepMessageKeys[i]);
      step_values_[i] = v != nullptr ? v->number : NAN;
    }
    step_message_pending_ = true;
  }
  if (const auto* step = number("step")) p.set_step(step->integer);
  progress_ = std::move(p);
  ++progress_version;
}

}  // namespace stemma::worker
