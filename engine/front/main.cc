// stemma-engine: the engine's front. LibTorch takes ~0.5 s to load and ~0.2 s to unload, more
// than a fully cached eval takes to answer, so this small torch-free binary answers such an
// eval itself (engine/eval/serve_cached.h) and hands every other command — and any eval it
// does not answer — to the LibTorch engine, stemma-engine-torch beside it, by execv: the same
// process (pid, arguments, environment, descriptors, signal dispositions), so the worker,
// ranks, logs, cancellation and exit codes see one engine as before. `stemma-engine
// --version`, --help and every error come from stemma-engine-torch.
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include "common/engine_contract.h"
#include "common/engine_front.h"
#include "engine/eval/serve_cached.h"

namespace stemma::engine {

// sha256 of the stemma-engine-torch this front was built with (generated at build time by
// torch_binary_id.cmake): it makes this binary's bytes, which the worker hashes into the
// engine build id of every cache key, change whenever the LibTorch engine does.
extern const char kTorchBinarySha256[];

namespace {

// The front's mark in its own bytes (common/engine_front.h): the worker looks for it to know
// that this binary needs stemma-engine-torch beside it. `used`: kept though nothing reads it.
[[gnu::used]] const char* const kFrontMark = engine_front::kFrontMarker;

// Replaces this process with stemma-engine-torch (beside this binary's resolved path) run
// with the same argv; returns only when that fails, with the exit code.
int ExecTorchEngine(char** argv) {
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) {  // never guess: a relative path would run whatever the working directory holds
    std::fprintf(stderr, "%s/proc/self/exe: %s (cannot find %s beside this binary)\n",
                 std::string(engine_contract::kErrorPrefix).c_str(), ec.message().c_str(),
                 std::string(engine_front::kTorchEngineName).c_str());
    return engine_contract::kExitFailed;
  }
  const std::string torch = self.parent_path() / std::string(engine_front::kTorchEngineName);
  ::execv(torch.c_str(), argv);
  const int err = errno;
  std::fprintf(stderr,
               "%s%s: %s (the LibTorch engine this stemma-engine was built with, sha256 %s)\n",
               std::string(engine_contract::kErrorPrefix).c_str(), torch.c_str(),
               std::strerror(err), kTorchBinarySha256);
  return engine_contract::kExitFailed;
}

}  // namespace
}  // namespace stemma::engine

int main(int argc, char** argv) {
  if (argc >= 2 && std::string_view(argv[1]) == "eval") {
    try {
      std::optional<int> code = stemma::engine::eval::ServeCachedEval(argc - 1, argv + 1);
      if (code.has_value()) return *code;
    } catch (const std::exception& e) {
      // As the LibTorch engine's main: one error line, exit 1.
      std::fprintf(stderr, "%s%s\n", std::string(stemma::engine_contract::kErrorPrefix).c_str(),
                   e.what());
      return stemma::engine_contract::kExitFailed;
    }
  }
  return stemma::engine::ExecTorchEngine(argv);
}
