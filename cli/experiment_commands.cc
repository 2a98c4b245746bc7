// stemma sweep | plan | exp ls | exp get | exp wait | exp cancel: experiments, expanded and
// stored by the coordinator (coordinator/experiments/). The CLI only sends the file and
// prints what comes back.
#include <CLI/CLI.hpp>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cli/client.h"
#include "cli/command.h"
#include "common/job_spec.h"
#include "common/status.h"
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

struct SweepOptions {
  std::string file;
  bool dry_run = false;
  bool force = false;
  std::string idempotency_key;
};

absl::StatusOr<int> RunSweep(const GlobalOptions& g, const SweepOptions& o) {
  std::ifstream in(o.file, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(o.file, ": cannot read the experiment file"));
  std::stringstream text;
  text << in.rdbuf();
  v1::SubmitExperimentRequest request;
  request.set_file(o.file);
  request.set_text(text.str());
  request.set_dry_run(o.dry_run);
  request.set_force(o.force);
  request.set_idempotency_key(o.idempotency_key);
  CoordinatorClient client(g.coordinator, g.timeout());
  ASSIGN_OR_RETURN(v1::SubmitExperimentResponse r, client.SubmitExperiment(request));
  if (g.format == OutputFormat::kJson || g.format == OutputFormat::kYaml) {
    PrintStructured(ToJson(r), g.format);
    return 0;
  }
  const v1::Experiment& e = r.experiment();
  std::cout << (o.dry_run ? "plan of " : "submitted ") << e.name() << " revision " << e.revision()
            << (r.existing() ? " (already submitted with this key)" : "") << "\n";
  if (e.revision() > 1) {
    std::cout << "changes since revision " << e.revision() - 1 << ": " << r.added_size() << " added, "
              << r.changed_size() << " changed, " << r.removed_size() << " removed\n";
    for (const auto& n : r.added()) std::cout << "  + " << n << "\n";
    for (const auto& n : r.changed()) std::cout << "  ~ " << n << "\n";
    for (const auto& n : r.removed()) std::cout << "  - " << n << "\n";
  }
  std::cout << r.plan();
  int run = 0;
  for (const auto& c : r.cells()) {
    if (c.plan().rfind("run", 0) == 0) ++run;
    std::cout << (c.job_id().empty() ? "" : c.job_id() + " ") << c.job_name() << "  " << c.plan() << "\n";
  }
  std::cout << run << " of " << r.cells_size() << " jobs expected to run, "
            << r.cells_size() - run << " from the cache\n";
  return 0;
}

absl::StatusOr<int> RunList(const GlobalOptions& g) {
  CoordinatorClient client(g.coordinator, g.timeout());
  ASSIGN_OR_RETURN(v1::ListExperimentsResponse r, client.ListExperiments());
  if (g.format == OutputFormat::kJson || g.format == OutputFormat::kYaml) {
    PrintStructured(ToJson(r), g.format);
    return 0;
  }
  std::cout << "NAME\tREVISION\tJOBS\tSTATES\n";
  for (const auto& e : r.experiments()) {
    std::vector<std::string> states;
    for (const auto& [s, n] : e.states()) states.push_back(absl::StrCat(s, "=", n));
    std::sort(states.begin(), states.end());
    std::cout << e.name() << "\t" << e.revision() << "\t" << e.jobs() << "\t" << absl::StrJoin(states, ",") << "\n";
  }
  return 0;
}

struct GetOptions {
  std::string name;
  int revision = 0;
};

absl::StatusOr<int> RunGet(const GlobalOptions& g, const GetOptions& o) {
  CoordinatorClient client(g.coordinator, g.timeout());
  v1::GetExperimentRequest req;
  req.set_name(o.name);
  req.set_revision(o.revision);
  ASSIGN_OR_RETURN(v1::GetExperimentResponse r, client.GetExperiment(req));
  if (g.format == OutputFormat::kJson || g.format == OutputFormat::kYaml) {
    PrintStructured(ToJson(r), g.format);
    return 0;
  }
  std::cout << r.experiment().name() << " revision " << r.experiment().revision() << ": "
            << r.experiment().jobs() << " jobs\n";
  for (const auto& c : r.cells()) {
    std::cout << c.job_id() << "\t" << c.state() << "\t" << c.job_name();
    if (!c.reason().empty()) std::cout << "\t" << c.reason();
    std::cout << "\n";
  }
  return 0;
}

// Polls until every job of the latest revision has ended; 0 when all SUCCEEDED.
absl::StatusOr<int> RunWait(const GlobalOptions& g, const GetOptions& o, double timeout_s) {
  CoordinatorClient client(g.coordinator, g.timeout());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  std::string last;
  while (true) {
    v1::GetExperimentRequest req;
    req.set_name(o.name);
    req.set_revision(o.revision);
    ASSIGN_OR_RETURN(v1::GetExperimentResponse r, client.GetExperiment(req));
    int done = 0, ok = 0;
    for (const auto& c : r.cells()) {
      if (c.state() == "SUCCEEDED" || c.state() == "FAILED" || c.state() == "CANCELLED") ++done;
      if (c.state() == "SUCCEEDED") ++ok;
    }
    const std::string line = absl::StrCat(r.experiment().name(), ": ", done, "/", r.cells_size(), " ended, ", ok, " succeeded");
    if (line != last) std::cerr << line << "\n";
    last = line;
    if (done == r.cells_size()) {
      for (const auto& c : r.cells()) {
        if (c.state() != "SUCCEEDED") std::cout << c.job_id() << " " << c.job_name() << " " << c.state() << ": " << c.reason() << "\n";
      }
      return ok == r.cells_size() ? 0 : 1;
    }
    if (timeout_s > 0 && std::chrono::steady_clock::now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat("exp wait: ", line, " after ", timeout_s, " s"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
}

absl::StatusOr<int> RunCancel(const GlobalOptions& g, const GetOptions& o) {
  CoordinatorClient client(g.coordinator, g.timeout());
  v1::GetExperimentRequest req;
  req.set_name(o.name);
  ASSIGN_OR_RETURN(v1::GetExperimentResponse r, client.GetExperiment(req));
  int cancelled = 0;
  for (const auto& c : r.cells()) {
    if (c.state() == "SUCCEEDED" || c.state() == "FAILED" || c.state() == "CANCELLED") continue;
    if (client.Cancel(c.job_id(), absl::StrCat("experiment ", o.name, " cancelled")).ok()) ++cancelled;
  }
  std::cout << "cancelled " << cancelled << " jobs of " << o.name << "\n";
  return 0;
}

}  // namespace

void AddExperimentCommands(CLI::App* app, const GlobalOptions* globals, Action* action) {
  for (const char* name : {"sweep", "plan"}) {
    auto o = std::make_shared<SweepOptions>();
    const bool plan = std::string(name) == "plan";
    CLI::App* sub = app->add_subcommand(
        name, plan ? "Expand an experiment file and print its DAG and what would run (submits nothing)"
                   : "Submit an experiment file: the coordinator expands it into jobs");
    sub->add_option("-f,--file", o->file, "experiment file (YAML)")->required();
    if (!plan) {
      sub->add_flag("--dry-run", o->dry_run, "print the plan, submit nothing");
      sub->add_option("--idempotency-key", o->idempotency_key, "the same key submits once");
    }
    sub->add_flag("--force", o->force, "run every job, even where a cached result exists");
    sub->callback([=] {
      if (plan) o->dry_run = true;
      *action = [=] { return RunSweep(*globals, *o); };
    });
  }
  CLI::App* exp = app->add_subcommand("exp", "Experiments: ls, get, wait, cancel");
  exp->require_subcommand(1);
  CLI::App* ls = exp->add_subcommand("ls", "List experiments with their latest revision");
  ls->callback([=] { *action = [=] { return RunList(*globals); }; });
  auto get = std::make_shared<GetOptions>();
  CLI::App* g = exp->add_subcommand("get", "The jobs of an experiment's revision and their states");
  g->add_option("name", get->name, "experiment name")->required();
  g->add_option("--revision", get->revision, "revision (default: the latest)");
  g->callback([=] { *action = [=] { return RunGet(*globals, *get); }; });
  auto wait = std::make_shared<GetOptions>();
  auto wait_timeout = std::make_shared<double>(0);
  CLI::App* w = exp->add_subcommand("wait", "Wait until every job of the latest revision has ended");
  w->add_option("name", wait->name, "experiment name")->required();
  w->add_option("--timeout", *wait_timeout, "seconds (0: no limit)");
  w->callback([=] { *action = [=] { return RunWait(*globals, *wait, *wait_timeout); }; });
  auto cancel = std::make_shared<GetOptions>();
  CLI::App* c = exp->add_subcommand("cancel", "Cancel every unfinished job of the latest revision");
  c->add_option("name", cancel->name, "experiment name")->required();
  c->callback([=] { *action = [=] { return RunCancel(*globals, *cancel); }; });
}

}  // namespace stemma::cli
