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
class Validator;
}  // namespace CLI

namespace stemma::cli {

// The global flags, filled by CLI11 before any action runs.
struct GlobalOptions {
  // Flags beat the environment ($STEMMA_COORDINATOR, $STEMMA_CA, $STEMMA_TOKEN[_FILE]),
  // which beats the current context of the config file (cli/config.h); main resolves them.
  std::string coordinator = "localhost:7070";
  std::string context;  // --context: this context instead of the current one
  std::string output = "table";
  double request_timeout_s = 10;  // --request-timeout: deadline for each unary call
  // The global --timeout of earlier versions: before a waiting command (wait, watch, exp
  // wait, exp watch) it is that command's --timeout; before any other it is a deprecated
  // spelling of --request-timeout (main warns).
  double legacy_timeout_s = 0;
  double wait_timeout_s = 0;  // set by main from legacy_timeout_s for waiting commands
  // TLS and token: main exports them as $STEMMA_CA / $STEMMA_TOKEN_FILE, where the client
  // (and any child `stemma up` starts) reads them.
  std::string ca_file;
  std::string token_file;
  std::string space;  // the context's namespace: the default of `exp -n`
  bool no_headers = false;

  OutputFormat format = OutputFormat::kTable;  // parsed from `output` by main
  std::string jsonpath;                        // -o jsonpath=TEMPLATE: the template
  absl::Duration timeout() const { return absl::Seconds(request_timeout_s); }
  // A waiting command's limit: its own --timeout when given (> 0), else the global one.
  double WaitTimeout(double own) const { return own > 0 ? own : wait_timeout_s; }
};

// Exit statuses (docs/cli.md): every command exits with one of these.
enum ExitCode : int {
  kExitOk = 0,
  kExitFailed = 1,       // a job (or experiment) the command waited for failed; other errors
  kExitUsage = 2,        // bad flags, arguments or input files (nothing was sent)
  kExitRefused = 3,      // the coordinator refused: permission, quota, validation, unknown id
  kExitUnreachable = 4,  // the coordinator could not be reached or did not answer in time
  kExitTimedOut = 5,     // --timeout passed while waiting
};
// The exit status for an error an action returned.
int ExitCodeFor(const absl::Status& status);
// DEADLINE_EXCEEDED marked as a wait that ran out of --timeout (exit 5), not a request that
// went unanswered (exit 4).
absl::Status WaitTimedOut(const std::string& message);
// An error the coordinator answered with (client.cc marks each): exit 3 unless UNAVAILABLE
// or DEADLINE_EXCEEDED (4).
absl::Status FromCoordinator(absl::Status status);

// The work of the selected subcommand. Returns the exit status (0, or 1 for commands like
// `wait` whose failure is an answer, not an error) or an error, which main prints as one
// line and exits with ExitCodeFor(error).
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
// `stemma config ...` (contexts, local) and `stemma completion bash|zsh|fish`.
void AddConfigCommands(CLI::App* app, const GlobalOptions* globals, Action* action);
void AddCompletionCommand(CLI::App* app, const GlobalOptions* globals, Action* action);
// `stemma gc jobs`: archive or forget finished jobs.
void AddGcCommands(CLI::App* app, const GlobalOptions* globals, Action* action);

// Structured output: json, yaml, name and jsonpath (true for those formats).
bool IsStructured(OutputFormat format);
// Prints `value` as one JSON document (json), YAML document (yaml), its ids one a line
// (name: each item's "id", else "name") or through the -o jsonpath template (a list is
// given to it as {"items": [...]}, as kubectl does).
void PrintStructured(const nlohmann::json& value, OutputFormat format);
// A rendered table (first line the header) to stdout, without the header under --no-headers.
void PrintTable(const std::string& table);
// A duration flag's transform: "90", "90s", "10m", "2h", "30d" become seconds.
CLI::Validator DurationFlag();
// Main hands these over once parsing is done.
void SetOutputSettings(const std::string& jsonpath, bool no_headers);
// Wall-clock now in milliseconds.
int64_t NowMs();

}  // namespace stemma::cli
