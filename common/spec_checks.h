// Cross-field rules of each engine command, beyond what its field options say (those are
// checked generically by ValidateEngineSpec first, so every field here already has its
// default, its type and its range). Each returns the first violation, made with
// checker.Error(field, what). Torch-free: the CLI and the coordinator run them at submit.
//
// One file per area, owned by the engineers of that part of the engine:
//   spec_checks_train.cc  init, tokenize, train
//   spec_checks_merge.cc  merge, revert, interpolate, graft, upcycle
//   spec_checks_eval.cc   eval, analyze
//   spec_checks_data.cc   prepare
#pragma once

#include "absl/status/status.h"
#include "common/engine_spec.h"
#include "stemma/v1/specs/data.pb.h"
#include "stemma/v1/specs/eval.pb.h"
#include "stemma/v1/specs/merge.pb.h"
#include "stemma/v1/specs/model.pb.h"
#include "stemma/v1/specs/train.pb.h"

namespace stemma::spec_checks {

absl::Status Check(const v1::InitSpec& spec, const SpecChecker& checker);
absl::Status Check(const v1::TokenizeSpec& spec, const SpecChecker& checker);
absl::Status Check(const v1::TrainSpec& spec, const SpecChecker& checker);

absl::Status Check(const v1::MergeSpec& spec, const SpecChecker& checker);
absl::Status Check(const v1::RevertSpec& spec, const SpecChecker& checker);
absl::Status Check(const v1::InterpolateSpec& spec, const SpecChecker& checker);
absl::Status Check(const v1::GraftSpec& spec, const SpecChecker& checker);
absl::Status Check(const v1::UpcycleSpec& spec, const SpecChecker& checker);

absl::Status Check(const v1::EvalSpec& spec, const SpecChecker& checker);
absl::Status Check(const v1::AnalyzeSpec& spec, const SpecChecker& checker);

absl::Status Check(const v1::PrepareSpec& spec, const SpecChecker& checker);  // spec_checks_data.cc

}  // namespace stemma::spec_checks
