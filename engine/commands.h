// The commands of stemma-engine. engine/main.cc holds the one table of `stemma-engine
// <command>` names; each entry is a CommandFn. Every command that takes a spec runs through
// RunSpecCommand, so reading the spec, --help and the exit codes are the same everywhere.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "google/protobuf/message.h"

namespace stemma::engine {

// `argv[0]` is the command name (one implementation may serve several names); returns the
// process exit code (common/engine_contract.h).
using CommandFn = int (*)(int argc, char** argv);

// What the body of a spec command receives.
struct SpecCall {
  std::string command;  // argv[0]
  // The command's typed spec (stemma/v1/specs): read from --spec and the --<field> flags,
  // defaults filled, relative paths resolved, every rule checked (common/engine_cli.h).
  google::protobuf::Message* spec = nullptr;
  std::string source;     // the spec file, or "command line": for errors
  std::string spec_file;  // the --spec file as given; "" when the spec came from flags only
  std::map<std::string, std::string> flags;  // the command's own flags, by name

  template <typename Spec>
  Spec& Get() const {
    return static_cast<Spec&>(*spec);
  }
};

struct SpecCommand {
  std::string usage;               // the first line(s) of --help, before the spec's fields
  std::vector<std::string> flags;  // flag names the command takes besides spec fields
  // The work. A Status is printed as one `stemma-engine: error: ...` line and mapped to
  // an exit code by ReportEngineFailure (bad input: 4, no retry; anything else: 1); an ok
  // value is the exit code (kExitOk, or kExitStopped for a run that stopped as asked).
  std::function<absl::StatusOr<int>(const SpecCall&)> run;
};

// Parses `argc/argv` for `command` (argv[0]); --help prints the usage and the spec's fields
// and returns 0; then runs the body and maps its result to the exit code. Exceptions pass
// through to main, which prints them as one error line (exit 1).
int RunSpecCommand(const SpecCommand& command, int argc, char** argv);

// stemma-engine init --arch llama|qwen2|gemma3|olmoe --preset tiny --seed S --out DIR
int RunInit(int argc, char** argv);
// stemma-engine logits --model DIR --tokens 1,2,3 [--out FILE]: forward pass, writes the
// logits (f32 safetensors, tensor "logits" [1, T, V]) for numerics tests and debugging.
int RunLogits(int argc, char** argv);

}  // namespace stemma::engine
