// The `stemma` command: parses flags, runs the chosen subcommand, and turns any error into
// one line on stderr.
#include <CLI/CLI.hpp>
#include <cstdlib>
#include <iostream>
#include <string>

#include "absl/strings/str_replace.h"
#include "cli/command.h"

namespace {

int PrintError(const std::string& message, int code) {
  std::string line = absl::StrReplaceAll(message, {{"\r", " "}, {"\n", " "}});
  std::cout.flush();
  std::cerr << "stemma: error: " << line << std::endl;
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  using stemma::cli::GlobalOptions;
  GlobalOptions globals;
  if (const char* env = std::getenv("STEMMA_COORDINATOR"); env != nullptr && *env != '\0') {
    globals.coordinator = env;
  }
  stemma::cli::Action action;

  CLI::App app{"Stemma: run and watch jobs on a Stemma coordinator", "stemma"};
  app.fallthrough();  // global flags may follow the subcommand: `stemma ls -o json`
  app.require_subcommand(1);
  app.add_option("--coordinator", globals.coordinator,
                 "coordinator HOST:PORT (default $STEMMA_COORDINATOR, else localhost:7070)");
  app.add_option("-o,--output", globals.output, "table | wide | json | yaml (default table)");
  app.add_option("--timeout", globals.timeout_s,
                 "seconds to wait for each request to the coordinator (default 10)");
  app.add_option("--ca", globals.ca_file,
                 "PEM CA of the coordinator's TLS certificate (default $STEMMA_CA, else "
                 "~/.config/stemma/ca.pem if present; none: plaintext)");
  app.add_option("--token-file", globals.token_file,
                 "file holding the token, mode 0600 (default $STEMMA_TOKEN, else "
                 "~/.config/stemma/token if present)");

  stemma::cli::AddJobCommands(&app, &globals, &action);
  stemma::cli::AddStreamCommands(&app, &globals, &action);
  stemma::cli::AddWorkerCommands(&app, &globals, &action);
  stemma::cli::AddUpCommand(&app, &globals, &action);
  stemma::cli::AddMetricsCommand(&app, &globals, &action);
  stemma::cli::AddCkptCommands(&app, &globals, &action);
  stemma::cli::AddTokenCommand(&app, &globals, &action);
  stemma::cli::AddExplainCommand(&app, &globals, &action);
  stemma::cli::AddExperimentCommands(&app, &globals, &action);
  stemma::cli::AddReportCommand(&app, &globals, &action);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // CLI11 reports an unknown command as a missing one; name it instead.
    if (app.get_subcommands().empty()) {
      for (int i = 1; i < argc; ++i) {
        std::string arg = argv[i];
        if (arg == "--coordinator" || arg == "-o" || arg == "--output" || arg == "--timeout" ||
            arg == "--ca" || arg == "--token-file") {
          ++i;
        } else if (!arg.empty() && arg[0] != '-') {
          return PrintError("unknown command '" + arg + "' (see stemma --help)", 2);
        }
      }
    }
    return PrintError(e.what(), 2);
  }

  auto format = stemma::cli::ParseOutputFormat(globals.output);
  if (!format.ok()) return PrintError(std::string(format.status().message()), 2);
  globals.format = *format;
  if (!(globals.timeout_s > 0)) return PrintError("--timeout must be positive", 2);
  if (!action) return PrintError("no command given", 2);
  // The client reads these where every command builds it.
  if (!globals.ca_file.empty()) ::setenv("STEMMA_CA", globals.ca_file.c_str(), 1);
  if (!globals.token_file.empty()) {
    ::setenv("STEMMA_TOKEN_FILE", globals.token_file.c_str(), 1);
    ::unsetenv("STEMMA_TOKEN");  // the flag wins over the environment
  }

  // Nothing the coordinator sends reaches the terminal raw (cli/output.h).
  stemma::cli::GuardStdout();
  absl::StatusOr<int> result = action();
  if (!result.ok()) {
    return PrintError(std::string(result.status().message()),
                      stemma::cli::IsUsageError(result.status()) ? 2 : 1);
  }
  std::cout.flush();
  return *result;
}
