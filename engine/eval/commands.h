// Entry point of `stemma-engine eval --spec FILE` (perplexity, k-shot multiple choice,
// translation chrF); docs/eval.md, docs/engine/eval.md. Returns the exit code.
#pragma once

namespace stemma::engine {

int RunEval(int argc, char** argv);

}  // namespace stemma::engine
