// What this machine offers: GPUs, memory, its name. Called once at startup from main.
// Stateless functions; thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "stemma/v1/user_service.pb.h"

namespace stemma::worker {

// `count` fake GPUs with ids 0..count-1, model "fake", 81920 MiB each.
std::vector<v1::Gpu> FakeGpus(int count);

// The GPUs nvidia-smi reports; an empty list when nvidia-smi is not installed. Errors
// only when nvidia-smi exists but fails or prints something unparsable.
absl::StatusOr<std::vector<v1::Gpu>> DiscoverGpus();

// Parses nvidia-smi's `index,name,memory.total` CSV (noheader, nounits).
absl::StatusOr<std::vector<v1::Gpu>> ParseNvidiaSmiCsv(absl::string_view csv);

// MemTotal from /proc/meminfo, in MiB.
absl::StatusOr<int64_t> TotalMemoryMb();

// This machine's hostname.
std::string Hostname();

// The worker id: `flag` when given; else the id persisted in `data_dir`/worker.id; else
// the hostname. Writes worker.id when it does not exist yet.
absl::StatusOr<std::string> ResolveWorkerId(const std::string& flag, const std::string& data_dir);

// "k=v,k2=v2" -> map. INVALID_ARGUMENT naming the bad pair.
absl::StatusOr<std::map<std::string, std::string>> ParseLabels(absl::string_view text);

}  // namespace stemma::worker
