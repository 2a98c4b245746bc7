// The engine's two binaries (DEVELOPERS.md "Two engine binaries"): `stemma-engine`, a small
// torch-free front (engine/front/main.cc), execs `stemma-engine-torch` from beside its own
// resolved path for everything it does not answer itself. The worker runs the front and
// checks at start that the LibTorch engine is there (worker/engine_binary.h). Torch-free,
// gRPC-free: both sides include it.
#pragma once

#include <string_view>

namespace stemma::engine_front {

// The LibTorch engine's file name, beside the front's resolved path.
inline constexpr std::string_view kTorchEngineName = "stemma-engine-torch";

// Text the front's bytes carry (and a single-binary engine's do not), so that whoever runs
// an engine binary can tell a front, which needs kTorchEngineName beside it, from an engine
// that needs nothing else.
inline constexpr char kFrontMarker[] =
    "stemma-engine-front: execs stemma-engine-torch from beside its resolved path";

}  // namespace stemma::engine_front
