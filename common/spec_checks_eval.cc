// Cross-field rules of the eval-area engine specs (common/spec_checks.h).
#include "common/spec_checks.h"

namespace stemma::spec_checks {

absl::Status Check(const v1::EvalSpec& spec, const SpecChecker& checker) {
  (void)spec;
  (void)checker;
  return absl::OkStatus();
}

absl::Status Check(const v1::AnalyzeSpec& spec, const SpecChecker& checker) {
  (void)spec;
  (void)checker;
  return absl::OkStatus();
}

}  // namespace stemma::spec_checks
