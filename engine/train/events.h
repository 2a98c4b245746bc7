// Forwarding header: the event writer moved to engine/events.h (one writer for the whole
// engine). Kept until engine/train switches its includes; then removed.
#pragma once

#include "engine/events.h"

namespace stemma::engine::train {

using Event = ::stemma::engine::Event;
using EventWriter = ::stemma::engine::EventWriter;

}  // namespace stemma::engine::train
