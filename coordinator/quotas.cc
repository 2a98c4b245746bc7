#include "coordinator/quotas.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/auth.h"
#include "common/files.h"
#include "common/job_spec.h"
#include "common/logging.h"
#include "common/status.h"
#include "common/yaml_json.h"

namespace stemma::coordinator {

std::string SpecOwner(const v1::JobSpec& spec) {
  auto it = spec.labels().find(kOwnerLabel);
  return it == spec.labels().end() ? std::string() : it->second;
}

std::string JobOwner(const v1::Job& job) {
  return job.owner().empty() ? SpecOwner(job.spec()) : job.owner();  // Job.owner: tenancy.h
}

namespace {

constexpr int64_t kUnlimited = std::numeric_limits<int64_t>::max() / 4;

bool Live(v1::JobState s) { return s == v1::ASSIGNED || s == v1::RUNNING; }
bool Waiting(v1::JobState s) { return s == v1::PENDING || s == v1::QUEUED; }

class Parser {
 public:
  Parser(std::string source, std::string projects_source)
      : source_(std::move(source)), projects_source_(std::move(projects_source)) {}

  absl::Status Bad(const YamlNode& n, const std::string& field, const std::string& problem) const {
    return absl::InvalidArgumentError(
        absl::StrCat(source_, ": line ", n.line, ": ", field, ": ", problem));
  }

  absl::StatusOr<int64_t> Int(const YamlNode& n, const std::string& field) const {
    int64_t v;
    if (!n.IsScalar() || !absl::SimpleAtoi(n.scalar, &v)) return Bad(n, field, "not an integer");
    return v;
  }

  // "90s", "30m", "12h", "7d" (or plain seconds).
  absl::StatusOr<int64_t> DurationMs(const YamlNode& n, const std::string& field) const {
    if (!n.IsScalar() || n.scalar.empty()) return Bad(n, field, "not a duration like 7d or 12h");
    std::string digits = n.scalar;
    int64_t unit = 1000;
    switch (digits.back()) {
      case 's':
        digits.pop_back();
        break;
      case 'm':
        unit = 60 * 1000;
        digits.pop_back();
        break;
      case 'h':
        unit = 3600 * 1000;
        digits.pop_back();
        break;
      case 'd':
        unit = 24 * 3600 * 1000;
        digits.pop_back();
        break;
      default:
        break;
    }
    int64_t v;
    if (!absl::SimpleAtoi(digits, &v) || v <= 0 || v > 3650LL * 24 * 3600) {
      return Bad(n, field, absl::StrCat("'", n.scalar, "' is not a duration like 7d or 12h"));
    }
    return v * unit;
  }

  absl::Status Limits(const YamlNode& n, const std::string& where, bool project,
                      QuotaLimits* out) const {
    if (!n.IsMap()) return Bad(n, where, "expected a mapping");
    for (size_t i = 0; i + 1 < n.items.size(); i += 2) {
      const std::string& key = n.items[i].scalar;
      const YamlNode& v = n.items[i + 1];
      const std::string field = absl::StrCat(where, ".", key);
      if (key == "max_queued_jobs" || key == "max_running_gpus") {
        ASSIGN_OR_RETURN(int64_t x, Int(v, field));
        if (x < 0) return Bad(v, field, "must be at least 0");
        (key == "max_queued_jobs" ? out->max_queued_jobs : out->max_running_gpus) = x;
      } else if (key == "priority" && !project) {
        if (!v.IsSequence() || v.items.size() != 2) {
          return Bad(v, field, "expected [min, max]");
        }
        ASSIGN_OR_RETURN(int64_t lo, Int(v.items[0], field));
        ASSIGN_OR_RETURN(int64_t hi, Int(v.items[1], field));
        if (lo > hi) return Bad(v, field, "min is above max");
        out->priority = std::make_pair(lo, hi);
      } else if (key == "members" && project) {
        // One list of projects: a second one here could disagree with the file that decides
        // namespaces and storage prefixes.
        return Bad(n.items[i], field,
                   absl::StrCat("members are listed in the projects file (stemma-coordinator "
                                "--projects",
                                projects_source_.empty() ? "" : " ", projects_source_,
                                "), not in the quota file: remove this field and list "
                                "'PROJECT SUBJECT...' there (docs/tenancy.md)"));
      } else {
        return Bad(n.items[i], field,
                   project ? "unknown field (max_queued_jobs, max_running_gpus)"
                           : "unknown field (max_queued_jobs, max_running_gpus, priority)");
      }
    }
    return absl::OkStatus();
  }

 private:
  std::string source_;
  std::string projects_source_;  // the projects file, for messages
};

}  // namespace

absl::StatusOr<QuotaConfig> ParseQuotaConfig(const std::string& text, const std::string& source,
                                             const Tenancy& projects) {
  ASSIGN_OR_RETURN(std::vector<YamlNode> docs, LoadYamlDocuments(text, source));
  QuotaConfig config;
  config.source = source;
  if (docs.empty() || docs[0].IsNull()) return config;
  if (docs.size() > 1) return absl::InvalidArgumentError(absl::StrCat(source, ": one document"));
  const YamlNode& root = docs[0];
  Parser p(source, projects.source());
  if (!root.IsMap()) return p.Bad(root, "quotas", "expected a mapping");
  for (size_t i = 0; i + 1 < root.items.size(); i += 2) {
    const std::string& key = root.items[i].scalar;
    const YamlNode& v = root.items[i + 1];
    if (key == "fair_share") {
      if (!v.IsMap()) return p.Bad(v, key, "expected a mapping (enabled, half_life)");
      if (const YamlNode* e = v.Find("enabled")) {
        if (!e->IsScalar() || (e->scalar != "true" && e->scalar != "false")) {
          return p.Bad(*e, "fair_share.enabled", "expected true or false");
        }
        config.fair_share = e->scalar == "true";
      }
      if (const YamlNode* h = v.Find("half_life")) {
        ASSIGN_OR_RETURN(config.half_life_ms, p.DurationMs(*h, "fair_share.half_life"));
      }
      for (size_t j = 0; j + 1 < v.items.size(); j += 2) {
        if (v.items[j].scalar != "enabled" && v.items[j].scalar != "half_life") {
          return p.Bad(v.items[j], absl::StrCat("fair_share.", v.items[j].scalar),
                       "unknown field (enabled, half_life)");
        }
      }
    } else if (key == "default") {
      RETURN_IF_ERROR(p.Limits(v, key, false, &config.defaults));
    } else if (key == "subjects" || key == "projects") {
      if (!v.IsMap()) return p.Bad(v, key, "expected a mapping of names");
      for (size_t j = 0; j + 1 < v.items.size(); j += 2) {
        const std::string& name = v.items[j].scalar;
        const std::string where = absl::StrCat(key, ".", name);
        if (key == "subjects") {
          RETURN_IF_ERROR(p.Limits(v.items[j + 1], where, false, &config.subjects[name]));
        } else {
          QuotaConfig::Project& pr = config.projects[name];
          RETURN_IF_ERROR(p.Limits(v.items[j + 1], where, true, &pr.limits));
          const std::vector<std::string>* members = projects.MembersOf(name);
          if (members == nullptr) {
            return p.Bad(v.items[j], where,
                         projects.source().empty()
                             ? absl::StrCat("no project ", name,
                                            ": projects are listed in a projects file "
                                            "(stemma-coordinator --projects FILE; "
                                            "docs/tenancy.md), and none was given")
                             : absl::StrCat("no project ", name, " in the projects file ",
                                            projects.source()));
          }
          pr.members = *members;
        }
      }
    } else {
      return p.Bad(root.items[i], key, "unknown field (fair_share, default, subjects, projects)");
    }
  }
  return config;
}

absl::StatusOr<QuotaConfig> QuotaFile::Load() {
  struct stat st;
  if (::stat(path_.c_str(), &st) != 0) {
    return absl::NotFoundError(
        absl::StrCat(path_, ": cannot read the quota file: ", std::strerror(errno)));
  }
  absl::StatusOr<std::string> text = files::ReadFile(path_);
  if (!text.ok()) return absl::NotFoundError(absl::StrCat(path_, ": cannot read the quota file"));
  stamp_ = {static_cast<int64_t>(st.st_ino), static_cast<int64_t>(st.st_size),
            st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec};
  return ParseQuotaConfig(*text, path_, projects_ != nullptr ? *projects_ : Tenancy());
}

std::optional<QuotaConfig> QuotaFile::Poll(int64_t mono_ms) {
  if (mono_ms - checked_ms_ < 1000) return std::nullopt;
  checked_ms_ = mono_ms;
  struct stat st;
  if (::stat(path_.c_str(), &st) != 0) return std::nullopt;
  Stamp now{static_cast<int64_t>(st.st_ino), static_cast<int64_t>(st.st_size),
            st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec};
  if (now == stamp_) return std::nullopt;
  absl::StatusOr<QuotaConfig> config = Load();
  stamp_ = now;  // a bad edit is logged once, until the file changes again
  if (!config.ok()) {
    spdlog::error("quotas: {} not reloaded, the limits in force stay: {}", path_,
                  config.status().ToString());
    return std::nullopt;
  }
  spdlog::info("quotas: reloaded {} ({} subjects, {} projects)", path_, config->subjects.size(),
               config->projects.size());
  return *std::move(config);
}

int64_t Quotas::Weight(const v1::JobSpec& spec) {
  return std::max(1, spec.nodes()) * std::max(1, spec.resources().gpus());
}

void Quotas::SetConfig(QuotaConfig config) {
  config_ = std::move(config);
  gpu_limits_ = config_.defaults.max_running_gpus.has_value();
  for (const auto& [name, l] : config_.subjects) gpu_limits_ |= l.max_running_gpus.has_value();
  for (const auto& [name, p] : config_.projects)
    gpu_limits_ |= p.limits.max_running_gpus.has_value();
  RebuildProjects();
}

void Quotas::RebuildProjects() {
  projects_of_.clear();
  project_waiting_.clear();
  project_gpus_.clear();
  for (const auto& [name, p] : config_.projects) {
    for (const auto& m : p.members) projects_of_[m].push_back(name);
  }
  for (const auto& [owner, a] : accounts_) {
    auto it = projects_of_.find(owner);
    if (it == projects_of_.end()) continue;
    for (const auto& p : it->second) {
      project_waiting_[p] += a.waiting;
      project_gpus_[p] += a.running_gpus;
    }
  }
}

const std::vector<std::string>* Quotas::ProjectsOf(const std::string& owner) const {
  auto it = projects_of_.find(owner);
  return it == projects_of_.end() ? nullptr : &it->second;
}

void Quotas::Charge(Account& a, double amount, int64_t at_ms, int64_t now_ms) const {
  const double hl = static_cast<double>(config_.half_life_ms);
  const int64_t ref = std::max(a.usage_ms, now_ms);
  a.usage = a.usage * std::exp2(-(ref - a.usage_ms) / hl) + amount * std::exp2(-(ref - at_ms) / hl);
  a.usage_ms = ref;
}

double Quotas::Usage(const std::string& owner, int64_t now_ms) const {
  auto it = accounts_.find(owner);
  if (it == accounts_.end()) return 0;
  const Account& a = it->second;
  const double past = a.usage * std::exp2(-std::max<int64_t>(0, now_ms - a.usage_ms) /
                                          static_cast<double>(config_.half_life_ms));
  const double running = (a.running_weight * now_ms - a.running_start_sum) / 1000.0 +
                         a.running_weight * kMinChargeSeconds;
  return past + std::max(0.0, running);
}

void Quotas::OnTransition(const v1::Job& job, v1::JobState from, v1::JobState to) {
  const std::string owner = JobOwner(job);
  Account& a = accounts_[owner];
  const std::vector<std::string>* projects = ProjectsOf(owner);
  const int64_t gpus =
      static_cast<int64_t>(std::max(1, job.spec().nodes())) * job.spec().resources().gpus();
  const int64_t weight = Weight(job.spec());
  const int64_t now = clock_->WallMs();
  auto add = [&](absl::flat_hash_map<std::string, int64_t>& per_project, int64_t d) {
    if (projects == nullptr) return;
    for (const auto& p : *projects) per_project[p] += d;
  };
  const int neg_priority = -job.spec().priority();
  if (from == v1::QUEUED) {
    auto level = levels_.find(neg_priority);
    if (level != levels_.end()) {
      auto q = level->second.find(owner);
      if (q != level->second.end()) {
        q->second.erase({job.seq(), job.id()});
        if (q->second.empty()) level->second.erase(q);
      }
      if (level->second.empty()) levels_.erase(level);
    }
  }
  if (to == v1::QUEUED) levels_[neg_priority][owner].emplace(job.seq(), job.id());
  if (Waiting(from) != Waiting(to)) {
    const int64_t d = Waiting(to) ? 1 : -1;
    a.waiting += d;
    add(project_waiting_, d);
  }
  const int64_t start = job.current().assigned_ms();
  if (Live(from) && !Live(to)) {
    a.running_gpus -= gpus;
    a.running_weight -= weight;
    a.running_start_sum -= weight * start;
    add(project_gpus_, -gpus);
    const int64_t end = job.current().finished_ms() > 0 ? job.current().finished_ms() : now;
    Charge(a, weight * (std::max<int64_t>(0, end - start) / 1000.0 + kMinChargeSeconds), end, now);
  } else if (!Live(from) && Live(to)) {
    a.running_gpus += gpus;
    a.running_weight += weight;
    a.running_start_sum += weight * start;
    add(project_gpus_, gpus);
  } else if (from == v1::JOB_STATE_UNSPECIFIED && IsTerminal(to) && job.attempts() > 0 &&
             job.current().finished_ms() > 0) {
    // Loading: the last attempt of each ended job stands for its usage.
    const int64_t end = job.current().finished_ms();
    Charge(a, weight * (std::max<int64_t>(0, end - start) / 1000.0 + kMinChargeSeconds), end, now);
  }
}

QuotaLimits Quotas::LimitsOf(const std::string& owner, std::string* where) const {
  QuotaLimits l = config_.defaults;
  *where = "default";
  auto it = config_.subjects.find(owner);
  if (it != config_.subjects.end()) {
    *where = absl::StrCat("subjects.", owner);
    if (it->second.max_queued_jobs) l.max_queued_jobs = it->second.max_queued_jobs;
    if (it->second.max_running_gpus) l.max_running_gpus = it->second.max_running_gpus;
    if (it->second.priority) l.priority = it->second.priority;
  }
  return l;
}

int64_t Quotas::OwnerGpuHeadroom(const std::string& owner) const {
  std::string where;
  const QuotaLimits l = LimitsOf(owner, &where);
  if (!l.max_running_gpus) return kUnlimited;
  auto acc = accounts_.find(owner);
  return *l.max_running_gpus - (acc == accounts_.end() ? 0 : acc->second.running_gpus);
}

int64_t Quotas::ProjectGpuHeadroom(const std::string& project) const {
  auto it = config_.projects.find(project);
  if (it == config_.projects.end() || !it->second.limits.max_running_gpus) return kUnlimited;
  auto g = project_gpus_.find(project);
  return *it->second.limits.max_running_gpus - (g == project_gpus_.end() ? 0 : g->second);
}

absl::Status Quotas::CheckSubmit(const std::vector<const v1::JobSpec*>& specs) const {
  // Per owner: jobs in this request.
  std::map<std::string, int64_t> adding;
  for (size_t i = 0; i < specs.size(); ++i) {
    const v1::JobSpec& spec = *specs[i];
    const std::string owner = SpecOwner(spec);
    ++adding[owner];
    std::string where;
    const QuotaLimits l = LimitsOf(owner, &where);
    const std::string who = spec.name().empty() ? absl::StrCat("jobs[", i, "]")
                                                : absl::StrCat("job '", spec.name(), "'");
    const std::string whose = owner.empty() ? "" : absl::StrCat(" for ", owner);
    if (l.priority &&
        (spec.priority() < l.priority->first || spec.priority() > l.priority->second)) {
      return absl::InvalidArgumentError(
          absl::StrCat(who, ": priority: ", spec.priority(), " is outside ", l.priority->first,
                       "..", l.priority->second, ", the range the quota allows", whose, " (", where,
                       ".priority in ", config_.source, ")"));
    }
    const int64_t gpus = static_cast<int64_t>(std::max(1, spec.nodes())) * spec.resources().gpus();
    if (gpus > 0 && l.max_running_gpus && gpus > *l.max_running_gpus) {
      return absl::FailedPreconditionError(absl::StrCat(
          who, ": needs ", gpus, " GPUs, above the quota max_running_gpus ", *l.max_running_gpus,
          whose, " (", where, ".max_running_gpus in ", config_.source, "); it could never run"));
    }
  }
  for (const auto& [owner, n] : adding) {
    std::string where;
    const QuotaLimits l = LimitsOf(owner, &where);
    auto acc = accounts_.find(owner);
    const int64_t waiting = acc == accounts_.end() ? 0 : acc->second.waiting;
    const std::string whose = owner.empty() ? "" : absl::StrCat(owner, " ");
    if (l.max_queued_jobs && waiting + n > *l.max_queued_jobs) {
      return absl::FailedPreconditionError(absl::StrCat(
          "quota exceeded: max_queued_jobs ", *l.max_queued_jobs, " (", where, " in ",
          config_.source, "): ", whose, "has ", waiting, " jobs waiting and this submit adds ", n,
          "; wait for some to start or cancel some"));
    }
    if (const auto* projects = ProjectsOf(owner)) {
      for (const auto& p : *projects) {
        const auto& limit = config_.projects.at(p).limits.max_queued_jobs;
        if (!limit) continue;
        auto w = project_waiting_.find(p);
        const int64_t pw = w == project_waiting_.end() ? 0 : w->second;
        if (pw + n > *limit) {
          return absl::FailedPreconditionError(absl::StrCat(
              "quota exceeded: max_queued_jobs ", *limit, " of project ", p, " (projects.", p,
              " in ", config_.source, "): its members have ", pw,
              " jobs waiting and this submit adds ", n, "; wait for some to start or cancel some"));
        }
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace stemma::coordinator
