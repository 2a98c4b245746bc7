#include "coordinator/memoization.h"

#include <glob.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/engine_spec.h"
#include "common/job_spec.h"
#include "common/sha256.h"
#include "coordinator/artifact_files.h"
#include "coordinator/exec_cache_key.h"
#include "google/protobuf/util/message_differencer.h"
#include "nlohmann/json.hpp"
#include "stemma/v1/spec_options.pb.h"
#include "stemma/v1/specs/merge.pb.h"

namespace stemma::coordinator {
namespace {

namespace pb = google::protobuf;

bool Runs(const v1::Job& job) {
  return job.state() == v1::QUEUED || job.state() == v1::ASSIGNED || job.state() == v1::RUNNING;
}

std::string Sha256(std::string_view data) {
  return Sha256Hex(absl::string_view(data.data(), data.size()));
}

std::string InputIdentity(const std::string& path);  // below

// A glob (`raw/*.jsonl.gz`, an input tokenize and prepare expand): the files it matches now,
// in the order the engine reads them, each by name and content, so a file added, removed or
// changed under the pattern changes the key. The pattern itself when nothing matches here.
std::string GlobIdentity(const std::string& pattern) {
  glob_t g;
  std::memset(&g, 0, sizeof(g));
  std::vector<std::string> matched;
  if (::glob(pattern.c_str(), 0, nullptr, &g) == 0) {
    for (size_t i = 0; i < g.gl_pathc; ++i) {
      std::error_code ec;
      if (std::filesystem::is_regular_file(g.gl_pathv[i], ec)) matched.emplace_back(g.gl_pathv[i]);
    }
  }
  globfree(&g);
  if (matched.empty()) return pattern;
  std::sort(matched.begin(), matched.end());
  std::string listing;
  for (const std::string& m : matched) absl::StrAppend(&listing, m, " ", InputIdentity(m), "\n");
  return "glob:sha256:" + Sha256(listing);
}

// What an input path stands for in the key: its manifest's hash when readable here
// (coordinator/artifact_files.h), else the path itself.
std::string InputIdentity(const std::string& path) {
  if (path.find_first_of("*?[") != std::string::npos) return GlobIdentity(path);
  if (auto manifest = ReadArtifactManifest(path)) return "sha256:" + Sha256(*manifest);
  return path;
}

void Canonicalize(pb::Message* m) {
  const pb::Descriptor* d = m->GetDescriptor();
  const pb::Reflection* r = m->GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const pb::FieldDescriptor* f = d->field(i);
    if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE) {
      if (f->is_map()) continue;
      if (f->is_repeated()) {
        for (int k = 0; k < r->FieldSize(*m, f); ++k)
          Canonicalize(r->MutableRepeatedMessage(m, f, k));
      } else if (r->HasField(*m, f)) {
        Canonicalize(r->MutableMessage(m, f));
      }
      continue;
    }
    const int role = f->options().GetExtension(v1::rules).role();
    if (role == v1::ROLE_OUTPUT_PATH) {
      r->ClearField(m, f);
      continue;
    }
    if ((role != v1::ROLE_INPUT_MODEL && role != v1::ROLE_INPUT_PATH) ||
        f->cpp_type() != pb::FieldDescriptor::CPPTYPE_STRING) {
      continue;
    }
    if (f->is_repeated()) {
      for (int k = 0; k < r->FieldSize(*m, f); ++k)
        r->SetRepeatedString(m, f, k, InputIdentity(r->GetRepeatedString(*m, f, k)));
    } else if (r->HasField(*m, f) || !r->GetString(*m, f).empty()) {
      r->SetString(m, f, InputIdentity(r->GetString(*m, f)));
    }
  }
}

}  // namespace

std::string CacheKey(const v1::JobSpec& spec, const std::string& engine_build) {
  // An exec job's key is of its own (exec_cache_key.h): no engine build in it.
  if (spec.has_exec()) return ExecCacheKey(spec);
  const pb::Message* engine = EngineSpecOf(spec);
  if (engine == nullptr) return "";
  std::unique_ptr<pb::Message> copy(engine->New());
  copy->CopyFrom(*engine);
  FillSpecDefaults(copy.get());
  Canonicalize(copy.get());
  if (auto* merge = dynamic_cast<v1::MergeSpec*>(copy.get());
      merge != nullptr && merge->method() == "linear") {
    // A uniform soup does not depend on the order of its models.
    bool uniform = true;
    for (const auto& m : merge->models())
      uniform &= !m.has_weight() || m.weight() == merge->models(0).weight();
    if (uniform) {
      std::sort(
          merge->mutable_models()->begin(), merge->mutable_models()->end(),
          [](const v1::MergeModel& a, const v1::MergeModel& b) { return a.path() < b.path(); });
    }
  }
  // Canonical: nlohmann's objects sort their keys, so map fields (family_weights) hash the
  // same whatever order protobuf's map iterates in.
  const std::string json = nlohmann::json::parse(SpecToJson(*copy), nullptr, false).dump();
  if (json.find("${{") != std::string::npos) return "";
  return Sha256(absl::StrCat(JobKind(spec), "\n", json, "\n", engine_build));
}

bool OutputsStillThere(const pb::Map<std::string, std::string>& outputs) {
  if (outputs.empty()) return false;
  for (const auto& [name, path] : outputs) {
    if (!ArtifactFilesPresent(path)) return false;
  }
  return true;
}

void Memoizer::Load(const v1::Job& job) {
  if (job.cache_key().empty()) return;
  if (job.state() == v1::SUCCEEDED && job.attempts() > 0) memo_[job.cache_key()] = job.id();
  if (Runs(job)) inflight_.emplace(job.cache_key(), job.id());
}

const v1::Job* Memoizer::FindHit(v1::Job* job, const std::string& engine_build) {
  const auto& labels = job->spec().labels();
  if (!IsEngineJob(job->spec()) && !IsMemoizedExec(job->spec())) return nullptr;
  if (auto it = labels.find("stemma.cache"); it != labels.end() && it->second == "false")
    return nullptr;
  const std::string key = CacheKey(job->spec(), engine_build);
  job->set_cache_key(key);
  if (key.empty()) return nullptr;
  bool gone = false;
  const v1::Job* source = Lookup(*job, key, &gone);
  if (gone) memo_.erase(key);  // a hit whose outputs are gone is a miss, and the entry goes
  return source;
}

const v1::Job* Memoizer::Lookup(const v1::Job& job, const std::string& key, bool* gone) const {
  auto hit = memo_.find(key);
  if (hit == memo_.end() || hit->second == job.id()) return nullptr;
  const v1::Job* source = find_(hit->second);
  if (source == nullptr || source->state() != v1::SUCCEEDED ||
      !OutputsStillThere(source->outputs())) {
    *gone = true;
    return nullptr;
  }
  if (!source->early_stop().empty()) {
    // A trial stopped early stands for this one only under the same early stopping.
    if (!job.spec().has_early_stop_rule() || !source->spec().has_early_stop_rule() ||
        !google::protobuf::util::MessageDifferencer::Equals(job.spec().early_stop_rule(),
                                                            source->spec().early_stop_rule())) {
      return nullptr;
    }
  }
  if (guard_ && !guard_(*source, job).empty()) return nullptr;
  return source;
}

Memoizer::Prediction Memoizer::Predict(const v1::Job& job, const std::string& engine_build) const {
  Prediction p;
  if (!IsEngineJob(job.spec())) return p;
  const auto& labels = job.spec().labels();
  if (auto it = labels.find("stemma.cache"); it != labels.end() && it->second == "false") return p;
  p.key = CacheKey(job.spec(), engine_build);
  if (p.key.empty()) return p;
  bool gone = false;
  p.hit = Lookup(job, p.key, &gone);
  if (p.hit != nullptr) return p;
  if (auto twin = inflight_.find(p.key); twin != inflight_.end()) {
    const v1::Job* running = find_(twin->second);
    if (running != nullptr && Runs(*running) && running->cache_key() == p.key &&
        (!guard_ || guard_(*running, job).empty())) {
      p.twin = running;
    }
  }
  return p;
}

const v1::Job* Memoizer::FindTwin(v1::Job* job) {
  // FindHit left no key on what is not memoized (not an engine job, cache: false).
  const std::string& key = job->cache_key();
  if (key.empty()) return nullptr;
  auto twin = inflight_.find(key);
  if (twin != inflight_.end() && twin->second != job->id()) {
    const v1::Job* running = find_(twin->second);
    if (running != nullptr && Runs(*running) && running->cache_key() == key) {
      (*job->mutable_spec()->mutable_labels())[kWaitsForLabel] = running->id();
      return running;
    }
  }
  job->mutable_spec()->mutable_labels()->erase(kWaitsForLabel);
  inflight_[key] = job->id();
  return nullptr;
}

void Memoizer::Leave(const v1::Job& job) {
  auto it = inflight_.find(job.cache_key());
  if (it != inflight_.end() && it->second == job.id()) inflight_.erase(it);
}

void Memoizer::Succeeded(v1::Job* job) {
  if (job->cache_key().empty()) return;
  // The key names the engine build that produced the outputs (the one it ran on), whatever
  // build the key was first computed with at release (none, when the job was released
  // before any worker had registered: then no later lookup, which uses a worker's build,
  // would have found it, and a restarted coordinator recomputed everything).
  Leave(*job);  // under the key it ran with: the key is recomputed below
  if (!job->engine_build_id().empty()) {
    const std::string key = CacheKey(job->spec(), job->engine_build_id());
    if (!key.empty()) job->set_cache_key(key);
  }
  memo_[job->cache_key()] = job->id();
}

}  // namespace stemma::coordinator
