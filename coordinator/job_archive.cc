// `stemma gc jobs`: archiving and forgetting finished jobs (JobTable::Collect), and the
// attempt history that `stemma get` shows (JobTable::History).
#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/job_spec.h"
#include "coordinator/job_table.h"

namespace stemma::coordinator {

std::vector<v1::Attempt> JobTable::History(const std::string& id) const {
  auto job = jobs_.find(id);
  if (job == jobs_.end()) return {};
  std::vector<v1::Attempt> out;
  if (auto it = history_.find(id); it != history_.end()) out = it->second;
  if (!job->second.job.current().id().empty()) out.push_back(job->second.job.current());
  return out;
}

absl::StatusOr<v1::GcJobsResponse> JobTable::Collect(
    const v1::GcJobsRequest& request, const std::function<bool(const v1::Job&)>& may_manage,
    Changes* changes) {
  if (request.finished_before_ms() <= 0) {
    return absl::InvalidArgumentError("finished_before_ms: required (e.g. --older-than 30d)");
  }
  std::set<v1::JobState> states;
  for (int s : request.states()) states.insert(static_cast<v1::JobState>(s));
  if (states.empty()) states = {v1::SUCCEEDED, v1::FAILED, v1::CANCELLED};
  for (v1::JobState s : states) {
    if (!IsTerminal(s)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "states: ", v1::JobState_Name(s), " is not finished; only finished jobs are collected"));
    }
  }
  auto selected = [&](const v1::Job& j) {
    if (!IsTerminal(j.state()) || !states.count(j.state())) return false;
    if (j.finished_ms() <= 0 || j.finished_ms() >= request.finished_before_ms()) return false;
    if (!request.experiment().empty() && j.spec().experiment() != request.experiment()) {
      return false;
    }
    if (j.archived() && !request.forget()) return false;  // archived already
    return may_manage(j);
  };
  // Newest first, so that a job's dependents (always newer) are decided before it.
  std::set<std::string> chosen;
  for (auto it = order_.rbegin(); it != order_.rend(); ++it) {
    const Entry& e = jobs_.at(*it);
    if (!selected(e.job)) continue;
    bool keep = false;
    for (const std::string& d : e.dependents) {
      auto dep = jobs_.find(d);
      if (dep == jobs_.end()) continue;
      // An unfinished job still reads this one; a forgotten job's dependents must go too.
      if (!IsTerminal(dep->second.job.state())) keep = true;
      if (request.forget() && !chosen.count(d)) keep = true;
    }
    if (!keep) chosen.insert(*it);
  }
  v1::GcJobsResponse response;
  for (const std::string& id : order_) {
    if (chosen.count(id)) response.add_job_ids(id);
  }
  response.set_applied(request.apply());
  if (!request.apply()) return response;
  for (const std::string& id : response.job_ids()) {
    if (request.forget()) {
      Forget(id, changes);
      continue;
    }
    Entry& e = jobs_.at(id);
    e.job.set_archived(true);
    Record(e, e.job.state(), changes);
  }
  if (request.forget()) {
    order_.erase(std::remove_if(order_.begin(), order_.end(),
                                [&](const std::string& id) { return chosen.count(id) > 0; }),
                 order_.end());
  }
  return response;
}

void JobTable::Forget(const std::string& id, Changes* changes) {
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return;
  v1::Job tombstone;
  tombstone.set_id(id);
  tombstone.set_seq(it->second.job.seq());
  tombstone.set_archived(true);
  tombstone.set_updated_ms(clock_->WallMs());
  changes->batch.of<JobsTable>().push_back(tombstone);
  // Upstream jobs no longer list it among their dependents.
  for (const std::string& dep : it->second.job.spec().depends_on()) {
    if (auto up = jobs_.find(dep); up != jobs_.end()) {
      std::erase(up->second.dependents, id);
    }
  }
  history_.erase(id);
  jobs_.erase(it);  // the caller removes it from order_
}

}  // namespace stemma::coordinator
