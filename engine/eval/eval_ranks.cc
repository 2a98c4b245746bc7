#include "engine/eval/eval_ranks.h"

#include <chrono>
#include <cstdlib>
#include <exception>
#include <optional>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace stemma::engine::eval {
namespace {

using Json = nlohmann::json;

// The integer in environment variable `name` within [lo, hi]; nullopt when unset.
absl::StatusOr<std::optional<int64_t>> IntFromEnv(const char* name, int64_t lo, int64_t hi) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return std::optional<int64_t>();
  int64_t value = 0;
  if (!absl::SimpleAtoi(text, &value) || value < lo || value > hi) {
    return absl::InvalidArgumentError(absl::StrCat("environment variable ", name, "='", text,
                                                   "' is not an integer in ", lo, "..", hi));
  }
  return std::optional<int64_t>(value);
}

// c10 appends a C++ backtrace to its messages: keep the first line.
std::string FirstLine(const std::exception& e) {
  std::string what = e.what();
  return what.substr(0, what.find('\n'));
}

}  // namespace

class EvalRanks::Store {
 public:
  c10::intrusive_ptr<c10d::TCPStore> store;
  std::chrono::milliseconds timeout{600'000};
};

EvalRanks::EvalRanks(int rank, int world_size, std::unique_ptr<Store> store)
    : rank_(rank), world_size_(world_size), store_(std::move(store)) {}
EvalRanks::~EvalRanks() = default;

absl::StatusOr<std::unique_ptr<EvalRanks>> EvalRanks::FromEnv() {
  ASSIGN_OR_RETURN(auto world, IntFromEnv("WORLD_SIZE", 1, 65536));
  if (!world.has_value() || *world == 1) {
    return std::unique_ptr<EvalRanks>(new EvalRanks(0, 1, nullptr));
  }
  ASSIGN_OR_RETURN(auto rank, IntFromEnv("RANK", 0, *world - 1));
  if (!rank.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "environment variable RANK is not set (required when WORLD_SIZE=", *world, ")"));
  }
  const char* addr = std::getenv("MASTER_ADDR");
  if (addr == nullptr || *addr == '\0') {
    return absl::InvalidArgumentError(absl::StrCat(
        "environment variable MASTER_ADDR is not set (required when WORLD_SIZE=", *world, ")"));
  }
  ASSIGN_OR_RETURN(auto port, IntFromEnv("MASTER_PORT", 1, 65535));
  if (!port.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "environment variable MASTER_PORT is not set (required when WORLD_SIZE=", *world, ")"));
  }
  ASSIGN_OR_RETURN(auto timeout_s, IntFromEnv("STEMMA_DDP_TIMEOUT_S", 1, 86'400));
  auto store = std::make_unique<Store>();
  if (timeout_s.has_value()) store->timeout = std::chrono::seconds(*timeout_s);
  c10d::TCPStoreOptions options;
  options.port = static_cast<uint16_t>(*port);
  options.isServer = *rank == 0;
  options.numWorkers = static_cast<int>(*world);
  options.waitWorkers = false;  // rank 0 waits for every share in Gather instead
  options.timeout = store->timeout;
  try {
    store->store = c10::make_intrusive<c10d::TCPStore>(addr, options);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat(
        *rank == 0 ? "cannot serve the eval's rendezvous on " : "cannot reach rank 0 at ",
        "MASTER_ADDR=", addr, " MASTER_PORT=", *port, " within ", store->timeout.count() / 1000,
        " s (STEMMA_DDP_TIMEOUT_S): ", FirstLine(e)));
  }
  return std::unique_ptr<EvalRanks>(
      new EvalRanks(static_cast<int>(*rank), static_cast<int>(*world), std::move(store)));
}

absl::StatusOr<std::vector<Json>> EvalRanks::Gather(
    const std::string& round, int64_t count, const std::vector<std::pair<int64_t, Json>>& mine) {
  std::vector<Json> values(count);
  std::vector<bool> seen(count, false);
  auto take = [&](const Json& share, int from) -> absl::Status {
    if (!share.is_array()) return absl::InternalError(absl::StrCat(round, ": rank ", from));
    for (const auto& item : share) {
      const int64_t index = item.is_array() && item.size() == 2 && item[0].is_number_integer()
                                ? item[0].get<int64_t>()
                                : -1;
      if (index < 0 || index >= count || seen[index]) {
        return absl::InternalError(
            absl::StrCat(round, ": rank ", from, " sent a bad or repeated item"));
      }
      values[index] = item[1];
      seen[index] = true;
    }
    return absl::OkStatus();
  };
  Json own = Json::array();
  for (const auto& [index, value] : mine) own.push_back(Json::array({index, value}));
  if (store_ == nullptr) {
    RETURN_IF_ERROR(take(own, 0));
  } else if (rank_ != 0) {
    const std::string text = own.dump();
    try {
      store_->store->set(absl::StrCat("stemma/eval/", round, "/", rank_),
                         std::vector<uint8_t>(text.begin(), text.end()));
    } catch (const std::exception& e) {
      return absl::UnavailableError(
          absl::StrCat(round, ": cannot hand this rank's share to rank 0: ", FirstLine(e)));
    }
    return std::vector<Json>();
  } else {
    RETURN_IF_ERROR(take(own, 0));
    for (int from = 1; from < world_size_; ++from) {
      const std::string key = absl::StrCat("stemma/eval/", round, "/", from);
      std::vector<uint8_t> bytes;
      try {
        store_->store->wait({key}, store_->timeout);
        bytes = store_->store->get(key);
      } catch (const std::exception& e) {
        return absl::DeadlineExceededError(absl::StrCat(round, ": no results from rank ", from,
                                                        " within ", store_->timeout.count() / 1000,
                                                        " s: ", FirstLine(e)));
      }
      Json share = Json::parse(bytes.begin(), bytes.end(), nullptr, /*allow_exceptions=*/false);
      RETURN_IF_ERROR(take(share, from));
    }
  }
  for (int64_t i = 0; i < count; ++i) {
    if (!seen[i]) return absl::InternalError(absl::StrCat(round, ": no rank computed item ", i));
  }
  return values;
}

}  // namespace stemma::engine::eval
