#include "coordinator/artifact_registry.h"

#include <algorithm>
#include <deque>
#include <filesystem>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/engine_spec.h"
#include "common/job_spec.h"
#include "common/logging.h"
#include "common/path_confinement.h"
#include "common/status.h"
#include "coordinator/gc_policy.h"
#include "coordinator/spec_refs.h"
#include "stemma/v1/spec_options.pb.h"

namespace stemma::coordinator {
namespace {

bool IsLiveState(v1::JobState s) { return s == v1::ASSIGNED || s == v1::RUNNING; }
bool Terminal(v1::JobState s) {
  return s == v1::SUCCEEDED || s == v1::FAILED || s == v1::CANCELLED;
}

std::string NormalPath(std::string p) {
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  return p;
}

void AppendUnique(std::vector<std::string>* v, const std::string& id) {
  if (std::find(v->begin(), v->end(), id) == v->end()) v->push_back(id);
}

// GC removes files only inside the workers' storage roots (symlinks resolved). Without any
// reported root (workers from before they reported one) the check cannot be made.
absl::Status InsideARoot(const std::string& path, const std::vector<std::string>& roots) {
  if (roots.empty()) return absl::OkStatus();
  absl::Status last;
  for (const std::string& root : roots) {
    absl::StatusOr<std::string> relative = RelativeBelowRoot("path", path, root);
    if (relative.ok()) return absl::OkStatus();
    last = relative.status();
  }
  return absl::FailedPreconditionError(
      absl::StrCat("not removed: ", path, " is outside every storage root (", last.message(), ")"));
}

}  // namespace

void ArtifactRegistry::Load(const StoreSnapshot& snapshot) {
  for (const v1::Artifact& a : snapshot.of<ArtifactsTable>()) {
    by_id_[a.id()] = a;
    order_.push_back(a.id());
    next_seq_ = std::max(next_seq_, a.seq() + 1);
    Index(by_id_[a.id()], /*inserted=*/true);
  }
}

void ArtifactRegistry::Index(const v1::Artifact& a, bool inserted) {
  if (a.state() == v1::ARTIFACT_PRESENT) by_path_[a.path()] = a.id();
  if (!a.manifest_sha256().empty()) {
    // An external artifact learns its hash at its first verify.
    auto& ids = by_manifest_[a.manifest_sha256()];
    if (inserted || std::find(ids.begin(), ids.end(), a.id()) == ids.end()) ids.push_back(a.id());
  }
  if (!inserted) return;  // job and parents never change
  if (!a.job_id().empty()) by_job_[a.job_id()].push_back(a.id());
  for (const std::string& parent : a.parents()) children_[parent].push_back(a.id());
}

v1::Artifact* ArtifactRegistry::Put(v1::Artifact artifact, Changes* changes) {
  auto [it, inserted] = by_id_.try_emplace(artifact.id());
  if (inserted) order_.push_back(artifact.id());
  const bool was_at_path = !inserted && it->second.state() == v1::ARTIFACT_PRESENT;
  it->second = std::move(artifact);
  v1::Artifact& a = it->second;
  if (was_at_path && a.state() != v1::ARTIFACT_PRESENT) {
    auto p = by_path_.find(a.path());
    if (p != by_path_.end() && p->second == a.id()) by_path_.erase(p);
  }
  Index(a, inserted);
  changes->batch.of<ArtifactsTable>().push_back(a);
  return &a;
}

std::string ArtifactRegistry::ResolveParent(const std::string& path, Changes* changes) {
  auto it = by_path_.find(path);
  if (it != by_path_.end()) return it->second;
  v1::Artifact a;
  const uint64_t seq = next_seq_++;
  a.set_id(absl::StrCat("a-", seq));
  a.set_seq(seq);
  a.set_type("checkpoint");
  a.set_path(path);
  a.set_operation("external");
  a.set_external(true);
  a.set_state(v1::ARTIFACT_PRESENT);
  a.set_verification(v1::UNCHECKED);
  a.set_created_ms(core_->clock->WallMs());
  return Put(std::move(a), changes)->id();
}

std::string ArtifactRegistry::ConfineOutputs(const v1::AttemptEvent::Finished& finished,
                                             const std::string& root, const std::string& owner,
                                             const Tenancy& tenancy) {
  std::vector<std::pair<std::string, std::string>> paths;  // (field, path)
  for (const v1::OutputArtifact& a : finished.artifacts()) {
    paths.emplace_back(absl::StrCat("output ", a.name()), a.path());
  }
  for (const auto& [name, path] : finished.outputs()) {
    paths.emplace_back(absl::StrCat("output ", name), path);
  }
  for (const auto& [field, path] : paths) {
    if (path.empty()) continue;
    if (root.empty()) {
      const std::string normal = std::filesystem::path(path).lexically_normal().string();
      if (path[0] != '/' || NormalPath(normal) != NormalPath(path)) {
        return absl::StrCat("refused ", field, ": ", path, " is not an absolute, normal path");
      }
      if (!owner.empty()) {
        return absl::StrCat("refused ", field, ": ", path,
                            ": the worker reported no storage root to confine it to");
      }
      continue;
    }
    absl::StatusOr<std::string> relative = RelativeBelowRoot(field, path, root);
    absl::Status st =
        relative.ok() ? tenancy.CheckWritable(field, *relative, owner) : relative.status();
    if (!st.ok()) return absl::StrCat("refused ", st.message());
  }
  return "";
}

void ArtifactRegistry::Stage(
    const std::string& attempt_id,
    const google::protobuf::RepeatedPtrField<v1::OutputArtifact>& artifacts,
    std::vector<ManifestCheck> checks) {
  if (artifacts.empty()) return;
  auto& staged = staged_[attempt_id];
  for (int i = 0; i < artifacts.size(); ++i) {
    Staged s;
    s.output = artifacts[i];
    if (static_cast<size_t>(i) < checks.size()) s.check = std::move(checks[i]);
    staged.push_back(std::move(s));
  }
}

void ArtifactRegistry::OnTransition(const v1::Job& job, v1::JobState from, v1::JobState to) {
  // The memoizer's entries: a job that ran and succeeded (also at load).
  if (to == v1::SUCCEEDED && job.attempts() > 0 && !job.cache_key().empty()) {
    by_cache_key_[job.cache_key()] = job.id();
  }
  if (!IsLiveState(from) || IsLiveState(to) || to == v1::SUCCEEDED) return;
  staged_.erase(job.current().id());
}

namespace {

// The values `job` measured on the artifact, each with the job (an eval's bpb/all is not
// another eval's): what an earlier run of the same job recorded is replaced; at most
// kMaxMeasured entries are kept, the oldest dropped first.
constexpr int kMaxMeasured = 4096;
void AddMeasured(const v1::Job& job, const absl::flat_hash_map<std::string, double>& last,
                 int64_t now, v1::Artifact* a) {
  auto* measured = a->mutable_measured();
  measured->erase(
      std::remove_if(measured->begin(), measured->end(),
                     [&](const v1::MeasuredMetric& m) { return m.job_id() == job.id(); }),
      measured->end());
  std::vector<std::pair<std::string, double>> sorted(last.begin(), last.end());
  std::sort(sorted.begin(), sorted.end());
  for (const auto& [name, value] : sorted) {
    v1::MeasuredMetric* m = measured->Add();
    m->set_name(name);
    m->set_value(value);
    m->set_job_id(job.id());
    m->set_job_name(job.spec().name());
    m->set_time_ms(now);
  }
  if (measured->size() > kMaxMeasured) measured->DeleteSubrange(0, measured->size() - kMaxMeasured);
}

}  // namespace

void ArtifactRegistry::JobSucceeded(const v1::Job& job, Changes* changes) {
  series_->AssertHeld();
  const absl::flat_hash_map<std::string, double> last = series_->LastValues(job.id());
  series_->Forget(job.id());
  std::vector<Staged> staged;
  if (auto it = staged_.find(job.current().id()); it != staged_.end()) {
    staged = std::move(it->second);
    staged_.erase(it);
  }
  const int64_t now = core_->clock->WallMs();
  std::string stage;
  if (auto it = job.spec().labels().find("stage"); it != job.spec().labels().end()) {
    stage = it->second;
  }
  bool made_checkpoint = false;
  // The registered artifacts the job read (InputsOf: a CPT's base and datasets, a tokenize's
  // tokenizer and the corpus its input lies in, an exec job's declared inputs) are parents of
  // every output, after those the engine named; never an artifact at an output's path (the
  // record this job's output replaces).
  std::vector<std::string> inputs = InputsOf(job.spec());
  for (const Staged& s : staged) {
    const std::string path = NormalPath(s.output.path());
    inputs.erase(std::remove_if(inputs.begin(), inputs.end(),
                                [&](const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(
                                    core_->mu) { return by_id_.at(id).path() == path; }),
                 inputs.end());
  }
  for (Staged& s : staged) {
    const v1::OutputArtifact& out = s.output;
    if (out.path().empty()) continue;
    const std::string path = NormalPath(out.path());
    // Parents first: an external base registered on the way gets the lower id.
    std::vector<std::string> parents;
    for (const std::string& parent : out.parents()) {
      const std::string p = NormalPath(parent);
      if (p.empty() || p == path || job.spec().has_exec()) continue;
      AppendUnique(&parents, ResolveParent(p, changes));
    }
    for (const std::string& id : inputs) AppendUnique(&parents, id);
    v1::Artifact a;
    const uint64_t seq = next_seq_++;
    a.set_id(absl::StrCat("a-", seq));
    a.set_seq(seq);
    a.set_name(out.name());
    a.set_type(out.type().empty() ? "checkpoint" : out.type());
    a.set_path(path);
    a.set_manifest_sha256(out.manifest_sha256());
    a.set_bytes(out.bytes());
    a.set_job_id(job.id());
    a.set_owner(job.owner());
    a.set_attempt(job.current().number());
    a.set_experiment(job.spec().experiment());
    a.set_stage(stage);
    a.set_operation(out.operation());
    for (auto& id : parents) a.add_parents(std::move(id));
    for (const auto& [name, value] : last) (*a.mutable_metrics())[name] = value;
    AddMeasured(job, last, now, &a);
    a.set_state(v1::ARTIFACT_PRESENT);
    a.set_created_ms(now);
    for (v1::FileStamp& f : s.check.files) *a.add_files() = std::move(f);
    a.set_verification(s.check.result);
    a.set_verification_detail(s.check.detail);
    if (s.check.result == v1::MISMATCH) {
      spdlog::warn("job={} output {} at {}: {}", job.id(), out.name(), path, s.check.detail);
    }
    // A new artifact at the path of a present one replaced its files: the old record must
    // never be collected (that would delete the new files).
    if (auto old = by_path_.find(path); old != by_path_.end()) {
      v1::Artifact replaced = by_id_.at(old->second);
      replaced.set_state(v1::ARTIFACT_DELETED);
      replaced.set_deleted_ms(now);
      replaced.set_deleted_by(absl::StrCat("replaced by ", a.id(), " (same path)"));
      Put(std::move(replaced), changes);
    }
    if (a.type() == "checkpoint") {
      made_checkpoint = true;
      core_->metrics->CheckpointRegistered(a.operation());
    }
    Put(std::move(a), changes);
  }
  // An evaluation (no checkpoint of its own) measured the checkpoints it read.
  if (!made_checkpoint && !last.empty()) {
    for (const std::string& id : ReferencedBy(job.spec())) {
      v1::Artifact a = by_id_.at(id);
      if (a.type() != "checkpoint" || a.state() != v1::ARTIFACT_PRESENT) continue;
      for (const auto& [name, value] : last) (*a.mutable_metrics())[name] = value;
      AddMeasured(job, last, now, &a);
      Put(std::move(a), changes);
    }
  }
}

const v1::Artifact* ArtifactRegistry::Find(const std::string& id_or_path) const {
  if (auto it = by_id_.find(id_or_path); it != by_id_.end()) return &it->second;
  std::string id = id_or_path;
  if (absl::StartsWith(id, "ckpt:")) id = id.substr(5);
  if (auto it = by_id_.find(id); it != by_id_.end()) return &it->second;
  if (auto it = by_path_.find(NormalPath(id_or_path)); it != by_path_.end()) {
    return &by_id_.at(it->second);
  }
  return nullptr;
}

std::vector<const v1::Artifact*> ArtifactRegistry::FindByManifest(const std::string& sha256) const {
  std::vector<const v1::Artifact*> out;
  if (auto it = by_manifest_.find(sha256); it != by_manifest_.end()) {
    for (const auto& id : it->second) out.push_back(&by_id_.at(id));
  }
  return out;
}

std::vector<const v1::Artifact*> ArtifactRegistry::FindByJob(const std::string& job_id) const {
  std::vector<const v1::Artifact*> out;
  if (auto it = by_job_.find(job_id); it != by_job_.end()) {
    for (const auto& id : it->second) out.push_back(&by_id_.at(id));
  }
  return out;
}

std::string ArtifactRegistry::CacheRefusal(const v1::Job& source, const v1::Job& job) const {
  if (!job.owner().empty() && !core_->options.tenancy.Shares(job.owner(), source.owner())) {
    return absl::StrCat(source.id(), " is ", source.owner(), "'s");
  }
  const std::vector<std::string> roots = StorageRoots();
  if (const google::protobuf::Message* spec = EngineSpecOf(job.spec()); spec && !roots.empty()) {
    for (const SpecPath& p : SpecPaths(*spec)) {
      if (p.role != v1::ROLE_OUTPUT_PATH || p.value.empty() || p.value[0] != '/') continue;
      if (absl::Status st = InsideARoot(p.value, roots); !st.ok()) {
        return absl::StrCat("its ", p.field, " ", p.value, " is outside every storage root");
      }
    }
  }
  for (const v1::Artifact* a : FindByJob(source.id())) {
    if (a->state() != v1::ARTIFACT_PRESENT) {
      return absl::StrCat(a->id(), " is gone (", a->deleted_by(), ")");
    }
    // Read before the lock (InstallVerdicts), and the record is still as it was then.
    if (auto v = verdicts_.find(a->id());
        v != verdicts_.end() && VerdictHolds(*a, v->second.checked)) {
      if (!v->second.problem.empty()) return v->second.problem;
      continue;
    }
    std::vector<FileVerdict> now = CheckFiles({*a});  // no precheck: read here
    if (!now[0].problem.empty()) return now[0].problem;
  }
  return "";
}

std::vector<v1::Artifact> ArtifactRegistry::HitArtifacts(
    const std::vector<std::string>& cache_keys) const {
  std::vector<v1::Artifact> out;
  for (const std::string& key : cache_keys) {
    auto source = by_cache_key_.find(key);
    if (source == by_cache_key_.end()) continue;
    for (const v1::Artifact* a : FindByJob(source->second)) {
      if (a->state() == v1::ARTIFACT_PRESENT) out.push_back(*a);
    }
  }
  return out;
}

std::vector<ArtifactRegistry::FileVerdict> ArtifactRegistry::CheckFiles(
    std::vector<v1::Artifact> artifacts) {
  std::vector<FileVerdict> out;
  out.reserve(artifacts.size());
  for (v1::Artifact& a : artifacts) {
    FileVerdict v;
    if (!SameStamps(a.files(), StampFiles(a.path())) || a.files_size() == 0) {
      DeepCheck check = VerifyArtifactFiles(a.path(), a.manifest_sha256());
      if (!check.problems.empty()) {
        v.problem =
            absl::StrCat(a.id(), " changed since it was registered: ", check.problems.front());
      }
    }
    v.checked = std::move(a);
    out.push_back(std::move(v));
  }
  return out;
}

bool ArtifactRegistry::VerdictHolds(const v1::Artifact& now, const v1::Artifact& checked) {
  return now.id() == checked.id() && now.state() == checked.state() &&
         now.path() == checked.path() && now.manifest_sha256() == checked.manifest_sha256() &&
         SameStamps(now.files(), {checked.files().begin(), checked.files().end()});
}

void ArtifactRegistry::InstallVerdicts(std::vector<FileVerdict> verdicts) {
  for (FileVerdict& v : verdicts) {
    const std::string id = v.checked.id();
    verdicts_[id] = std::move(v);
  }
}

std::vector<std::string> ArtifactRegistry::StorageRoots() const {
  std::vector<std::string> roots;
  for (const auto& [id, w] : core_->workers.all()) {
    const std::string& root = w.info.storage_root();
    if (!root.empty() && root[0] == '/' &&
        std::find(roots.begin(), roots.end(), root) == roots.end()) {
      roots.push_back(root);
    }
  }
  return roots;
}

std::vector<std::string> ArtifactRegistry::ReferencedBy(const v1::JobSpec& spec) const {
  return ReferencedBy(spec, StorageRoots());
}

std::vector<std::string> ArtifactRegistry::ReferencedBy(
    const v1::JobSpec& spec, const std::vector<std::string>& roots) const {
  std::vector<std::string> strings;
  CollectStrings(spec, &strings);
  return IdsAt(strings, roots);
}

std::vector<std::string> ArtifactRegistry::InputsOf(const v1::JobSpec& spec) const {
  if (spec.has_exec()) {
    // An exec job's declared inputs (issue 23): the program's other reads (a script, a data
    // file) are not artifacts it descends from.
    v1::JobSpec inputs;
    *inputs.mutable_exec()->mutable_inputs() = spec.exec().inputs();
    return ReferencedBy(inputs);
  }
  const google::protobuf::Message* engine = EngineSpecOf(spec);
  if (engine == nullptr) return {};
  std::vector<std::string> strings;
  for (const SpecPath& p : SpecPaths(*engine)) {
    if (p.role == v1::ROLE_INPUT_MODEL || p.role == v1::ROLE_INPUT_PATH) strings.push_back(p.value);
  }
  return IdsAt(strings, StorageRoots());
}

std::vector<std::string> ArtifactRegistry::IdsAt(const std::vector<std::string>& strings,
                                                 const std::vector<std::string>& roots) const {
  std::vector<std::string> ids;
  auto lookup = [&](std::string p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_->mu) {
    // The path itself, or any directory above it (a file inside a checkpoint).
    p = NormalPath(std::filesystem::path(p).lexically_normal().string());
    while (!p.empty()) {
      if (auto it = by_path_.find(p); it != by_path_.end()) {
        AppendUnique(&ids, it->second);
        return;
      }
      auto slash = p.rfind('/');
      if (slash == std::string::npos || slash == 0) return;
      p.resize(slash);
    }
  };
  for (const std::string& s : strings) {
    if (absl::StartsWith(s, "ckpt:")) {
      if (by_id_.contains(s.substr(5))) AppendUnique(&ids, s.substr(5));
      continue;
    }
    if (s.empty() || by_path_.empty() || s.size() > 4096) continue;
    if (s[0] == '/') {
      lookup(s);
    } else {
      // A relative path is below the storage root of whichever worker runs the job.
      for (const std::string& root : roots) lookup(absl::StrCat(root, "/", s));
    }
  }
  return ids;
}

std::vector<std::string> ArtifactRegistry::ReadBy(const v1::Job& job,
                                                  const std::vector<std::string>& roots) const {
  std::vector<std::string> ids = ReferencedBy(job.spec(), roots);
  auto add_outputs_of = [&](const std::string& upstream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_->mu) {
    for (const v1::Artifact* a : FindByJob(upstream)) AppendUnique(&ids, a->id());
  };
  for (const std::string& dep : job.spec().depends_on()) add_outputs_of(dep);
  if (auto twin = job.spec().labels().find(kWaitsForLabel); twin != job.spec().labels().end()) {
    add_outputs_of(twin->second);
  }
  return ids;
}

absl::StatusOr<v1::ListArtifactsResponse> ArtifactRegistry::List(
    const v1::ListArtifactsRequest& request) {
  if (request.limit() < 0) return absl::InvalidArgumentError("limit: must not be negative");
  const int limit = request.limit() > 0 ? request.limit() : 1000;
  absl::MutexLock lock(&core_->mu);
  v1::ListArtifactsResponse resp;
  auto matches = [&](const v1::Artifact& a) {
    if (!request.include_deleted() && a.state() != v1::ARTIFACT_PRESENT) return false;
    if (!request.experiment().empty() && a.experiment() != request.experiment()) return false;
    if (!request.job_id().empty() && a.job_id() != request.job_id()) return false;
    if (!request.type().empty() && a.type() != request.type()) return false;
    if (!request.manifest_sha256().empty() && a.manifest_sha256() != request.manifest_sha256()) {
      return false;
    }
    return true;
  };
  // Newest first: the ones a person looks for.
  for (auto it = order_.rbegin(); it != order_.rend() && resp.artifacts_size() < limit; ++it) {
    const v1::Artifact& a = by_id_.at(*it);
    if (matches(a)) *resp.add_artifacts() = a;
  }
  return resp;
}

absl::StatusOr<v1::ArtifactDetails> ArtifactRegistry::Get(const std::string& id) {
  absl::MutexLock lock(&core_->mu);
  const v1::Artifact* a = Find(id);
  if (a == nullptr) return absl::NotFoundError(absl::StrCat("no artifact ", id));
  v1::ArtifactDetails d;
  *d.mutable_artifact() = *a;
  for (const std::string& p : a->parents()) {
    if (auto it = by_id_.find(p); it != by_id_.end()) *d.add_parents() = it->second;
  }
  if (!a->job_id().empty()) {
    if (const v1::Job* job = core_->jobs.Find(a->job_id())) *d.mutable_producer() = *job;
  }
  if (auto it = children_.find(a->id()); it != children_.end()) {
    for (const std::string& c : it->second) *d.add_children() = by_id_.at(c);
  }
  std::vector<std::pair<uint64_t, std::string>> consumers;
  const std::vector<std::string> roots = StorageRoots();
  core_->jobs.ForEach([&](const v1::Job& job) ABSL_NO_THREAD_SAFETY_ANALYSIS {  // under mu
    if (job.id() == a->job_id()) return;
    auto refs = ReadBy(job, roots);
    if (std::find(refs.begin(), refs.end(), a->id()) != refs.end()) {
      consumers.emplace_back(job.seq(), job.id());
    }
  });
  std::sort(consumers.begin(), consumers.end());
  for (auto& [seq, job] : consumers) d.add_consumer_jobs(job);
  return d;
}

absl::StatusOr<v1::LineageResponse> ArtifactRegistry::Lineage(const v1::LineageRequest& request) {
  if (request.max_depth() < 0) return absl::InvalidArgumentError("max_depth: must not be negative");
  constexpr int kMaxNodes = 100000;
  absl::MutexLock lock(&core_->mu);
  const v1::Artifact* root = Find(request.id());
  if (root == nullptr) return absl::NotFoundError(absl::StrCat("no artifact ", request.id()));
  v1::LineageResponse resp;
  absl::flat_hash_set<std::string> seen = {root->id()};
  std::deque<std::pair<const v1::Artifact*, int>> queue = {{root, 0}};
  while (!queue.empty()) {
    auto [a, depth] = queue.front();
    queue.pop_front();
    *resp.add_artifacts() = *a;
    if (resp.artifacts_size() >= kMaxNodes) {
      resp.set_truncated(!queue.empty());
      break;
    }
    for (const std::string& p : a->parents()) {
      if (request.max_depth() > 0 && depth + 1 > request.max_depth()) {
        resp.set_truncated(true);
        break;
      }
      auto it = by_id_.find(p);
      if (it == by_id_.end() || !seen.insert(p).second) continue;
      queue.emplace_back(&it->second, depth + 1);
    }
  }
  return resp;
}

absl::StatusOr<v1::VerifyArtifactResponse> ArtifactRegistry::Verify(const std::string& id) {
  std::string path, sha, artifact_id;
  {
    absl::MutexLock lock(&core_->mu);
    const v1::Artifact* a = Find(id);
    if (a == nullptr) return absl::NotFoundError(absl::StrCat("no artifact ", id));
    if (a->state() != v1::ARTIFACT_PRESENT) {
      return absl::FailedPreconditionError(
          absl::StrCat("artifact ", a->id(), " was deleted (", a->deleted_by(), ")"));
    }
    path = a->path();
    sha = a->manifest_sha256();
    artifact_id = a->id();
  }
  const bool external = sha.empty();
  DeepCheck check;
  if (external) {
    // An external artifact has no reported hash: record the one found, check the files.
    auto found = Sha256File(ManifestFile(path));
    if (found.ok()) sha = *found;
  }
  check = VerifyArtifactFiles(path, sha);
  v1::VerifyArtifactResponse resp;
  uint64_t ticket;
  {
    absl::MutexLock lock(&core_->mu);
    auto it = by_id_.find(artifact_id);
    if (it == by_id_.end()) return absl::NotFoundError(absl::StrCat("no artifact ", id));
    v1::Artifact a = it->second;
    if (external && a.manifest_sha256().empty() && check.manifest.result == v1::VERIFIED) {
      a.set_manifest_sha256(sha);
    }
    a.set_verification(check.problems.empty()                  ? v1::VERIFIED
                       : check.manifest.result == v1::VERIFIED ? v1::MISMATCH
                                                               : check.manifest.result);
    a.set_verification_detail(check.problems.empty() ? "" : check.problems.front());
    Changes changes = core_->NewChanges();
    *resp.mutable_artifact() = *Put(std::move(a), &changes);
    ticket = core_->Finish(std::move(changes));
  }
  core_->Wait(ticket);
  resp.set_ok(check.problems.empty());
  for (auto& p : check.problems) resp.add_problems(std::move(p));
  resp.set_files_checked(check.files_checked);
  return resp;
}

absl::StatusOr<v1::Artifact> ArtifactRegistry::Pin(const std::string& id, bool unpin,
                                                   const std::string& key) {
  v1::Artifact result;
  uint64_t ticket;
  {
    absl::MutexLock lock(&core_->mu);
    const v1::Artifact* found = Find(id);
    if (found == nullptr) return absl::NotFoundError(absl::StrCat("no artifact ", id));
    // The same key again (a lost answer): the artifact as it is, nothing changed.
    const char* operation = unpin ? "unpin" : "pin";
    ASSIGN_OR_RETURN(bool seen, core_->jobs.SeenOperation(key, operation, found->id()));
    if (seen) {
      result = *found;
      ticket = core_->LastTicket();
    } else {
      v1::Artifact a = *found;
      a.set_pinned(!unpin);
      Changes changes = core_->NewChanges();
      core_->jobs.RememberOperation(key, operation, a.id(), &changes);
      result = *Put(std::move(a), &changes);
      ticket = core_->Finish(std::move(changes));
    }
  }
  core_->Wait(ticket);
  return result;
}

absl::StatusOr<v1::GcResponse> ArtifactRegistry::CollectGarbage(const v1::GcRequest& request) {
  RETURN_IF_ERROR(ValidateGcPolicy(request.policy()));
  v1::GcResponse resp;
  resp.set_applied(request.apply());
  std::vector<std::pair<v1::Artifact, std::string>> doomed;  // copies: files go unlocked
  std::vector<std::string> roots;
  {
    absl::MutexLock lock(&core_->mu);
    roots = StorageRoots();
    GcFacts facts;
    if (!request.policy().requester().empty()) {
      facts.manageable = [tenancy = &core_->options.tenancy,
                          who = request.policy().requester()](const v1::Artifact& a) {
        return !a.owner().empty() && tenancy->Shares(who, a.owner());
      };
    }
    for (const std::string& id : order_) {
      const v1::Artifact& a = by_id_.at(id);
      facts.artifacts.push_back(&a);
      if (!a.job_id().empty() && !facts.job_states.contains(a.job_id())) {
        const v1::Job* job = core_->jobs.Find(a.job_id());
        if (job != nullptr) facts.job_states[a.job_id()] = job->state();
      }
    }
    core_->jobs.ForEach([&](const v1::Job& job) ABSL_NO_THREAD_SAFETY_ANALYSIS {  // under mu
      if (Terminal(job.state())) return;
      for (const std::string& id : ReadBy(job, roots)) facts.read_by_live_jobs.insert(id);
    });
    for (const GcPlanEntry& e : PlanGc(facts, request.policy())) {
      v1::GcDecision* d = resp.add_decisions();
      *d->mutable_artifact() = *e.artifact;
      d->set_deleted(e.remove);
      d->set_reason(e.reason);
      if (e.remove) {
        resp.set_bytes_freed(resp.bytes_freed() + e.artifact->bytes());
        doomed.emplace_back(*e.artifact, e.reason);
      }
    }
  }
  if (!request.apply() || doomed.empty()) return resp;
  absl::flat_hash_map<std::string, std::string> errors;
  for (const auto& [a, reason] : doomed) {
    absl::Status st = InsideARoot(a.path(), roots);
    if (st.ok()) st = RemoveArtifactFiles(a.path());
    if (!st.ok()) errors[a.id()] = std::string(st.message());
  }
  uint64_t ticket;
  {
    absl::MutexLock lock(&core_->mu);
    Changes changes = core_->NewChanges();
    const int64_t now = core_->clock->WallMs();
    for (const auto& [old, reason] : doomed) {
      if (errors.contains(old.id())) continue;
      auto it = by_id_.find(old.id());
      if (it == by_id_.end()) continue;
      v1::Artifact a = it->second;
      a.set_state(v1::ARTIFACT_DELETED);
      a.set_deleted_ms(now);
      a.set_deleted_by(absl::StrCat("gc-", now, ": ", reason));
      Put(std::move(a), &changes);
      spdlog::info("gc: deleted {} ({}): {}", old.id(), old.path(), reason);
    }
    ticket = core_->Finish(std::move(changes));
  }
  core_->Wait(ticket);
  int64_t freed = 0;
  for (auto& d : *resp.mutable_decisions()) {
    if (!d.deleted()) continue;
    if (auto it = errors.find(d.artifact().id()); it != errors.end()) {
      d.set_deleted(false);
      d.set_error(it->second);
    } else {
      freed += d.artifact().bytes();
      d.mutable_artifact()->set_state(v1::ARTIFACT_DELETED);
    }
  }
  resp.set_bytes_freed(freed);
  return resp;
}

}  // namespace stemma::coordinator
