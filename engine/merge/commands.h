// stemma-engine merge|revert|interpolate|graft|upcycle --spec FILE: checkpoint algebra
// (docs/merge.md). One implementation; argv[0] (the command name) selects the operation.
#pragma once

namespace stemma::engine {

// Returns the process exit code (common/engine_contract.h): 0 on success; 4 for a bad spec
// or bad inputs (a missing checkpoint, tensors or configs that do not fit, a layer range
// past the model), which the worker does not retry; 1 for other failures (I/O). One line
// `stemma-engine: error: ...` on stderr. --help prints the spec's fields. Events go to
// stdout as JSON lines (engine/events.h).
int RunMerge(int argc, char** argv);

}  // namespace stemma::engine
