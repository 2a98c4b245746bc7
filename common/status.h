// Two macros over absl::Status, the project's only error type outside tensor code.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

#define STEMMA_CONCAT_INNER_(a, b) a##b
#define STEMMA_CONCAT_(a, b) STEMMA_CONCAT_INNER_(a, b)

// Returns from the enclosing function when `expr` is not OK.
#define RETURN_IF_ERROR(expr)                        \
  do {                                               \
    ::absl::Status stemma_status_ = (expr);          \
    if (!stemma_status_.ok()) return stemma_status_; \
  } while (0)

// `lhs = value of expr`, or return its error.
#define ASSIGN_OR_RETURN(lhs, expr) \
  ASSIGN_OR_RETURN_IMPL_(STEMMA_CONCAT_(stemma_statusor_, __LINE__), lhs, expr)
#define ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                           \
  if (!tmp.ok()) return tmp.status();          \
  lhs = std::move(tmp).value()

namespace stemma {

// An errno value as a Status, naming what failed: ErrnoStatus("open /x/y", errno).
absl::Status ErrnoStatus(absl::string_view what, int err);

}  // namespace stemma
