// The command line of every `stemma-engine <command>` that takes a spec: one parser, one
// --help, one way to fail. Torch-free, so it is tested without LibTorch.
//
//   stemma-engine <command> [--spec FILE] [--<field> VALUE ...] [command flags] [--help]
//
// --spec reads a YAML or JSON file into the command's typed spec (stemma/v1/specs); each
// `--<field> VALUE` (dashes or underscores, e.g. --hidden-size 256) sets one top-level scalar
// or list field of it after the file, as if written in it (lists as YAML: --layers '["2:6"]').
// Then defaults are filled, relative paths resolved (against $STEMMA_STORAGE_ROOT inside a
// job, else the spec file's directory, else the current directory) and every rule checked,
// with errors naming the file, line and field.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "google/protobuf/message.h"

namespace stemma {

struct EngineInvocation {
  std::unique_ptr<google::protobuf::Message> spec;  // the command's typed spec, checked
  std::string spec_file;                            // --spec, or "" when only flags were given
  // Values of the command's own flags (not spec fields), by name without dashes.
  std::map<std::string, std::string> flags;
  bool help = false;  // --help / -h: print EngineHelp(...) and exit 0; `spec` is null
};

// `argv[0]` is the command name. `command_flags` are extra flag names the command accepts
// besides its spec fields (e.g. "stop-after-step"). InvalidArgument for an unknown flag, a
// flag without a value, or a spec that breaks a rule.
absl::StatusOr<EngineInvocation> ParseEngineCommandLine(
    std::string_view command, int argc, char** argv, const std::vector<std::string>& command_flags);

// The --help text: the usage line, then every spec field with its type, default and meaning.
std::string EngineHelp(std::string_view command, std::string_view usage);

// Prints `stemma-engine: error: <message>` on stderr and returns the exit code the worker
// acts on (common/engine_contract.h): kExitBadInput for InvalidArgument, NotFound,
// FailedPrecondition and OutOfRange (the spec or its inputs are wrong: no retry),
// kExitFailed for everything else.
int ReportEngineFailure(const absl::Status& status);

// num_hidden_layers (or text_config.num_hidden_layers) of DIR/config.json; nullopt when
// there is no readable config (or DIR is a reference such as ckpt:ID).
std::optional<int64_t> ModelLayersFromConfig(const std::string& dir);

// The thread count a command should use: `spec_threads` when > 0, else $STEMMA_CPUS (the
// job's cores, set by the worker), else 0 (the library's default).
int64_t EffectiveThreads(int64_t spec_threads);

}  // namespace stemma
