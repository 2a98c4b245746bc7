// The `stemma` command: parses flags, resolves where to connect (flags, environment, the
// config file's context), runs the chosen subcommand, and turns any error into one line on
// stderr and an exit status (cli/command.h, docs/cli.md).
#include <CLI/CLI.hpp>
#include <cstdlib>
#include <iostream>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "cli/command.h"
#include "cli/config.h"

#ifndef STEMMA_VERSION
#define STEMMA_VERSION "unknown"
#endif

namespace {

using stemma::cli::GlobalOptions;

int PrintError(const std::string& message, int code) {
  std::string line = absl::StrReplaceAll(message, {{"\r", " "}, {"\n", " "}});
  std::cout.flush();
  std::cerr << "stemma: error: " << line << std::endl;
  return code;
}

const char* Env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : nullptr;
}

// "wait", "exp wait", ...: the chosen command's path.
std::string CommandPath(const CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::App* at = &app;;) {
    auto subs = at->get_subcommands();
    if (subs.empty()) break;
    at = subs.front();
    names.push_back(at->get_name());
  }
  return absl::StrJoin(names, " ");
}

void AddGlobalFlags(CLI::App& app, GlobalOptions& g) {
  app.add_option("--coordinator", g.coordinator,
                 "coordinator HOST:PORT (default $STEMMA_COORDINATOR, else the context's "
                 "server, else localhost:7070)");
  app.add_option("--context", g.context,
                 "use this context of the config file instead of its current-context "
                 "(beats the environment)");
  app.add_option("-o,--output", g.output,
                 "table | wide | json | yaml | csv (metrics) | name | jsonpath=TEMPLATE "
                 "(default table)");
  app.add_flag("--no-headers", g.no_headers, "tables without their header line");
  app.add_option("--request-timeout", g.request_timeout_s,
                 "how long each request to the coordinator may take: seconds or 10s, 2m "
                 "(default 10)")
      ->transform(stemma::cli::DurationFlag());
  app.add_option("--timeout", g.legacy_timeout_s,
                 "deprecated before non-waiting commands: use --request-timeout")
      ->transform(stemma::cli::DurationFlag())
      ->group("");  // hidden
  app.add_option("--ca", g.ca_file,
                 "PEM CA of the coordinator's TLS certificate (default $STEMMA_CA, else the "
                 "context's, else ~/.config/stemma/ca.pem if present; none: plaintext)");
  app.add_option("--token-file", g.token_file,
                 "file holding the token, mode 0600 (default $STEMMA_TOKEN, "
                 "$STEMMA_TOKEN_FILE, else the context's, else ~/.config/stemma/token)");
}

// Flags > environment > the context (an explicit --context beats the environment too).
absl::Status ResolveConnection(const CLI::App& app, GlobalOptions& g) {
  const std::string path = stemma::cli::ConfigPath();
  absl::StatusOr<stemma::cli::CliConfig> config = stemma::cli::LoadConfig(path);
  if (!config.ok()) return stemma::cli::UsageError(std::string(config.status().message()));
  const bool explicit_context = !g.context.empty();
  const std::string name = explicit_context ? g.context : config->current_context;
  stemma::cli::Context context;
  if (!name.empty()) {
    const stemma::cli::Context* found = config->Find(name);
    if (found == nullptr) {
      return stemma::cli::UsageError(
          absl::StrCat("no context '", name, "' in ", path, " (see stemma config get-contexts)"));
    }
    context = *found;
  }
  const bool env_address = Env("STEMMA_COORDINATOR") != nullptr;
  if (app.count("--coordinator") == 0) {
    if (!context.server.empty() && (explicit_context || !env_address)) {
      g.coordinator = context.server;
    } else if (env_address) {
      g.coordinator = Env("STEMMA_COORDINATOR");
    }
  }
  if (g.ca_file.empty() && !context.ca.empty() && (explicit_context || !Env("STEMMA_CA"))) {
    g.ca_file = context.ca;
  }
  const bool env_token = Env("STEMMA_TOKEN") != nullptr || Env("STEMMA_TOKEN_FILE") != nullptr;
  if (g.token_file.empty() && !context.token_file.empty() && (explicit_context || !env_token)) {
    g.token_file = context.token_file;
  }
  g.space = context.space;
  return absl::OkStatus();
}

// The global --timeout of earlier versions: a waiting command's limit, or (deprecated) the
// request timeout.
void ResolveLegacyTimeout(const CLI::App& app, const std::string& command, GlobalOptions& g) {
  if (app.count("--timeout") == 0) return;
  static const std::set<std::string> kWaiting = {"wait", "watch", "exp wait", "exp watch"};
  if (kWaiting.count(command)) {
    g.wait_timeout_s = g.legacy_timeout_s;
    return;
  }
  std::cerr << "stemma: warning: --timeout before '" << command
            << "' is deprecated: use --request-timeout (--timeout is how long a wait waits)\n";
  if (app.count("--request-timeout") == 0) g.request_timeout_s = g.legacy_timeout_s;
}

// CLI11 reports an unknown command as a missing one; name it instead.
int ParseFailure(const CLI::App& app, const CLI::ParseError& e, int argc, char** argv) {
  if (app.get_subcommands().empty()) {
    static const std::set<std::string> kTakeValue = {
        "--coordinator",     "-o",   "--output",  "--timeout",
        "--request-timeout", "--ca", "--context", "--token-file"};
    for (int i = 1; i < argc; ++i) {
      std::string arg = argv[i];
      if (kTakeValue.count(arg)) {
        ++i;
      } else if (!arg.empty() && arg[0] != '-') {
        return PrintError("unknown command '" + arg + "' (see stemma --help)",
                          stemma::cli::kExitUsage);
      }
    }
  }
  return PrintError(e.what(), stemma::cli::kExitUsage);
}

}  // namespace

int main(int argc, char** argv) {
  GlobalOptions globals;
  stemma::cli::Action action;

  CLI::App app{"Stemma: run and watch jobs on a Stemma coordinator", "stemma"};
  app.fallthrough();  // global flags may follow the subcommand: `stemma ls -o json`
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("stemma ") + STEMMA_VERSION);
  AddGlobalFlags(app, globals);

  stemma::cli::AddJobCommands(&app, &globals, &action);
  stemma::cli::AddStreamCommands(&app, &globals, &action);
  stemma::cli::AddWorkerCommands(&app, &globals, &action);
  stemma::cli::AddUpCommand(&app, &globals, &action);
  stemma::cli::AddMetricsCommand(&app, &globals, &action);
  stemma::cli::AddCkptCommands(&app, &globals, &action);
  stemma::cli::AddGcCommands(&app, &globals, &action);
  stemma::cli::AddTokenCommand(&app, &globals, &action);
  stemma::cli::AddExplainCommand(&app, &globals, &action);
  stemma::cli::AddExperimentCommands(&app, &globals, &action);
  stemma::cli::AddReportCommand(&app, &globals, &action);
  stemma::cli::AddConfigCommands(&app, &globals, &action);
  stemma::cli::AddCompletionCommand(&app, &globals, &action);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    return ParseFailure(app, e, argc, argv);
  }

  auto format = stemma::cli::ParseOutputFormat(globals.output, &globals.jsonpath);
  if (!format.ok()) return PrintError(std::string(format.status().message()), 2);
  globals.format = *format;
  stemma::cli::SetOutputSettings(globals.jsonpath, globals.no_headers);
  const std::string command = CommandPath(app);
  ResolveLegacyTimeout(app, command, globals);
  if (!(globals.request_timeout_s > 0)) return PrintError("--request-timeout must be positive", 2);
  if (!action) return PrintError("no command given", 2);
  if (command.rfind("config", 0) != 0 && command.rfind("completion", 0) != 0) {
    if (absl::Status s = ResolveConnection(app, globals); !s.ok()) {
      return PrintError(std::string(s.message()), stemma::cli::kExitUsage);
    }
  }
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
                      stemma::cli::ExitCodeFor(result.status()));
  }
  std::cout.flush();
  return *result;
}
