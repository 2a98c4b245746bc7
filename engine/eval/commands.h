// Entry points of `stemma-engine eval --spec FILE` (perplexity, k-shot multiple choice,
// translation chrF) and `stemma-engine analyze --spec FILE` (LAPE, routing, weight drift,
// cross-lingual alignment); docs/eval.md. Each returns the exit code.
#pragma once

namespace stemma::engine {

int RunEval(int argc, char** argv);
int RunAnalyze(int argc, char** argv);

}  // namespace stemma::engine
