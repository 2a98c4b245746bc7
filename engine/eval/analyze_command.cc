// Placeholder until the command lands: says so and exits 2.
#include <cstdio>

#include "engine/eval/commands.h"

namespace stemma::engine {

int RunAnalyze(int argc, char** argv) {
  (void)argc;
  std::fprintf(stderr, "stemma-engine: error: %s is not implemented yet\n", argv[0]);
  return 2;
}

}  // namespace stemma::engine
