// stemma sweep | plan | exp ls | get | wait | cancel | retry | watch: experiments, expanded and
// stored by the coordinator (coordinator/experiments/). The CLI only sends the file and
// prints what comes back.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "cli/client.h"
#include "cli/command.h"
#include "common/files.h"
#include "common/job_spec.h"
#include "common/status.h"
#include "common/yaml_json.h"
#include "google/protobuf/util/json_util.h"

namespace stemma::cli {
namespace {

nlohmann::json ToJson(const google::protobuf::Message& m) {
  std::string text;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(m, &text, options);
  return nlohmann::json::parse(text, nullptr, false);
}

bool Ended(const v1::ExperimentCell& c) { return IsTerminal(c.state()); }
// Succeeded, or skipped because a trial it read was stopped early: both are what the
// experiment asked for.
bool EndedWell(const v1::ExperimentCell& c) {
  return c.state() == v1::SUCCEEDED || (c.state() == v1::CANCELLED && !c.early_stop().empty());
}

struct SweepOptions {
  std::string file;
  bool dry_run = false;
  bool force = false;
  std::string idempotency_key;
  std::string gpu_memory;  // --gpu-memory: plan against GPUs of this size
};

// "80GiB", "80 GB", "81920MiB", "0.5TiB" → MiB; InvalidArgument naming --gpu-memory.
absl::StatusOr<int64_t> ParseGpuMemory(const std::string& text) {
  size_t end = 0;
  double value = 0;
  try {
    value = std::stod(text, &end);
  } catch (const std::exception&) {
    end = 0;
  }
  std::string unit = text.substr(end);
  unit.erase(std::remove(unit.begin(), unit.end(), ' '), unit.end());
  static const std::pair<const char*, double> kUnits[] = {{"MiB", 1},
                                                          {"M", 1},
                                                          {"MB", 1e6 / 1048576.0},
                                                          {"GiB", 1024},
                                                          {"G", 1024},
                                                          {"GB", 1e9 / 1048576.0},
                                                          {"TiB", 1048576},
                                                          {"TB", 1e12 / 1048576.0}};
  for (const auto& [name, mib] : kUnits) {
    if (end > 0 && unit == name && value > 0) return static_cast<int64_t>(value * mib);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--gpu-memory: '", text, "' is not a size such as 80GiB, 141GB or 81920MiB"));
}

// A reused idempotency key: the answer describes what the key submitted before, which may
// be another file; it is told from those jobs, never from the file given now.
absl::StatusOr<int> PrintAlreadySubmitted(CoordinatorClient& client,
                                          const v1::SubmitExperimentResponse& r) {
  std::vector<std::string> ids;
  for (const auto& c : r.cells()) {
    if (!c.job_id().empty()) ids.push_back(c.job_id());
  }
  std::string what = "an earlier submit";
  if (!ids.empty()) {
    auto job = client.GetJob(ids.front());
    if (job.ok() && !job->spec().experiment().empty()) {
      auto rev = job->spec().labels().find("stemma.revision");
      what = absl::StrCat(job->spec().experiment(), " revision ",
                          rev == job->spec().labels().end() ? "?" : rev->second);
    }
  }
  std::cout << "already submitted with this key: " << TerminalSafe(what)
            << (ids.empty() ? "" : absl::StrCat(" (first job ", ids.front(), ")"))
            << "; nothing new was submitted\n";
  return 0;
}

// The files `file` (holding `text`) extends, read relative to the file that names them, by
// the name the text gives them, recursively (the coordinator reads no client files; it
// resolves `extends:` from these, coordinator/experiments/extends.h).
absl::Status ReadImports(const std::string& file, const std::string& text,
                         google::protobuf::Map<std::string, std::string>* imports, int depth = 0) {
  absl::StatusOr<std::vector<YamlNode>> docs = LoadYamlDocuments(text, file);
  if (!docs.ok() || docs->size() != 1 || !(*docs)[0].IsMap()) return absl::OkStatus();
  const YamlNode* extends = (*docs)[0].Find("extends");
  if (extends == nullptr || !extends->IsScalar() || extends->scalar.empty() || depth > 8)
    return absl::OkStatus();  // the coordinator names what is wrong
  const std::string& name = extends->scalar;
  const std::filesystem::path path = std::filesystem::path(file).parent_path() / name;
  absl::StatusOr<std::string> base = files::ReadFile(path.string());
  if (!base.ok()) {
    return absl::NotFoundError(
        absl::StrCat(file, ": line ", extends->line, ": extends: cannot read ", path.string()));
  }
  auto [it, added] = imports->try_emplace(name, *base);
  if (!added) {
    if (it->second != *base) {
      return absl::InvalidArgumentError(
          absl::StrCat(file, ": extends: two different files are named '", name, "'"));
    }
    return absl::OkStatus();  // a cycle: the coordinator says so
  }
  return ReadImports(path.string(), *base, imports, depth + 1);
}

absl::StatusOr<int> RunSweep(const GlobalOptions& g, const SweepOptions& o) {
  absl::StatusOr<std::string> text = files::ReadFile(o.file);
  if (!text.ok()) {
    return absl::NotFoundError(absl::StrCat(o.file, ": cannot read the experiment file"));
  }
  v1::SubmitExperimentRequest request;
  request.set_file(o.file);
  RETURN_IF_ERROR(ReadImports(o.file, *text, request.mutable_imports()));
  request.set_text(*std::move(text));
  request.set_dry_run(o.dry_run);
  request.set_force(o.force);
  request.set_idempotency_key(o.idempotency_key);
  if (!o.gpu_memory.empty()) {
    ASSIGN_OR_RETURN(int64_t mib, ParseGpuMemory(o.gpu_memory));
    request.set_gpu_memory_mb(mib);
  }
  CoordinatorClient client(g.coordinator, g.timeout());
  ASSIGN_OR_RETURN(v1::SubmitExperimentResponse r, client.SubmitExperiment(request));
  if (IsStructured(g.format)) {
    PrintStructured(ToJson(r), g.format);
    return 0;
  }
  if (r.existing()) return PrintAlreadySubmitted(client, r);
  const v1::Experiment& e = r.experiment();
  std::cout << (o.dry_run ? "plan of " : "submitted ") << e.name() << " revision " << e.revision()
            << "\n";
  if (e.revision() > 1) {
    std::cout << "changes since revision " << e.revision() - 1 << ": " << r.added_size()
              << " added, " << r.changed_size() << " changed, " << r.removed_size() << " removed\n";
    for (const auto& n : r.added()) std::cout << "  + " << n << "\n";
    for (const auto& n : r.changed()) std::cout << "  ~ " << n << "\n";
    for (const auto& n : r.removed()) std::cout << "  - " << n << "\n";
  }
  std::cout << r.plan();
  int run = 0;
  for (const auto& c : r.cells()) {
    if (c.plan().rfind("run", 0) == 0) ++run;
    std::cout << (c.job_id().empty() ? "" : c.job_id() + " ") << c.job_name() << "  " << c.plan()
              << "\n";
  }
  int skipped = 0;
  for (const auto& c : r.cells()) skipped += c.plan().rfind("skipped", 0) == 0;
  std::cout << run << " of " << r.cells_size() << " jobs expected to run, "
            << r.cells_size() - run - skipped << " from the cache";
  if (skipped > 0) std::cout << ", " << skipped << " skipped (upstream stopped early)";
  int superseded = 0;
  for (const auto& c : r.cells())
    superseded += c.plan().find("; cancels revision") != std::string::npos;
  if (superseded > 0)
    std::cout << "; " << superseded
              << " unfinished jobs of the last revision superseded (cancelled)";
  std::cout << "\n";
  return 0;
}

absl::StatusOr<int> RunList(const GlobalOptions& g) {
  CoordinatorClient client(g.coordinator, g.timeout());
  ASSIGN_OR_RETURN(v1::ListExperimentsResponse r, client.ListExperiments());
  if (IsStructured(g.format)) {
    nlohmann::json list = ToJson(r)["experiments"];
    PrintStructured(list.is_array() ? list : nlohmann::json::array(), g.format);
    return 0;
  }
  std::vector<std::vector<std::string>> rows;
  for (const auto& e : r.experiments()) {
    std::vector<std::string> states;
    for (const auto& [s, n] : e.states()) states.push_back(absl::StrCat(s, "=", n));
    std::sort(states.begin(), states.end());
    rows.push_back(
        {e.name(), absl::StrCat(e.revision()), absl::StrCat(e.jobs()), absl::StrJoin(states, ",")});
  }
  PrintTable(RenderTable({"NAME", "REVISION", "JOBS", "STATES"}, rows));
  return 0;
}

struct GetOptions {
  std::string name;
  int revision = 0;
  std::string space;     // the namespace (a project or a subject); "": the caller's own
  double timeout_s = 0;  // wait, watch
};

// -n, else the context's namespace.
std::string Space(const GlobalOptions& g, const GetOptions& o) {
  return o.space.empty() ? g.space : o.space;
}

absl::StatusOr<int> RunGet(const GlobalOptions& g, const GetOptions& o) {
  CoordinatorClient client(g.coordinator, g.timeout());
  v1::GetExperimentRequest req;
  req.set_name(o.name);
  req.set_revision(o.revision);
  req.set_owner(Space(g, o));
  ASSIGN_OR_RETURN(v1::GetExperimentResponse r, client.GetExperiment(req));
  if (g.format == OutputFormat::kName) {
    for (const auto& c : r.cells()) {
      if (!c.job_id().empty()) std::cout << c.job_id() << "\n";
    }
    return 0;
  }
  if (IsStructured(g.format)) {
    PrintStructured(ToJson(r), g.format);
    return 0;
  }
  if (!g.no_headers) {
    std::cout << r.experiment().name() << " revision " << r.experiment().revision() << ": "
              << r.experiment().jobs() << " jobs\n";
  }
  std::vector<std::vector<std::string>> rows;
  for (const auto& c : r.cells()) {
    rows.push_back({c.job_id().empty() ? "-" : c.job_id(), StateName(c.state()), c.job_name(),
                    c.reason().empty() ? "-" : c.reason()});
  }
  PrintTable(RenderTable({"ID", "STATE", "NAME", "REASON"}, rows));
  return 0;
}

// The cells a wait or watch ends on: what did not end well, for people or as structured
// output.
int PrintOutcome(const GlobalOptions& g, const v1::GetExperimentResponse& r, int ok) {
  const int rc = ok == r.cells_size() ? 0 : 1;
  if (IsStructured(g.format)) {
    nlohmann::json out = {{"experiment", r.experiment().name()},
                          {"revision", r.experiment().revision()},
                          {"jobs", r.cells_size()},
                          {"succeeded_or_skipped", ok},
                          {"items", nlohmann::json::array()}};
    for (const auto& c : r.cells()) {
      if (!EndedWell(c)) {
        out["items"].push_back({{"id", c.job_id()},
                                {"name", c.job_name()},
                                {"state", StateName(c.state())},
                                {"reason", c.reason()}});
      }
    }
    PrintStructured(g.format == OutputFormat::kName ? out["items"] : out, g.format);
    return rc;
  }
  for (const auto& c : r.cells()) {
    if (!EndedWell(c))
      std::cout << c.job_id() << " " << c.job_name() << " " << StateName(c.state()) << ": "
                << c.reason() << "\n";
  }
  return rc;
}

// Polls until every job of the latest revision has ended; 0 when all SUCCEEDED.
absl::StatusOr<int> RunWait(const GlobalOptions& g, const GetOptions& o) {
  const double timeout_s = g.WaitTimeout(o.timeout_s);
  CoordinatorClient client(g.coordinator, g.timeout());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  std::string last;
  while (true) {
    v1::GetExperimentRequest req;
    req.set_name(o.name);
    req.set_revision(o.revision);
    req.set_owner(Space(g, o));
    ASSIGN_OR_RETURN(v1::GetExperimentResponse r, client.GetExperiment(req));
    int done = 0, ok = 0;
    for (const auto& c : r.cells()) {
      if (Ended(c)) ++done;
      if (EndedWell(c)) ++ok;
    }
    const std::string line = absl::StrCat(r.experiment().name(), ": ", done, "/", r.cells_size(),
                                          " ended, ", ok, " succeeded or skipped");
    if (line != last) std::cerr << line << "\n";
    last = line;
    if (done == r.cells_size()) return PrintOutcome(g, r, ok);
    if (timeout_s > 0 && std::chrono::steady_clock::now() > deadline) {
      return WaitTimedOut(absl::StrCat("exp wait: ", line, " after ", timeout_s, " s"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
}

absl::StatusOr<int> RunCancel(const GlobalOptions& g, const GetOptions& o) {
  CoordinatorClient client(g.coordinator, g.timeout());
  v1::GetExperimentRequest req;
  req.set_name(o.name);
  ASSIGN_OR_RETURN(v1::GetExperimentResponse r, client.GetExperiment(req));
  // The latest revision's unfinished jobs, and those of earlier revisions: a new revision
  // cancels what it supersedes, so what is left of those is what the latest one waits for.
  int cancelled = 0, earlier = 0;
  nlohmann::json ids = nlohmann::json::array();
  const int latest = r.experiment().revision();
  for (int revision = latest; revision >= 1; --revision) {
    if (revision != latest) {
      req.set_revision(revision);
      ASSIGN_OR_RETURN(r, client.GetExperiment(req));
    }
    for (const auto& c : r.cells()) {
      if (c.job_id().empty() || IsTerminal(c.state())) continue;
      if (client.Cancel(c.job_id(), absl::StrCat("experiment ", o.name, " cancelled")).ok()) {
        ++cancelled;
        ids.push_back({{"id", c.job_id()}, {"name", c.job_name()}, {"revision", revision}});
        earlier += revision != latest;
      }
    }
  }
  if (IsStructured(g.format)) {
    PrintStructured(
        g.format == OutputFormat::kName
            ? ids
            : nlohmann::json{{"experiment", o.name}, {"cancelled", cancelled}, {"items", ids}},
        g.format);
    return 0;
  }
  std::cout << "cancelled " << cancelled << " jobs of " << o.name;
  if (earlier > 0)
    std::cout << " (" << earlier << " of earlier revisions that the latest one waited for)";
  std::cout << "\n";
  return 0;
}

// Re-queues the FAILED and CANCELLED cells of the latest revision (not the ones skipped
// because a trial was stopped early), upstream first; what failed only because of them
// waits for them again (the coordinator's Retry).
absl::StatusOr<int> RunRetry(const GlobalOptions& g, const GetOptions& o) {
  CoordinatorClient client(g.coordinator, g.timeout());
  v1::GetExperimentRequest req;
  req.set_name(o.name);
  ASSIGN_OR_RETURN(v1::GetExperimentResponse r, client.GetExperiment(req));
  int retried = 0;
  std::vector<std::string> refused;
  nlohmann::json items = nlohmann::json::array();
  for (const auto& c : r.cells()) {  // in submission order: upstream first
    if (c.state() != v1::FAILED && c.state() != v1::CANCELLED) continue;
    if (!c.early_stop().empty()) continue;
    absl::StatusOr<v1::Job> job = client.GetJob(c.job_id());
    // A dependent an earlier retry already set waiting again.
    if (job.ok() && job->state() != v1::FAILED && job->state() != v1::CANCELLED) {
      ++retried;
      items.push_back({{"id", c.job_id()}, {"name", c.job_name()}});
      continue;
    }
    absl::StatusOr<v1::Job> again = client.Retry(c.job_id());
    if (again.ok()) {
      ++retried;
      items.push_back({{"id", c.job_id()}, {"name", c.job_name()}});
    } else {
      refused.push_back(
          absl::StrCat(c.job_id(), " ", c.job_name(), ": ", again.status().message()));
    }
  }
  if (IsStructured(g.format)) {
    PrintStructured(g.format == OutputFormat::kName
                        ? items
                        : nlohmann::json{{"experiment", o.name},
                                         {"revision", r.experiment().revision()},
                                         {"retried", retried},
                                         {"items", items},
                                         {"refused", refused}},
                    g.format);
    return refused.empty() ? 0 : 1;
  }
  std::cout << "retried " << retried << " jobs of " << o.name << " revision "
            << r.experiment().revision() << "\n";
  for (const auto& line : refused) std::cout << "  not retried: " << line << "\n";
  return refused.empty() ? 0 : 1;
}

// The progress messages of the experiment's running jobs (one listing; empty on error).
std::map<std::string, std::string> RunningMessages(CoordinatorClient& client,
                                                   const std::string& experiment) {
  std::map<std::string, std::string> out;
  v1::ListJobsRequest request;
  request.set_experiment(experiment);
  request.add_states(v1::RUNNING);
  request.set_page_size(1000);
  absl::StatusOr<v1::ListJobsResponse> page = client.ListJobs(request);
  if (!page.ok()) return out;
  for (const v1::Job& job : page->jobs()) {
    if (!job.progress().message().empty()) out[job.id()] = job.progress().message();
  }
  return out;
}

// The experiment live: cells by state, and each running cell's step, loss and tokens/s (its
// progress and the metric series' last values). Ends with the experiment (0 when every
// cell succeeded or was skipped for early stopping), or after `timeout_s`. A coordinator
// that goes away (a restart) is waited for, for up to a minute.
absl::StatusOr<int> RunWatch(const GlobalOptions& g, const GetOptions& o) {
  const double timeout_s = g.WaitTimeout(o.timeout_s);
  const auto start = std::chrono::steady_clock::now();
  auto lost_since = std::chrono::steady_clock::time_point::max();
  std::string last;
  while (true) {
    CoordinatorClient client(g.coordinator, g.timeout());
    v1::GetExperimentRequest req;
    req.set_name(o.name);
    req.set_owner(Space(g, o));
    absl::StatusOr<v1::GetExperimentResponse> got = client.GetExperiment(req);
    v1::QueryMetricsResponse metrics;
    std::map<std::string, std::string> messages;  // running job -> its progress message
    if (got.ok()) {
      v1::QueryMetricsRequest q;
      q.set_experiment(o.name);
      q.set_last_only(true);
      absl::StatusOr<v1::QueryMetricsResponse> m = client.QueryMetrics(q);
      if (m.ok()) metrics = *std::move(m);
      messages = RunningMessages(client, o.name);
    }
    const auto now = std::chrono::steady_clock::now();
    if (!got.ok()) {
      if (got.status().code() != absl::StatusCode::kUnavailable) return got.status();
      if (lost_since == std::chrono::steady_clock::time_point::max()) {
        lost_since = now;
        std::cerr << "coordinator unavailable; reconnecting\n";
      }
      if (now - lost_since > std::chrono::seconds(60)) return got.status();
    } else {
      lost_since = std::chrono::steady_clock::time_point::max();
      const v1::GetExperimentResponse& r = *got;
      std::map<std::string, std::map<std::string, double>> values;  // job → name → last
      for (const auto& p : metrics.points()) values[p.job_id()][p.name()] = p.value();
      std::map<std::string, int> states;
      int ended = 0, well = 0;
      std::string running;
      for (const auto& c : r.cells()) {
        ++states[c.state() == v1::CANCELLED && !c.early_stop().empty() ? "SKIPPED"
                                                                       : StateName(c.state())];
        ended += Ended(c);
        well += EndedWell(c);
        if (c.state() != v1::RUNNING) continue;
        absl::StrAppend(&running, "  ", c.job_id(), " ", c.job_name());
        if (c.step() > 0) {
          absl::StrAppend(&running, "  step ", c.step());
          if (c.fraction() > 0)
            absl::StrAppend(&running, "/",
                            static_cast<int64_t>(std::llround(c.step() / c.fraction())));
        }
        const auto& v = values[c.job_id()];
        if (auto it = v.find("loss"); it != v.end())
          absl::StrAppend(&running, "  loss ", absl::StrFormat("%.4g", it->second));
        if (auto it = v.find("tokens_per_s"); it != v.end())
          absl::StrAppend(&running, "  ", absl::StrFormat("%.0f", it->second), " tok/s");
        // An eval job's progress message names the task it is on.
        if (auto it = messages.find(c.job_id()); it != messages.end() && c.kind() == "eval") {
          absl::StrAppend(&running, "  task ", it->second);
        }
        if (!c.early_stop().empty()) absl::StrAppend(&running, "  stopping: ", c.early_stop());
        absl::StrAppend(&running, "\n");
      }
      std::vector<std::string> parts;
      for (const auto& [s, n] : states) parts.push_back(absl::StrCat(s, " ", n));
      const std::string screen =
          absl::StrCat(r.experiment().name(), " revision ", r.experiment().revision(), ": ",
                       absl::StrJoin(parts, ", "), "\n", running);
      if (screen != last) std::cout << screen << std::flush;
      last = screen;
      if (ended == r.cells_size()) return PrintOutcome(g, r, well);
    }
    if (timeout_s > 0 && now - start > std::chrono::duration<double>(timeout_s)) {
      return WaitTimedOut(
          absl::StrCat("exp watch: ", o.name, " still running after ", timeout_s, " s"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
}

}  // namespace

void AddExperimentCommands(CLI::App* app, const GlobalOptions* globals, Action* action) {
  for (const char* name : {"sweep", "plan"}) {
    auto o = std::make_shared<SweepOptions>();
    const bool plan = std::string(name) == "plan";
    CLI::App* sub = app->add_subcommand(
        name,
        plan ? "Expand an experiment file and print its DAG and what would run (submits nothing)"
             : "Submit an experiment file: the coordinator expands it into jobs");
    sub->add_option("-f,--file", o->file, "experiment file (YAML)")->required();
    if (!plan) {
      sub->add_flag("--dry-run", o->dry_run, "print the plan, submit nothing");
      sub->add_option("--idempotency-key", o->idempotency_key, "the same key submits once");
    }
    sub->add_flag("--force", o->force, "run every job, even where a cached result exists");
    sub->add_option("--gpu-memory", o->gpu_memory,
                    "plan memory against GPUs of this size (80GiB, 141GB) instead of the "
                    "connected workers'");
    sub->callback([=] {
      if (plan) o->dry_run = true;
      *action = [=] { return RunSweep(*globals, *o); };
    });
  }
  CLI::App* exp = app->add_subcommand("exp", "Experiments: ls, get, wait, watch, cancel, retry");
  exp->require_subcommand(1);
  CLI::App* ls = exp->add_subcommand("ls", "List experiments with their latest revision");
  ls->callback([=] { *action = [=] { return RunList(*globals); }; });
  auto get = std::make_shared<GetOptions>();
  CLI::App* g = exp->add_subcommand("get", "The jobs of an experiment's revision and their states");
  g->add_option("name", get->name, "experiment name")->required();
  g->add_option("--revision", get->revision, "revision (default: the latest)");
  constexpr const char* kNamespaceHelp =
      "the namespace to look the name up in: a project or a user (default: the context's, "
      "else your own)";
  g->add_option("-n,--namespace", get->space, kNamespaceHelp);
  g->callback([=] { *action = [=] { return RunGet(*globals, *get); }; });
  constexpr const char* kTimeoutHelp =
      "give up after this long: seconds or 90s, 10m, 2h (default: no limit); exit 5";
  auto wait = std::make_shared<GetOptions>();
  CLI::App* w = exp->add_subcommand(
      "wait",
      "Wait until every job of the latest revision has ended: exit 0 if all succeeded "
      "(or were skipped by early stopping), 1 otherwise, 5 on --timeout");
  w->add_option("name", wait->name, "experiment name")->required();
  w->add_option("--timeout", wait->timeout_s, kTimeoutHelp)->transform(DurationFlag());
  w->add_option("-n,--namespace", wait->space, kNamespaceHelp);
  w->callback([=] { *action = [=] { return RunWait(*globals, *wait); }; });
  auto cancel = std::make_shared<GetOptions>();
  CLI::App* c = exp->add_subcommand(
      "cancel",
      "Cancel every unfinished job of the experiment (the latest revision and what it waits for)");
  c->add_option("name", cancel->name, "experiment name")->required();
  c->callback([=] { *action = [=] { return RunCancel(*globals, *cancel); }; });
  auto retry = std::make_shared<GetOptions>();
  CLI::App* rt =
      exp->add_subcommand("retry", "Re-queue the failed and cancelled jobs of the latest revision");
  rt->add_option("name", retry->name, "experiment name")->required();
  rt->callback([=] { *action = [=] { return RunRetry(*globals, *retry); }; });
  auto watch = std::make_shared<GetOptions>();
  CLI::App* wt = exp->add_subcommand(
      "watch",
      "Show the experiment live until it ends: states, running jobs' step, loss, tokens/s");
  wt->add_option("name", watch->name, "experiment name")->required();
  wt->add_option("--timeout", watch->timeout_s, kTimeoutHelp)->transform(DurationFlag());
  wt->add_option("-n,--namespace", watch->space, kNamespaceHelp);
  wt->callback([=] { *action = [=] { return RunWatch(*globals, *watch); }; });
}

}  // namespace stemma::cli
