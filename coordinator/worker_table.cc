#include "coordinator/worker_table.h"

#include <algorithm>

namespace stemma::coordinator {

int WorkerEntry::free_gpus() const {
  return static_cast<int>(std::count(gpu_used.begin(), gpu_used.end(), false));
}

void WorkerTable::Load(const StoreSnapshot& snapshot, int64_t now_mono, int64_t grace_ms) {
  for (const auto& info : snapshot.of<WorkersTable>()) {
    WorkerEntry& w = Upsert(info);
    w.connected = false;
    // A restarted coordinator gives every worker a full lease (counted from now) to come
    // back in.
    (void)grace_ms;
    w.live->last_heartbeat_mono = now_mono;
    w.live->lost = info.state() == v1::WORKER_LOST;
  }
}

WorkerEntry* WorkerTable::Find(const std::string& id) {
  auto it = workers_.find(id);
  return it == workers_.end() ? nullptr : &it->second;
}

const WorkerEntry* WorkerTable::Find(const std::string& id) const {
  auto it = workers_.find(id);
  return it == workers_.end() ? nullptr : &it->second;
}

WorkerEntry& WorkerTable::Upsert(const v1::WorkerInfo& info) {
  WorkerEntry& w = workers_[info.id()];
  v1::WorkerState state = w.info.state();
  w.info = info;
  if (state != v1::WORKER_STATE_UNSPECIFIED && info.state() == v1::WORKER_STATE_UNSPECIFIED) {
    w.info.set_state(state);
  }
  w.gpu_used.resize(info.gpus_size(), false);
  return w;
}

Allocation WorkerTable::Allocate(WorkerEntry& w, const std::string& key, int gpus, double cpus,
                                 int64_t memory_mb) {
  Allocation a;
  for (size_t i = 0; i < w.gpu_used.size() && static_cast<int>(a.gpu_ids.size()) < gpus; ++i) {
    if (!w.gpu_used[i]) {
      w.gpu_used[i] = true;
      a.gpu_ids.push_back(w.info.gpus(i).id());
    }
  }
  a.cpus = cpus;
  a.memory_mb = memory_mb;
  w.cpus_used += cpus;
  w.memory_used_mb += memory_mb;
  w.allocations[key] = a;
  return a;
}

bool WorkerTable::Restore(WorkerEntry& w, const std::string& key, const Allocation& a) {
  for (int32_t id : a.gpu_ids) {
    for (int i = 0; i < w.info.gpus_size(); ++i) {
      if (w.info.gpus(i).id() == id) w.gpu_used[i] = true;
    }
  }
  w.cpus_used += a.cpus;
  w.memory_used_mb += a.memory_mb;
  w.allocations[key] = a;
  return true;
}

void WorkerTable::Free(WorkerEntry& w, const std::string& key) {
  auto it = w.allocations.find(key);
  if (it == w.allocations.end()) return;
  for (int32_t id : it->second.gpu_ids) {
    for (int i = 0; i < w.info.gpus_size(); ++i) {
      if (w.info.gpus(i).id() == id) w.gpu_used[i] = false;
    }
  }
  w.cpus_used = std::max(0.0, w.cpus_used - it->second.cpus);
  w.memory_used_mb = std::max<int64_t>(0, w.memory_used_mb - it->second.memory_mb);
  w.allocations.erase(it);
}

v1::WorkerInfo WorkerTable::View(const WorkerEntry& w, int64_t now_mono) const {
  v1::WorkerInfo v = w.info;
  v.clear_gpus_in_use();
  for (size_t i = 0; i < w.gpu_used.size(); ++i) {
    if (w.gpu_used[i]) v.add_gpus_in_use(w.info.gpus(i).id());
  }
  v.set_cpus_in_use(w.cpus_used);
  v.set_memory_in_use_mb(w.memory_used_mb);
  v.clear_attempts();
  for (const auto& [key, a] : w.allocations) v.add_attempts(key);
  // last_heartbeat_ms carries the heartbeat age for display (ms since the last one).
  v.set_last_heartbeat_ms(w.connected ? now_mono - w.live->last_heartbeat_mono.load() : -1);
  return v;
}

}  // namespace stemma::coordinator
