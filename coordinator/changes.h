// What one locked step of the coordinator changed: records to commit, watch events to
// publish and messages to send to workers once the records are durable.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "coordinator/store/store.h"
#include "stemma/v1/user_service.pb.h"
#include "stemma/v1/worker_service.pb.h"

namespace stemma::coordinator {

struct OutgoingMessage {
  std::string worker_id;
  v1::CoordinatorMessage message;
};

struct Changes {
  // Watch events are only built when someone watches.
  bool want_events = true;
  // When set, events are built only for jobs it accepts (someone watches them).
  std::function<bool(const std::string& job_id)> want_event;
  StoreBatch batch;
  std::vector<v1::JobEvent> events;
  std::vector<OutgoingMessage> messages;
};

}  // namespace stemma::coordinator
