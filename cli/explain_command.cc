// stemma explain [COMMAND] [--markdown]: the fields of an engine command's spec, from the
// schema the CLI, the coordinator and the engine all read (common/engine_spec.h). Local: no
// coordinator involved. docs/engine/<command>.md embeds the --markdown form.
#include <CLI/CLI.hpp>
#include <iostream>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cli/command.h"
#include "common/engine_spec.h"

namespace stemma::cli {
namespace {

struct ExplainOptions {
  std::string command;
  bool markdown = false;
};

absl::StatusOr<int> RunExplain(const ExplainOptions& o) {
  if (o.command.empty()) {
    std::cout << "engine commands (stemma explain COMMAND lists a spec's fields):\n";
    for (const std::string& c : EngineCommands()) std::cout << "  " << c << "\n";
    return 0;
  }
  if (EngineSpecDescriptor(o.command) == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("explain: '", o.command,
                                                   "' is not an engine command (",
                                                   absl::StrJoin(EngineCommands(), ", "), ")"));
  }
  std::cout << (o.markdown ? SpecReferenceMarkdown(o.command) : SpecHelpText(o.command));
  return 0;
}

}  // namespace

void AddExplainCommand(CLI::App* app, const GlobalOptions* /*globals*/, Action* action) {
  auto o = std::make_shared<ExplainOptions>();
  CLI::App* sub = app->add_subcommand("explain", "List the fields of an engine command's spec");
  sub->add_option("command", o->command, "engine command (init, train, merge, eval, ...)");
  sub->add_flag("--markdown", o->markdown, "the reference table of docs/engine/COMMAND.md");
  sub->callback([=] { *action = [=] { return RunExplain(*o); }; });
}

}  // namespace stemma::cli
