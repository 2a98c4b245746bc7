#include "cli/command.h"

#include <iostream>

#include "absl/time/clock.h"

namespace stemma::cli {

void PrintStructured(const nlohmann::json& value, OutputFormat format) {
  if (format == OutputFormat::kYaml) {
    std::cout << JsonToYaml(value);
  } else {
    std::cout << value.dump(2) << "\n";
  }
}

int64_t NowMs() { return absl::ToUnixMillis(absl::Now()); }

}  // namespace stemma::cli
