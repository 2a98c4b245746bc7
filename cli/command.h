// What every subcommand shares: the global flags, and the way a subcommand hands its work
// back to main (so that parsing finishes before any RPC is made).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cli/output.h"

namespace CLI {
class App;
}  // namespace CLI

namespace stemma::cli {

// The global flags, filled by CLI11 before any action runs.
struct GlobalOptions {
  std::string coordinator = "localhost:7070";
  std::string output = "table";
  double timeout_s = 10;  // deadline for each unary call
  // TLS and token: main exports them as $STEMMA_CA / $STEMMA_TOKEN_FILE, where the client
  // (and any child `stemma up` starts) reads them.
  std::string ca_file;
  std::string token_file;

  OutputFormat format = OutputFormat::kTable;  // parsed from `output` by main
  absl::Duration timeout() const { return absl::Seconds(timeout_s); }
};

// The work of the selected subcommand. Returns the exit status (0 or 1 for commands like
// `wait` whose failure is an answer, not an error) or an error, which main prints as one
// line (exit 2 for usage errors, 1 otherwise).
using Action = std::function<absl::StatusOr<int>()>;

// Each group adds its subcommands to `app`; the callback of the chosen one stores its work
// in `*action`. `globals` and `action` outlive the app.
void AddJobCommands(CLI::App* app, const GlobalOptions* globals, Action* action);
void AddStreamCommands(CLI::App* app, const GlobalOptions* globals, Action* action);
void AddWorkerCommands(CLI::App* app, const GlobalOptions* globals, Action* action);
void AddUpCommand(CLI::App* app, const GlobalOptions* globals, Action* action);
void AddMetricsCommand(CLI::App* app, const GlobalOptions* globals, Action* action);
void AddCkptCommands(CLI::App* app, const GlobalOptions* globals, Action* action);
// `stemma sweep|plan -f FILE`, `stemma exp ls|get|wait|cancel`: experiments.
void AddExperimentCommands(CLI::App* app, const GlobalOptions* globals, Action* action);
// `stemma report EXPERIMENT`: the study's table and plots (docs/report.md).
void AddReportCommand(CLI::App* app, const GlobalOptions* globals, Action* action);
// `stemma explain [COMMAND] [--markdown]`: an engine spec's fields (local).
void AddExplainCommand(CLI::App* app, const GlobalOptions* globals, Action* action);
// `stemma token create`: a new bearer token (local; no coordinator involved).
void AddTokenCommand(CLI::App* app, const GlobalOptions* globals, Action* action);

// Prints `value` as one JSON document (json) or YAML document (yaml) to stdout.
void PrintStructured(const nlohmann::json& value, OutputFormat format);
// Wall-clock now in milliseconds.
int64_t NowMs();

}  // namespace stemma::cli
