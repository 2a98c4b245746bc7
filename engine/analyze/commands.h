// Entry point of `stemma-engine analyze --spec FILE` (LAPE, MoE routing and the expert
// selection, weight drift, cross-lingual alignment); docs/eval.md, docs/engine/analyze.md.
// Returns the exit code.
#pragma once

namespace stemma::engine {

int RunAnalyze(int argc, char** argv);

}  // namespace stemma::engine
