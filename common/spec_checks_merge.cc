// Cross-field rules of the merge-area engine specs (common/spec_checks.h).
#include "common/spec_checks.h"

namespace stemma::spec_checks {

absl::Status Check(const v1::MergeSpec& spec, const SpecChecker& checker) {
  (void)spec;
  (void)checker;
  return absl::OkStatus();
}

absl::Status Check(const v1::RevertSpec& spec, const SpecChecker& checker) {
  (void)spec;
  (void)checker;
  return absl::OkStatus();
}

absl::Status Check(const v1::InterpolateSpec& spec, const SpecChecker& checker) {
  (void)spec;
  (void)checker;
  return absl::OkStatus();
}

absl::Status Check(const v1::GraftSpec& spec, const SpecChecker& checker) {
  (void)spec;
  (void)checker;
  return absl::OkStatus();
}

absl::Status Check(const v1::UpcycleSpec& spec, const SpecChecker& checker) {
  (void)spec;
  (void)checker;
  return absl::OkStatus();
}

}  // namespace stemma::spec_checks
