// The eval task's defaults that depend on other fields (the rest are rule options in
// stemma/v1/specs/eval.proto), in one place for the checker, which needs the task names to
// be unique, and the engine. Implemented in common/spec_checks_eval.cc beside those rules.
#pragma once

#include <string>

#include "stemma/v1/specs/eval.pb.h"

namespace stemma {

// The task's `type`: the name of its kind ("perplexity", "choice", "translation"); "" when
// none is set.
std::string EvalTaskType(const v1::EvalTask& task);

// The task's name as the engine uses it: `name`, else the language (perplexity),
// `<format>_<language>` (choice), `<source_language>-<language>` (translation).
std::string EvalTaskName(const v1::EvalTask& task);

// Sets the name (EvalTaskName), a choice task's sampler (`first_n` for belebele, else
// `seeded`), a translation task's prompt labels (source_language, the task's language) and
// a held-out perplexity task's heldout_split (`hash`) where they are unset.
void FillEvalTaskDefaults(v1::EvalTask* task);

}  // namespace stemma
