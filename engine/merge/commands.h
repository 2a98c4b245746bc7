// stemma-engine merge|revert|interpolate|graft|upcycle --spec FILE: checkpoint algebra
// (docs/merge.md). One implementation; argv[0] (the command name) selects the operation.
#pragma once

namespace stemma::engine {

// Returns the process exit code: 0 on success, 1 on an error (one line on stderr), 2 on
// bad usage. Events go to stdout as JSON lines.
int RunMerge(int argc, char** argv);

}  // namespace stemma::engine
