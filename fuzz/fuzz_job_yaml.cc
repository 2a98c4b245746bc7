// Job files, as `stemma submit` and the coordinator read them: YAML -> JobSpec -> rules.
// Any input must give jobs or a clear error; never a crash, a hang or unbounded memory.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "common/job_spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto jobs = stemma::ParseJobsYaml(absl::string_view(text.data(), text.size()), "fuzz.yaml");
  if (!jobs.ok()) return 0;
  for (auto& spec : *jobs) {
    stemma::ApplyDefaults(&spec);
    if (stemma::ValidateJobSpec(spec).ok()) {
      for (int attempt = 2; attempt < 6; ++attempt) (void)stemma::BackoffMs(spec, attempt);
    }
  }
  return 0;
}
