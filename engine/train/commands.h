// Entry point of `stemma-engine train --spec FILE` (docs/train.md): continued pretraining with
// the alignment strategies of algorithms.md §1, §2.4, §3, §4.5. Returns the exit code.
#pragma once

namespace stemma::engine {

int RunTrain(int argc, char** argv);

}  // namespace stemma::engine
