// The engine's stdout events through their schema, v1::EngineEvent
// (stemma/v1/engine_event.proto): the engine writes every event line with EngineEventLine and
// the worker reads lines with ParseEngineEvent (its fast scanner, worker/event_scanner.h,
// gives the same message for the lines it takes). Torch-free and gRPC-free: both sides link
// it.
//
// Thread-safety: pure functions.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "stemma/v1/engine_event.pb.h"

namespace stemma {

// One event line (a JSON object, without the newline) as an EngineEvent: keys that name a
// field of the schema fill it through the protobuf JSON mapping (so a 64-bit count may also
// come as a string), a step event's other numbers become `series` sorted by name, and every
// other key a `details` entry. InvalidArgument for text that is not a JSON object, or a key
// of the schema with a value of another type ("step": "abc", "labels": [1]).
absl::StatusOr<v1::EngineEvent> ParseEngineEvent(std::string_view line);

// The line of `event` (no newline): the protobuf JSON mapping of its fields in field order,
// "event" first, then `series` and `details` flattened into the top level (a key a field of
// the schema already wrote is not repeated). Integral series values are written without a
// fraction, a non-finite one as null.
std::string EngineEventLine(const v1::EngineEvent& event);

// The two flattened fields' names: not read as fields when they appear as keys of a line.
bool IsFlattenedEventField(std::string_view key);

}  // namespace stemma
