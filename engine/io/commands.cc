#include "engine/io/commands.h"
#include <cstdio>
namespace stemma::engine {
int RunInspect(int, char**) { std::fputs("inspect: not yet\n", stderr); return 1; }
int RunVerify(int, char**) { std::fputs("verify: not yet\n", stderr); return 1; }
}  // namespace stemma::engine
