// RunSpecCommand (engine/commands.h): the one path of every spec command from argv to the
// exit code. Torch-free, so the data commands (built without LibTorch) use it too.
#include <cstdio>
#include <utility>

#include "common/engine_cli.h"
#include "common/engine_contract.h"
#include "engine/commands.h"

namespace stemma::engine {

int RunSpecCommand(const SpecCommand& command, int argc, char** argv) {
  const std::string name = argc > 0 ? argv[0] : "";
  absl::StatusOr<EngineInvocation> inv = ParseEngineCommandLine(name, argc, argv, command.flags);
  if (!inv.ok()) return ReportEngineFailure(inv.status());
  if (inv->help) {
    std::fputs(EngineHelp(name, command.usage).c_str(), stdout);
    return engine_contract::kExitOk;
  }
  SpecCall call;
  call.command = name;
  call.spec = inv->spec.get();
  call.source = inv->spec_file.empty() ? "command line" : inv->spec_file;
  call.spec_file = inv->spec_file;
  call.flags = std::move(inv->flags);
  absl::StatusOr<int> code = command.run(call);
  if (!code.ok()) return ReportEngineFailure(code.status());
  return *code;
}

}  // namespace stemma::engine
