#include "coordinator/experiment_revisions.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/engine_cli.h"
#include "common/engine_spec.h"
#include "common/files.h"
#include "common/job_spec.h"
#include "common/sha256.h"
#include "common/status.h"
#include "coordinator/exec_cache_key.h"
#include "coordinator/experiments/cost.h"
#include "coordinator/memory_check.h"
#include "coordinator/wiring.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/json_util.h"

namespace stemma::coordinator {
namespace {

namespace pb = google::protobuf;

std::string Json(const pb::Message& m) {
  std::string out;
  pb::util::JsonPrintOptions o;
  o.preserve_proto_field_names = true;
  (void)pb::util::MessageToJsonString(m, &out, o);
  return out;
}

// What identifies a cell's work: its job spec as the expansion wrote it (before any
// labels this service adds).
// Deterministic serialization: map fields (labels) in key order.
std::string CellHash(const v1::JobSpec& spec) {
  std::string bytes;
  {
    pb::io::StringOutputStream raw(&bytes);
    pb::io::CodedOutputStream out(&raw);
    out.SetSerializationDeterministic(true);
    spec.SerializeToCodedStream(&out);
  }
  return Sha256Hex(bytes).substr(0, 16);
}

// "name:hash,name:hash" over the set top-level fields of the engine spec as the expansion
// wrote it (tokens, not wired paths), so a later revision can name the fields it changed.
std::string FieldHashes(const v1::JobSpec& spec) {
  const pb::Message* engine = EngineSpecOf(spec);
  if (engine == nullptr) return "";
  std::vector<std::string> parts;
  const pb::Reflection* r = engine->GetReflection();
  std::vector<const pb::FieldDescriptor*> fields;
  r->ListFields(*engine, &fields);
  for (const pb::FieldDescriptor* f : fields) {
    std::unique_ptr<pb::Message> one(engine->New());
    std::vector<const pb::FieldDescriptor*> just = {f};
    r->SwapFields(one.get(), const_cast<pb::Message*>(engine), just);  // swapped back below
    std::string bytes;
    {
      pb::io::StringOutputStream raw(&bytes);
      pb::io::CodedOutputStream out(&raw);
      out.SetSerializationDeterministic(true);
      one->SerializeToCodedStream(&out);
    }
    r->SwapFields(one.get(), const_cast<pb::Message*>(engine), just);
    parts.push_back(absl::StrCat(f->name(), ":", Sha256Hex(bytes).substr(0, 6)));
  }
  std::string out = absl::StrJoin(parts, ",");
  return out.size() <= 253 ? out : "";
}

std::vector<std::string> ChangedByHashes(const std::string& before, const std::string& after,
                                         const std::string& kind) {
  std::map<std::string, std::string> a, b;
  for (absl::string_view p : absl::StrSplit(before, ',', absl::SkipEmpty())) {
    auto colon = p.find(':');
    a[std::string(p.substr(0, colon))] = std::string(p.substr(colon + 1));
  }
  for (absl::string_view p : absl::StrSplit(after, ',', absl::SkipEmpty())) {
    auto colon = p.find(':');
    b[std::string(p.substr(0, colon))] = std::string(p.substr(colon + 1));
  }
  std::vector<std::string> out;
  std::set<std::string> names;
  for (const auto& [k, v] : a) names.insert(k);
  for (const auto& [k, v] : b) names.insert(k);
  for (const std::string& n : names) {
    if (n == "out") continue;
    if (a[n] != b[n]) out.push_back(absl::StrCat(kind, ".", n));
  }
  return out;
}

// A field's value as text (a map's entries sorted: their order is not the value's).
std::string FieldText(const pb::Message& m, const pb::FieldDescriptor* f) {
  const pb::Reflection* r = m.GetReflection();
  if (!f->is_repeated()) {
    if (f->has_presence() && !r->HasField(m, f)) return "";
    std::string v;
    pb::TextFormat::PrintFieldValueToString(m, f, -1, &v);
    return v;
  }
  std::vector<std::string> items;
  for (int k = 0; k < r->FieldSize(m, f); ++k) {
    std::string v;
    pb::TextFormat::PrintFieldValueToString(m, f, k, &v);
    items.push_back(std::move(v));
  }
  if (f->is_map()) std::sort(items.begin(), items.end());
  return absl::StrJoin(items, "\n");
}

// The leaves where two engine specs differ ("optimizer.lr"), through singular submessages;
// a leaf whose new value holds a token (an input wired from upstream, the output path the
// expansion chose) is not a change.
void DiffPaths(const pb::Message& a, const pb::Message& b, const std::string& prefix,
               std::vector<std::string>* out) {
  const pb::Descriptor* d = b.GetDescriptor();
  const pb::Reflection* r = b.GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const pb::FieldDescriptor* f = d->field(i);
    const std::string path = prefix.empty() ? f->name() : absl::StrCat(prefix, ".", f->name());
    if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE && !f->is_repeated()) {
      if (r->HasField(a, f) || r->HasField(b, f))
        DiffPaths(r->GetMessage(a, f), r->GetMessage(b, f), path, out);
      continue;
    }
    const std::string now = FieldText(b, f);
    if (now.find("${{") != std::string::npos) continue;
    if (FieldText(a, f) != now) out->push_back(path);
  }
}

// The changed top-level fields (`kind.field`) made precise: each replaced by the leaves
// under it that differ between `before` and `after` (train.optimizer → train.optimizer.lr).
std::vector<std::string> Refine(const std::vector<std::string>& fields, const v1::JobSpec& before,
                                const v1::JobSpec& after) {
  const pb::Message* a = EngineSpecOf(before);
  const pb::Message* b = EngineSpecOf(after);
  if (a == nullptr || b == nullptr || a->GetDescriptor() != b->GetDescriptor()) return fields;
  std::vector<std::string> leaves;
  DiffPaths(*a, *b, JobKind(after), &leaves);
  std::vector<std::string> out;
  for (const std::string& field : fields) {
    size_t under = 0;
    for (const std::string& leaf : leaves) {
      if (leaf != field && !absl::StartsWith(leaf, field + ".")) continue;
      if (++under <= 4) out.push_back(leaf);
    }
    if (under == 0) out.push_back(field);
  }
  return out;
}

int Revision(const v1::Job& job) {
  auto it = job.spec().labels().find(kRevisionLabel);
  int r = 0;
  if (it != job.spec().labels().end()) (void)absl::SimpleAtoi(it->second, &r);
  return r;
}

// The jobs of `experiment` in namespace `space` (every namespace for "").
absl::StatusOr<std::vector<v1::Job>> JobsOf(UserHandler* users, const std::string& experiment,
                                            const std::string& space) {
  std::vector<v1::Job> out;
  v1::ListJobsRequest req;
  req.set_experiment(experiment);
  if (!space.empty()) (*req.mutable_labels())[kNamespaceLabel] = space;
  req.set_include_archived(true);  // an archived cell is still the experiment's
  req.set_page_size(1000);
  while (true) {
    ASSIGN_OR_RETURN(v1::ListJobsResponse page, users->ListJobs(req));
    for (auto& j : *page.mutable_jobs()) out.push_back(std::move(j));
    if (page.next_page_token().empty()) break;
    req.set_page_token(page.next_page_token());
  }
  return out;
}

// The top-level fields of two engine specs that differ (outputs and wired inputs aside).
std::vector<std::string> ChangedFields(const v1::JobSpec& before, const v1::JobSpec& after) {
  std::vector<std::string> out;
  if (JobKind(before) != JobKind(after)) return {"kind"};
  const pb::Message* a = EngineSpecOf(before);
  const pb::Message* b = EngineSpecOf(after);
  if (a == nullptr || b == nullptr) {
    if (Json(before) != Json(after)) out.push_back(JobKind(after));
  } else {
    const pb::Descriptor* d = a->GetDescriptor();
    for (int i = 0; i < d->field_count(); ++i) {
      const pb::FieldDescriptor* f = d->field(i);
      std::unique_ptr<pb::Message> x(a->New()), y(b->New());
      const pb::Reflection* r = a->GetReflection();
      x->CopyFrom(*a);
      y->CopyFrom(*b);
      for (int k = 0; k < d->field_count(); ++k) {
        if (k != i) {
          r->ClearField(x.get(), d->field(k));
          r->ClearField(y.get(), d->field(k));
        }
      }
      const std::string jx = Json(*x), jy = Json(*y);
      if (jx == jy) continue;
      if (jy.find("${{") != std::string::npos) continue;  // an input wired from upstream
      out.push_back(absl::StrCat(JobKind(after), ".", f->name()));
    }
  }
  for (const char* field : {"resources", "nodes", "max_attempts", "timeout_ms", "priority"}) {
    const pb::FieldDescriptor* f = v1::JobSpec::descriptor()->FindFieldByName(field);
    v1::JobSpec x, y;
    const pb::Reflection* r = x.GetReflection();
    if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE) {
      if (Json(r->GetMessage(before, f)) != Json(r->GetMessage(after, f))) out.push_back(field);
    } else {
      x.CopyFrom(before);
      y.CopyFrom(after);
      std::string vx, vy;
      pb::TextFormat::PrintFieldValueToString(x, f, -1, &vx);
      pb::TextFormat::PrintFieldValueToString(y, f, -1, &vy);
      if (vx != vy) out.push_back(field);
    }
  }
  return out;
}

// An unset `out` that the expansion placed under experiments/<name>/ goes below the owner's
// prefix of the storage root (coordinator/tenancy.h), so that two owners' experiments of one
// name never share a directory.
void PrefixDefaultOutput(v1::JobSpec* job, const std::string& experiment,
                         const std::string& owner) {
  pb::Message* engine = MutableEngineSpecOf(job);
  if (engine == nullptr) return;
  const pb::FieldDescriptor* out = engine->GetDescriptor()->FindFieldByName("out");
  if (out == nullptr || out->cpp_type() != pb::FieldDescriptor::CPPTYPE_STRING ||
      out->is_repeated()) {
    return;
  }
  const std::string value = engine->GetReflection()->GetString(*engine, out);
  if (absl::StartsWith(value, absl::StrCat("experiments/", experiment, "/")) &&
      absl::EndsWith(value, "/${{ self.id }}")) {
    engine->GetReflection()->SetString(engine, out, absl::StrCat(owner, "/", value));
  }
}

v1::Experiment Summary(const experiments::ExperimentPlan& plan) {
  v1::Experiment e;
  e.set_name(plan.name);
  e.set_jobs(static_cast<int32_t>(plan.cells.size()));
  e.set_edges(plan.edges);
  e.set_gpus(plan.gpus);
  e.set_gpu_hours_estimate(plan.gpu_hours_estimate);
  e.set_unknown_cost_jobs(plan.unknown_cost_cells);
  return e;
}

// The latest revision of an experiment so far.
struct Latest {
  std::vector<v1::Job> jobs;  // every revision's
  int revision = 0;
  std::map<std::string, const v1::Job*> cells;  // job name → its job in `revision`
};

absl::StatusOr<Latest> LatestOf(UserHandler* users, const std::string& experiment,
                                const std::string& space) {
  Latest l;
  ASSIGN_OR_RETURN(l.jobs, JobsOf(users, experiment, space));
  for (const v1::Job& j : l.jobs) l.revision = std::max(l.revision, Revision(j));
  for (const v1::Job& j : l.jobs) {
    if (Revision(j) == l.revision) l.cells[j.spec().name()] = &j;
  }
  return l;
}

// What the plan expects of one cell, against its job `prev` in the latest revision `last`.
struct CellDecision {
  std::string why;  // "run: ...", "cached: ...", "waits: ...", "skipped: ..."
  bool run = true;
  // An unchanged job of an earlier revision that has not ended: the new job waits for it
  // (the same cache key) rather than running beside it, so it goes on running.
  bool reuses_unfinished = false;
};

CellDecision Decide(const experiments::PlanCell& cell, const std::string& hash, const v1::Job* prev,
                    int last, const std::string& upstream, bool force) {
  CellDecision d;
  if (force) {
    d.why = "run: --force";
  } else if (prev == nullptr) {
    d.why = last == 0 ? "run: new experiment" : "run: new cell";
  } else if (auto ph = prev->spec().labels().find(kSpecHashLabel);
             ph == prev->spec().labels().end() || ph->second != hash) {
    v1::JobSpec defaulted = cell.spec;
    ApplyDefaults(&defaulted);
    std::vector<std::string> fields;
    auto pf = prev->spec().labels().find(kFieldsLabel);
    const std::string now = FieldHashes(cell.spec);
    if (pf != prev->spec().labels().end() && !pf->second.empty() && !now.empty()) {
      fields = ChangedByHashes(pf->second, now, JobKind(cell.spec));
    }
    if (fields.empty()) fields = ChangedFields(prev->spec(), defaulted);
    fields = Refine(fields, prev->spec(), defaulted);
    d.why =
        absl::StrCat("run: changed (", fields.empty() ? "spec" : absl::StrJoin(fields, ", "), ")");
  } else if (!upstream.empty()) {
    d.why = absl::StrCat("run: upstream ", upstream, " reruns");
  } else if (prev->state() == v1::CANCELLED && !prev->early_stop().empty()) {
    d.run = false;  // its upstream trial is served stopped again, so it is skipped again
    d.why = absl::StrCat("skipped: ", prev->early_stop(), " (revision ", last, ")");
  } else if (prev->state() != v1::SUCCEEDED) {
    if (!IsTerminal(prev->state()) && IsEngineJob(cell.spec)) {
      d.reuses_unfinished = true;
      d.run = false;
      d.why =
          absl::StrCat("waits: revision ", last, "'s ", prev->id(), " is ",
                       StateName(prev->state()), " (the same job: served from it when it ends)");
    } else {
      d.why =
          absl::StrCat("run: revision ", last, "'s ", prev->id(), " is ", StateName(prev->state()));
    }
  } else {
    d.run = false;
    d.why = absl::StrCat("cached: unchanged since revision ", last, " (", prev->id(), ")");
  }
  const bool skipped = d.why.rfind("skipped", 0) == 0;
  if (!IsEngineJob(cell.spec) && !d.run && !skipped) {
    // An exec job's key reads its code and inputs (exec_cache_key.h), which its spec does not
    // show: it is released again and served from the cache there when they are unchanged.
    d.why = IsMemoizedExec(cell.spec)
                ? std::string(
                      "run: exec (served from the cache if its code and inputs are "
                      "unchanged)")
                : absl::StrCat("run: ", JobKind(cell.spec), " jobs are not memoized");
  }
  if (!IsEngineJob(cell.spec) && !skipped) d.run = true;
  if (prev != nullptr && !IsTerminal(prev->state()) && !d.reuses_unfinished) {
    absl::StrAppend(&d.why, "; cancels revision ", last, "'s ", prev->id(), " (",
                    StateName(prev->state()), ")");
  }
  return d;
}

// What the cache is predicted to hold for the cells expanded so far: the outputs of those
// predicted to be served from it (what their dependents will read), and the stops of the
// trials among them that were stopped early.
struct CacheForecast {
  std::map<std::string, google::protobuf::Map<std::string, std::string>> outputs;
  std::set<std::string> stopped;  // job names
  std::set<std::string> twins;    // ids of running jobs that new cells wait for
};

std::string JobWhere(const v1::Job& job) {
  auto rev = job.spec().labels().find(kRevisionLabel);
  if (job.spec().experiment().empty() || rev == job.spec().labels().end())
    return job.spec().name().empty() ? "" : absl::StrCat(" (", job.spec().name(), ")");
  return absl::StrCat(" (", job.spec().experiment(), " revision ", rev->second, ", ",
                      job.spec().name(), ")");
}

// `stemma plan` predicts from the cache the submit will consult: the cell's job as it will
// be submitted, with what it reads wired from the cells predicted to be served from the
// cache, looked up under the key the job table will compute at release. Where the key is
// unknown here (it reads a cell that runs or waits), the comparison with revision `last`
// (`d` as Decide made it) stands.
void PredictFromCache(UserHandler* users, const v1::JobSpec& job, const v1::Job* prev, int last,
                      const std::string& hash, CacheForecast* forecast, CellDecision* d) {
  if (!IsEngineJob(job)) return;
  v1::JobSpec spec = job;
  std::set<std::string> pruned;
  for (const auto& dep : spec.depends_on()) {
    if (forecast->stopped.count(dep) > 0) pruned.insert(dep);
  }
  std::string stopped_read;
  if (!pruned.empty() && !DropReadsOf(&spec, pruned, &stopped_read)) {
    d->run = false;
    d->reuses_unfinished = false;
    d->why = absl::StrCat("skipped: upstream ", stopped_read, " stopped early (from the cache)");
    forecast->stopped.insert(job.name());
    return;
  }
  const absl::Status wired = WireInputs(
      &spec,
      [&](const std::string& name) -> const google::protobuf::Map<std::string, std::string>* {
        auto it = forecast->outputs.find(name);
        return it == forecast->outputs.end() ? nullptr : &it->second;
      },
      "plan");
  if (!wired.ok()) return;
  const CacheLookup l = users->LookUpCache(spec);
  if (!l.keyed) return;
  const bool prev_same = prev != nullptr && prev->spec().labels().count(kSpecHashLabel) > 0 &&
                         prev->spec().labels().at(kSpecHashLabel) == hash;
  bool waits_for_prev = false;
  if (l.hit.has_value()) {
    d->run = false;
    d->why = prev_same && prev->state() == v1::SUCCEEDED
                 ? absl::StrCat("cached: unchanged since revision ", last, " (", prev->id(), ")")
                 : absl::StrCat("cached: the same job ran as ", l.hit->id(), JobWhere(*l.hit));
    forecast->outputs[job.name()] = l.hit->outputs();
    if (!l.hit->early_stop().empty()) forecast->stopped.insert(job.name());
  } else if (l.twin.has_value()) {
    d->run = false;
    waits_for_prev = prev != nullptr && l.twin->id() == prev->id();
    forecast->twins.insert(l.twin->id());
    d->why = waits_for_prev ? absl::StrCat("waits: revision ", last, "'s ", prev->id(), " is ",
                                           StateName(prev->state()),
                                           " (the same job: served from it when it ends)")
                            : absl::StrCat("waits: ", l.twin->id(), JobWhere(*l.twin), " is ",
                                           StateName(l.twin->state()),
                                           " (the same job: served from it when it ends)");
  } else {
    d->run = true;
    if (prev_same && prev->state() == v1::SUCCEEDED) {
      d->why = absl::StrCat("run: not in the cache (the outputs of revision ", last, "'s ",
                            prev->id(), " are gone)");
    } else if (d->why.rfind("run", 0) != 0) {
      d->why = "run: not in the cache";
    } else if (const size_t at = d->why.find("; cancels revision"); at != std::string::npos) {
      d->why.resize(at);
    }
  }
  d->reuses_unfinished = waits_for_prev;
  if (prev != nullptr && !IsTerminal(prev->state()) && !waits_for_prev &&
      d->why.find("; cancels revision") == std::string::npos) {
    absl::StrAppend(&d->why, "; cancels revision ", last, "'s ", prev->id(), " (",
                    StateName(prev->state()), ")");
  }
}

// The cell as the response lists it.
void Describe(const experiments::PlanCell& cell, v1::ExperimentCell* out) {
  out->set_job_name(cell.job_name);
  out->set_stage(cell.stage);
  out->set_kind(JobKind(cell.spec));
  out->set_gpus(cell.spec.resources().gpus());
  for (const auto& [axis, v] : cell.coords) (*out->mutable_coords())[axis] = v;
  for (const auto& d : cell.spec.depends_on()) out->add_needs(d);
  if (cell.memory.has_value()) {
    out->set_memory_per_device_mb(cell.memory->MiB());
    out->set_memory_plan(cell.memory->Text());
  }
}

// Parameters of the model in `dir` from its config.json (experiments/cost.h's estimate).
std::optional<int64_t> ModelParamsOnDisk(const std::string& dir) {
  std::optional<int64_t> layers = ModelLayersFromConfig(dir);
  if (!layers.has_value()) return std::nullopt;
  absl::StatusOr<std::string> text = files::ReadFile(dir + "/config.json");
  if (!text.ok()) return std::nullopt;
  return experiments::ParamsFromConfig(*text, *layers);
}

}  // namespace

experiments::ExpansionEnv CoordinatorExpansionEnv() {
  experiments::ExpansionEnv env;
  env.model_params = ModelParamsOnDisk;
  env.model_shape = ModelShapeOnDisk;
  env.check_job = CheckJobAsSubmitted;
  return env;
}

absl::StatusOr<v1::SubmitExperimentResponse> ExperimentRevisions::Submit(
    const v1::SubmitExperimentRequest& request, const std::string& owner,
    const std::string& space) {
  if (request.text().size() > (8u << 20)) {
    return absl::InvalidArgumentError(absl::StrCat(request.file(), ": larger than 8 MiB"));
  }
  const std::string file = request.file().empty() ? "experiment" : request.file();
  experiments::ExpansionEnv env = CoordinatorExpansionEnv();
  size_t bytes = request.text().size();
  for (const auto& [name, text] : request.imports()) {
    bytes += text.size();
    env.imports[name] = text;
  }
  if (bytes > (8u << 20) || request.imports_size() > 16) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": with the files it extends, larger than 8 MiB or more than 16 files"));
  }
  ASSIGN_OR_RETURN(experiments::ExperimentPlan plan,
                   experiments::ExpandExperiment(request.text(), file, env));
  // The memory plan against the workers' devices, or GPUs of the size asked for.
  DeviceMemory memory = LargestDevices(users_->ListWorkers());
  if (request.gpu_memory_mb() > 0) {
    memory.gpu_bytes = static_cast<double>(request.gpu_memory_mb()) * 1024 * 1024;
    memory.gpu_source = "--gpu-memory";
  }
  plan.gpu_memory_bytes = memory.gpu_bytes;
  plan.cpu_memory_bytes = memory.cpu_bytes;
  ASSIGN_OR_RETURN(Latest latest, LatestOf(users_, plan.name, space));
  const int last = latest.revision;

  v1::SubmitExperimentResponse resp;
  *resp.mutable_experiment() = Summary(plan);
  resp.mutable_experiment()->set_revision(last + 1);
  resp.mutable_experiment()->set_owner(space);
  std::map<std::string, bool> reruns;  // job name → expected to run
  std::set<std::string> names;
  // Every unfinished job of an earlier revision that no new job waits for is superseded and
  // cancelled once this revision is in.
  std::set<std::string> reused_unfinished;
  CacheForecast forecast;
  v1::SubmitRequest submit;
  for (experiments::PlanCell& cell : plan.cells) {
    names.insert(cell.job_name);
    const std::string hash = CellHash(cell.spec);
    v1::ExperimentCell* out = resp.add_cells();
    Describe(cell, out);
    std::string upstream;
    for (const auto& d : cell.spec.depends_on()) {
      if (reruns[d] && upstream.empty()) upstream = d;
    }
    auto prev = latest.cells.find(cell.job_name);
    const v1::Job* p = prev == latest.cells.end() ? nullptr : prev->second;
    CellDecision d = Decide(cell, hash, p, last, upstream, request.force());
    if (!request.force() && p == nullptr && last > 0) resp.add_added(cell.job_name);
    if (!request.force() && p != nullptr && d.why.rfind("run: changed", 0) == 0)
      resp.add_changed(cell.job_name);

    v1::JobSpec job = cell.spec;
    auto& labels = *job.mutable_labels();
    labels[kRevisionLabel] = absl::StrCat(last + 1);
    labels[kSpecHashLabel] = hash;
    if (std::string fh = FieldHashes(cell.spec); !fh.empty()) labels[kFieldsLabel] = fh;
    if (!owner.empty()) labels["stemma.owner"] = owner;
    if (!space.empty()) labels[kNamespaceLabel] = space;
    if (!owner.empty()) PrefixDefaultOutput(&job, plan.name, owner);
    if (request.force()) labels["stemma.cache"] = "false";
    if (!request.force()) PredictFromCache(users_, job, p, last, hash, &forecast, &d);
    if (d.reuses_unfinished) reused_unfinished.insert(cell.job_name);
    reruns[cell.job_name] = d.run;
    out->set_plan(d.why);
    *submit.add_jobs() = std::move(job);
  }
  for (const auto& [name, job] : latest.cells) {
    if (names.count(name) == 0) resp.add_removed(name);
  }
  resp.set_plan(experiments::FormatPlan(plan));
  if (request.dry_run()) return resp;
  RETURN_IF_ERROR(CheckPlanFitsMemory(plan, memory));

  if (!request.idempotency_key().empty()) {
    submit.set_idempotency_key(absl::StrCat("exp:", space.empty() ? "" : space + "/", plan.name,
                                            ":", request.idempotency_key()));
  }
  ASSIGN_OR_RETURN(v1::SubmitResponse submitted, users_->Submit(submit));
  resp.set_existing(submitted.existing());
  for (int i = 0; i < resp.cells_size() && i < submitted.job_ids_size(); ++i) {
    resp.mutable_cells(i)->set_job_id(submitted.job_ids(i));
  }
  if (!submitted.existing()) {
    // Superseded: the unfinished jobs of earlier revisions that this one does not wait for
    // (changed, removed, downstream of a change, or everything under --force). A job that
    // has ended meanwhile refuses the cancel, which is fine.
    const std::string why = absl::StrCat("superseded by revision ", last + 1);
    for (const v1::Job& j : latest.jobs) {
      if (IsTerminal(j.state()) || reused_unfinished.count(j.spec().name()) > 0 ||
          forecast.twins.count(j.id()) > 0)
        continue;
      absl::StatusOr<v1::Job> cancelled = users_->Cancel(j.id(), why);
      (void)cancelled;
    }
  }
  return resp;
}

absl::StatusOr<v1::ListExperimentsResponse> ExperimentRevisions::List() {
  // By namespace and name: the same name in two namespaces is two experiments.
  std::map<std::pair<std::string, std::string>, std::vector<v1::Job>> jobs;
  v1::ListJobsRequest req;
  req.set_page_size(1000);
  while (true) {
    ASSIGN_OR_RETURN(v1::ListJobsResponse page, users_->ListJobs(req));
    for (auto& j : *page.mutable_jobs()) {
      if (j.spec().experiment().empty()) continue;
      auto space = j.spec().labels().find(kNamespaceLabel);
      jobs[{space == j.spec().labels().end() ? "" : space->second, j.spec().experiment()}]
          .push_back(std::move(j));
    }
    if (page.next_page_token().empty()) break;
    req.set_page_token(page.next_page_token());
  }
  v1::ListExperimentsResponse resp;
  for (auto& [key, list] : jobs) {
    v1::Experiment e;
    e.set_owner(key.first);
    e.set_name(key.second);
    int last = 0;
    for (const v1::Job& j : list) last = std::max(last, Revision(j));
    e.set_revision(last);
    int64_t created = 0;
    for (const v1::Job& j : list) {
      if (Revision(j) != last) continue;
      e.set_jobs(e.jobs() + 1);
      (*e.mutable_states())[StateName(j.state())] += 1;
      if (created == 0 || j.created_ms() < created) created = j.created_ms();
    }
    e.set_created_ms(created);
    *resp.add_experiments() = std::move(e);
  }
  return resp;
}

absl::StatusOr<v1::GetExperimentResponse> ExperimentRevisions::Get(
    const v1::GetExperimentRequest& request) {
  ASSIGN_OR_RETURN(std::vector<v1::Job> list, JobsOf(users_, request.name(), request.owner()));
  if (list.empty()) return absl::NotFoundError(absl::StrCat("no experiment ", request.name()));
  int revision = request.revision();
  if (revision <= 0) {
    for (const v1::Job& j : list) revision = std::max(revision, Revision(j));
  }
  v1::GetExperimentResponse resp;
  v1::Experiment* e = resp.mutable_experiment();
  e->set_name(request.name());
  e->set_revision(revision);
  e->set_owner(request.owner());
  for (const v1::Job& j : list) {
    if (Revision(j) != revision) continue;
    e->set_jobs(e->jobs() + 1);
    (*e->mutable_states())[StateName(j.state())] += 1;
    v1::ExperimentCell* c = resp.add_cells();
    c->set_job_name(j.spec().name());
    c->set_job_id(j.id());
    auto stage = j.spec().labels().find("stage");
    if (stage != j.spec().labels().end()) c->set_stage(stage->second);
    c->set_kind(JobKind(j.spec()));
    c->set_gpus(j.spec().resources().gpus());
    c->set_state(j.state());
    c->set_reason(j.reason());
    c->set_early_stop(j.early_stop());
    c->set_step(j.progress().step());
    c->set_fraction(j.progress().fraction());
    for (const auto& d : j.spec().depends_on()) c->add_needs(d);
  }
  if (resp.cells_size() == 0) {
    return absl::NotFoundError(
        absl::StrCat("experiment ", request.name(), " has no revision ", revision));
  }
  return resp;
}

}  // namespace stemma::coordinator
