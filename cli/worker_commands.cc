// workers, drain.
#include <CLI/CLI.hpp>
#include <iostream>
#include <memory>

#include "cli/client.h"
#include "cli/command.h"
#include "common/status.h"

namespace stemma::cli {
namespace {

absl::StatusOr<int> RunWorkers(const GlobalOptions& g) {
  CoordinatorClient client(g.coordinator, g.timeout());
  ASSIGN_OR_RETURN(v1::ListWorkersResponse response, client.ListWorkers());
  std::vector<v1::WorkerInfo> workers(response.workers().begin(), response.workers().end());
  switch (g.format) {
    case OutputFormat::kJson:
    case OutputFormat::kYaml:
    case OutputFormat::kName:
    case OutputFormat::kJsonPath: {
      nlohmann::json array = nlohmann::json::array();
      for (const auto& w : workers) array.push_back(WorkerToJson(w));
      PrintStructured(array, g.format);
      break;
    }
    default:
      PrintTable(RenderWorkersTable(workers, g.format == OutputFormat::kWide, NowMs()));
  }
  return 0;
}

struct DrainOptions {
  std::string worker;
  bool undo = false;
};

absl::StatusOr<int> RunDrain(const GlobalOptions& g, const DrainOptions& o) {
  CoordinatorClient client(g.coordinator, g.timeout());
  ASSIGN_OR_RETURN(v1::WorkerInfo worker, client.Drain(o.worker, o.undo));
  if (IsStructured(g.format)) {
    PrintStructured(WorkerToJson(worker), g.format);
  } else {
    std::cout << worker.id() << " " << WorkerStateName(worker.state()) << "\n";
  }
  return 0;
}

}  // namespace

void AddWorkerCommands(CLI::App* app, const GlobalOptions* globals, Action* action) {
  {
    CLI::App* sub = app->add_subcommand("workers", "List workers and their resources");
    sub->callback([=] { *action = [=] { return RunWorkers(*globals); }; });
  }
  {
    auto o = std::make_shared<DrainOptions>();
    CLI::App* sub =
        app->add_subcommand("drain", "Stop placing new work on a worker (running attempts finish)");
    sub->add_option("worker", o->worker, "worker id")->required();
    sub->add_flag("--undo", o->undo, "accept new work again");
    sub->callback([=] { *action = [=] { return RunDrain(*globals, *o); }; });
  }
}

}  // namespace stemma::cli
