// LibTorch reports errors as exceptions; the engine's functions return a Status. TorchGuard
// runs `fn` (returning absl::Status or absl::StatusOr<T>) and turns an exception into
// Internal "<what>: <message>" (the message without LibTorch's C++ backtrace).
#pragma once

#include <c10/util/Exception.h>

#include <exception>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace stemma::engine::model {

template <typename Fn>
auto TorchGuard(absl::string_view what, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat(what, ": ", e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(what, ": ", e.what()));
  }
}

}  // namespace stemma::engine::model
