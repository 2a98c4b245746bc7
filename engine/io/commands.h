// The checkpoint tool commands of stemma-engine (engine/io/commands.cc). Same contract as
// engine/commands.h: argv[0] is the command name; the return value is the exit code.
#pragma once

namespace stemma::engine {

// stemma-engine inspect DIR|FILE.safetensors [--json]: lists tensors (name, dtype, shape,
// shard), shards, config architecture and the manifest status. Exit 0 when readable.
int RunInspect(int argc, char** argv);
// stemma-engine verify DIR: recomputes every file's sha256 against stemma.json. Exit 0 when
// the checkpoint is intact, 1 naming the first damaged file (and tensor) otherwise.
int RunVerify(int argc, char** argv);

}  // namespace stemma::engine
