#include "common/engine_events.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "google/protobuf/util/json_util.h"
#include "nlohmann/json.hpp"

namespace stemma {
namespace {

namespace pb = google::protobuf;
using OrderedJson = nlohmann::ordered_json;

bool IsSchemaField(const std::string& key) {
  return !IsFlattenedEventField(key) &&
         v1::EngineEvent::descriptor()->FindFieldByName(key) != nullptr;
}

// A number as the engine has always written it: integral values without a fraction
// ("tokens": 4096, not 4096.0), a non-finite one as null (nlohmann writes NaN as null).
OrderedJson JsonNumber(double v) {
  if (std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 9.2e18) {
    return OrderedJson(static_cast<int64_t>(v));
  }
  return OrderedJson(v);
}

// A Struct value as JSON, object keys sorted (protobuf prints a Struct in hash order).
OrderedJson ToJson(const pb::Value& value) {
  switch (value.kind_case()) {
    case pb::Value::kNumberValue:
      return JsonNumber(value.number_value());
    case pb::Value::kStringValue:
      return OrderedJson(value.string_value());
    case pb::Value::kBoolValue:
      return OrderedJson(value.bool_value());
    case pb::Value::kStructValue: {
      OrderedJson object = OrderedJson::object();
      const std::map<std::string, const pb::Value*> sorted = [&] {
        std::map<std::string, const pb::Value*> m;
        for (const auto& [k, v] : value.struct_value().fields()) m[k] = &v;
        return m;
      }();
      for (const auto& [k, v] : sorted) object[k] = ToJson(*v);
      return object;
    }
    case pb::Value::kListValue: {
      OrderedJson array = OrderedJson::array();
      for (const pb::Value& v : value.list_value().values()) array.push_back(ToJson(v));
      return array;
    }
    default:
      return OrderedJson();  // null
  }
}

}  // namespace

bool IsFlattenedEventField(std::string_view key) { return key == "series" || key == "details"; }

absl::StatusOr<v1::EngineEvent> ParseEngineEvent(std::string_view line) {
  nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) {
    return absl::InvalidArgumentError("an engine event is one JSON object on one line");
  }
  const auto kind = j.find("event");
  const bool step = kind != j.end() && kind->is_string() && kind->get_ref<std::string&>() == "step";
  // The schema's own fields go through the protobuf JSON mapping; the rest is flattened.
  nlohmann::json fields = nlohmann::json::object();
  nlohmann::json details = nlohmann::json::object();
  std::vector<std::pair<std::string, double>> series;
  for (auto& [key, value] : j.items()) {
    if (IsSchemaField(key)) {
      fields[key] = std::move(value);
    } else if (step && value.is_number()) {
      series.emplace_back(key, value.get<double>());
    } else {
      details[key] = std::move(value);
    }
  }
  v1::EngineEvent event;
  pb::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  if (auto st = pb::util::JsonStringToMessage(fields.dump(), &event, options); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("engine event: ", st.ToString()));
  }
  std::sort(series.begin(), series.end());
  for (auto& [name, value] : series) {
    v1::EngineEvent::Series* s = event.add_series();
    s->set_name(std::move(name));
    s->set_value(value);
  }
  if (!details.empty()) {
    if (auto st = pb::util::JsonStringToMessage(details.dump(), event.mutable_details(), options);
        !st.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("engine event details: ", st.ToString()));
    }
  }
  return event;
}

std::string EngineEventLine(const v1::EngineEvent& event) {
  v1::EngineEvent fields = event;
  fields.clear_series();
  fields.clear_details();
  std::string text;
  pb::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  (void)pb::util::MessageToJsonString(fields, &text, options);
  OrderedJson line = OrderedJson::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!line.is_object()) line = OrderedJson::object();
  for (const v1::EngineEvent::Series& s : event.series()) {
    if (!line.contains(s.name())) line[s.name()] = JsonNumber(s.value());
  }
  pb::Value value_of_details;
  *value_of_details.mutable_struct_value() = event.details();
  OrderedJson details = ToJson(value_of_details);
  for (auto& [key, value] : details.items()) {
    if (!line.contains(key)) line[key] = std::move(value);
  }
  return line.dump(-1, ' ', false, OrderedJson::error_handler_t::replace);
}

}  // namespace stemma
