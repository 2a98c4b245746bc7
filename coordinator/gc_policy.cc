#include "coordinator/gc_policy.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace stemma::coordinator {
namespace {

bool Terminal(v1::JobState s) {
  return s == v1::SUCCEEDED || s == v1::FAILED || s == v1::CANCELLED;
}

bool IsCheckpoint(const v1::Artifact& a) { return a.type() == "checkpoint"; }

}  // namespace

absl::Status ValidateGcPolicy(const v1::GcPolicy& p) {
  if (p.keep_best() < 0) return absl::InvalidArgumentError("keep_best: must not be negative");
  if (p.keep_latest() < 0) return absl::InvalidArgumentError("keep_latest: must not be negative");
  if (p.keep_best() > 0 && p.metric().empty()) {
    return absl::InvalidArgumentError("metric: keep_best needs the metric to rank by");
  }
  if (p.keep_best() == 0 && !p.metric().empty()) {
    return absl::InvalidArgumentError("metric: only used with keep_best");
  }
  return absl::OkStatus();
}

bool IsIntermediateCheckpoint(const v1::Artifact& a) {
  const std::string& n = a.name();
  return n == "checkpoint" || absl::StartsWith(n, "checkpoint-") ||
         absl::StartsWith(n, "checkpoint/") || absl::StartsWith(n, "step-");
}

absl::flat_hash_map<std::string, std::string> ProtectedArtifacts(const GcFacts& facts) {
  absl::flat_hash_map<std::string, std::string> why;
  for (const v1::Artifact* a : facts.artifacts) {
    if (a->pinned()) why.try_emplace(a->id(), "pinned");
    if (facts.read_by_live_jobs.contains(a->id())) {
      why.try_emplace(a->id(), "a job that has not ended reads it");
    }
  }
  for (const v1::Artifact* a : facts.artifacts) {
    if (a->state() != v1::ARTIFACT_PRESENT || IsCheckpoint(*a)) continue;
    for (const std::string& parent : a->parents()) {
      why.try_emplace(parent, absl::StrCat("kept result ", a->id(), " names it"));
    }
  }
  return why;
}

std::vector<GcPlanEntry> PlanGc(const GcFacts& facts, const v1::GcPolicy& policy) {
  const auto protect = ProtectedArtifacts(facts);
  auto job_state = [&](const v1::Artifact& a) {
    auto it = facts.job_states.find(a.job_id());
    return it == facts.job_states.end() ? v1::JOB_STATE_UNSPECIFIED : it->second;
  };
  std::vector<GcPlanEntry> plan;
  // Per experiment, the checkpoints the keep rules rank.
  absl::flat_hash_map<std::string, std::vector<const v1::Artifact*>> ranked;
  for (const v1::Artifact* a : facts.artifacts) {
    if (a->state() != v1::ARTIFACT_PRESENT || !IsCheckpoint(*a) || a->external() ||
        a->job_id().empty()) {
      continue;
    }
    if (!policy.experiment().empty() && a->experiment() != policy.experiment()) continue;
    if (facts.manageable && !facts.manageable(*a)) continue;
    plan.push_back({a, false, ""});
    if (!(policy.drop_intermediate() && IsIntermediateCheckpoint(*a))) {
      ranked[absl::StrCat(a->owner(), "\n", a->experiment())].push_back(a);
    }
  }
  const bool rules = policy.keep_best() > 0 || policy.keep_latest() > 0;
  absl::flat_hash_map<const v1::Artifact*, std::string> kept_by_rule;
  if (rules) {
    for (auto& [experiment, list] : ranked) {
      if (policy.keep_latest() > 0) {
        std::vector<const v1::Artifact*> latest = list;
        std::sort(latest.begin(), latest.end(), [](const v1::Artifact* x, const v1::Artifact* y) {
          return x->created_ms() != y->created_ms() ? x->created_ms() > y->created_ms()
                                                    : x->seq() > y->seq();
        });
        for (int i = 0; i < policy.keep_latest() && i < static_cast<int>(latest.size()); ++i) {
          kept_by_rule.try_emplace(latest[i],
                                   absl::StrCat("among the latest ", policy.keep_latest()));
        }
      }
      if (policy.keep_best() > 0) {
        std::vector<const v1::Artifact*> best;
        for (const v1::Artifact* a : list) {
          if (a->metrics().contains(policy.metric())) best.push_back(a);
        }
        std::stable_sort(
            best.begin(), best.end(), [&](const v1::Artifact* x, const v1::Artifact* y) {
              double vx = x->metrics().at(policy.metric()), vy = y->metrics().at(policy.metric());
              return policy.maximize() ? vx > vy : vx < vy;
            });
        for (int i = 0; i < policy.keep_best() && i < static_cast<int>(best.size()); ++i) {
          kept_by_rule.try_emplace(best[i], absl::StrCat("among the best ", policy.keep_best(),
                                                         " by ", policy.metric()));
        }
      }
    }
  }
  for (GcPlanEntry& e : plan) {
    const v1::Artifact& a = *e.artifact;
    if (auto it = protect.find(a.id()); it != protect.end()) {
      e.reason = it->second;
      continue;
    }
    const v1::JobState state = job_state(a);
    if (!Terminal(state)) {
      e.reason = absl::StrCat("its job ", a.job_id(), " has not ended");
      continue;
    }
    if (policy.drop_intermediate() && IsIntermediateCheckpoint(a)) {
      if (state == v1::SUCCEEDED) {
        e.remove = true;
        e.reason = absl::StrCat("step checkpoint of succeeded job ", a.job_id());
      } else {
        e.reason = "step checkpoint of a job that did not succeed (resumable)";
      }
      continue;
    }
    if (!rules) {
      e.reason = "no rule deletes it";
      continue;
    }
    if (auto it = kept_by_rule.find(&a); it != kept_by_rule.end()) {
      e.reason = it->second;
      continue;
    }
    e.remove = true;
    std::vector<std::string> rule;
    if (policy.keep_best() > 0) {
      rule.push_back(absl::StrCat("the best ", policy.keep_best(), " by ", policy.metric()));
    }
    if (policy.keep_latest() > 0) rule.push_back(absl::StrCat("the latest ", policy.keep_latest()));
    e.reason = absl::StrCat("not among ", rule[0], rule.size() > 1 ? " or " + rule[1] : "",
                            " of experiment '", a.experiment(), "'");
  }
  return plan;
}

}  // namespace stemma::coordinator
