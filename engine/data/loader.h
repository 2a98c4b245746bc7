// The training loader: a mixture of token datasets (one per language), sampled by explicit
// weights or by temperature, packed into fixed-length windows, with a deterministic held-out
// split and a position (LoaderState) that is saved and restored exactly.
//
// Packing (docs/data-format.md, "Loader"): each dataset's split is a stream of its documents
// in a per-epoch shuffled order, each followed by EOS (unless the dataset was tokenized with
// --eos, whose documents already end with it). A row of a batch is the next seq_len + 1
// tokens of one dataset's stream: windows do not overlap, cross document boundaries (a
// window may hold the end of one document, EOS, and the start of the next) and cross epoch
// boundaries. So within one dataset, every token (and every EOS) of an epoch lands in
// exactly one window position. The trainer uses row[0:seq_len] as inputs and row[1:] as
// targets.
//
// Mixture: before each row, a dataset i is drawn with probability p_i (MixtureProbabilities).
//
// Held-out split, one of three per dataset (the train and held-out loaders see disjoint
// documents in each):
//   hash (default): document d is held out when
//     SplitMix64(hash(document tokens) ^ split_seed) / 2^64 < heldout_fraction
//   (hash: FNV-1a 64 over the uint32 tokens). It depends only on the document's tokens and the
//   seed, so it is stable across re-tokenization into different shards or file orders.
//   last: the last ceil(heldout_fraction * N) of the dataset's N documents (file order): the
//   end of a corpus.
//   a separate dataset (MixtureComponent::heldout): every document of the dataset trains and
//   the held-out split is that other dataset, whole.
//
// Determinism: all randomness comes from counter-based SplitMix64 streams derived from
// `seed` (no std:: distributions, whose results differ between standard libraries), so the
// same datasets and options give the same batches on every platform.
//
// Data parallel: every rank builds the same loader (same datasets, options and seed) and
// takes its rows [rank * B / W, (rank + 1) * B / W) of NextBatch(B) for the global batch B,
// so W processes see exactly the rows one process would, and one saved state serves all.
//
// Thread-safety: a Loader is not thread-safe; use one per training process (or rank).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/data/dataset.h"
#include "nlohmann/json.hpp"
#include "stemma/v1/specs/train.pb.h"

namespace stemma::engine::data {

// p_i ∝ n_i^(1/T) for dataset sizes n_i (tokens) and temperature T > 0. T = 1 is
// proportional to size; T → ∞ approaches uniform. InvalidArgument for T <= 0, a negative
// size or all sizes zero.
absl::StatusOr<std::vector<double>> TemperatureProbabilities(const std::vector<double>& sizes,
                                                             double temperature);

struct MixtureComponent {
  std::shared_ptr<const Dataset> dataset;
  // Explicit weight (any positive scale; normalized). Required unless the spec has a
  // temperature.
  std::optional<double> weight;
  // Language family (e.g. "slavic"); used with MixtureSpec::family_weights.
  std::string family;
  // A separate held-out dataset (same tokenizer): when set, all of `dataset` is the training
  // split and this, whole, the held-out split.
  std::shared_ptr<const Dataset> heldout;
};

struct MixtureSpec {
  std::vector<MixtureComponent> components;
  // Temperature sampling over the components' (split) token counts. Without family_weights:
  // p_i ∝ n_i^(1/T) over all components. With family_weights: family f gets weight
  // family_weights[f] (normalized), shared inside the family by n_i^(1/T) — e.g. a family
  // expert's run that gives its family 0.9 and a replay family 0.1. Explicit weights and a
  // temperature are exclusive.
  std::optional<double> temperature;
  std::map<std::string, double> family_weights;
};

// The mixture of a training spec's `data` (already checked by its rules) with its datasets
// opened: datasets[i].path (and heldout_path), weight, family, temperature, family_weights.
// No weight on any dataset and no temperature: equal weights. Errors name the field
// ("data.datasets[1].path: ...") and the dataset directory: NotFound for a missing one,
// InvalidArgument (or DataLoss) for a damaged one.
absl::StatusOr<MixtureSpec> OpenMixture(const v1::TrainData& data);

enum class Split { kTrain, kHeldOut };

struct LoaderOptions {
  int64_t seq_len = 0;  // rows have seq_len + 1 tokens
  uint64_t seed = 0;    // mixture draws and epoch shuffles
  Split split = Split::kTrain;
  double heldout_fraction = 0.0;  // in [0, 1)
  bool heldout_last = false;      // the last documents instead of the hash split
  uint64_t split_seed = 0;
  bool shuffle = true;  // shuffle document order per epoch (false: index order)
  // EOS between documents for datasets not tokenized with --eos; defaults to each dataset's
  // tokenizer eos_id.
  std::optional<int32_t> eos_id;
};

// A loader's position: enough to continue exactly where it stopped.
struct LoaderState {
  struct Cursor {
    std::string dir;       // the dataset, to check a restore against
    int64_t epoch = 0;     // completed passes over the split
    int64_t position = 0;  // index into this epoch's document order
    int64_t offset = 0;    // tokens of that document already emitted (size: its EOS next)
  };
  uint64_t seed = 0;
  int64_t seq_len = 0;
  uint64_t draws = 0;  // mixture draws so far (the RNG's counter)
  int64_t rows = 0;    // rows emitted so far
  std::vector<Cursor> cursors;

  nlohmann::json ToJson() const;
  // InvalidArgument naming the missing or mistyped field.
  static absl::StatusOr<LoaderState> FromJson(const nlohmann::json& j);
};

class Loader {
 public:
  // Computes the split and probabilities. InvalidArgument for: seq_len <= 0, no components,
  // a bad weight or temperature, missing family weights, a component with no documents in
  // the split, no EOS id for a dataset that needs one, datasets made with different
  // tokenizers (tokenizer.sha256 differs).
  static absl::StatusOr<std::unique_ptr<Loader>> Create(MixtureSpec spec, LoaderOptions options);

  // The next batch_size rows: [batch_size, seq_len + 1] int32, row-major.
  std::vector<int32_t> NextBatch(int64_t batch_size);

  LoaderState state() const;
  // Continues from `state` (taken from a loader with the same datasets and options).
  // InvalidArgument when the seed, seq_len or datasets differ or a cursor is out of range.
  absl::Status Restore(const LoaderState& state);

  // Sampling probability of each component, in spec order.
  const std::vector<double>& probabilities() const { return probabilities_; }
  // Documents in this loader's split of component i (indices into the dataset), index order.
  const std::vector<int64_t>& documents(size_t i) const { return streams_[i].docs; }
  // Tokens per epoch of component i's stream (documents plus inserted EOS).
  int64_t epoch_tokens(size_t i) const { return streams_[i].epoch_tokens; }
  // How many rows came from each component since Create or the last Restore.
  const std::vector<int64_t>& rows_per_component() const { return rows_per_component_; }

 private:
  struct Stream {
    std::shared_ptr<const Dataset> dataset;
    std::vector<int64_t> docs;   // split documents, index order
    std::vector<int64_t> order;  // this epoch's order (indices into docs' values)
    bool insert_eos = false;
    int32_t eos = 0;
    int64_t epoch_tokens = 0;
    LoaderState::Cursor cursor;
  };
  Loader() = default;
  std::vector<int64_t> OrderFor(size_t i, int64_t epoch) const;
  void BuildOrder(size_t i);
  void FillRow(size_t i, int32_t* out);
  size_t Draw();

  LoaderOptions options_;
  std::vector<Stream> streams_;
  std::vector<double> probabilities_;
  std::vector<double> cumulative_;
  uint64_t draws_ = 0;
  int64_t rows_ = 0;
  std::vector<int64_t> rows_per_component_;
};

// Whether document `tokens` is held out for (fraction, seed); the hash rule above.
bool IsHeldOut(std::span<const int32_t> tokens, double fraction, uint64_t seed);

// The first held-out document of the `last` split of `num_documents` documents:
// num_documents - ceil(fraction * num_documents).
int64_t FirstHeldOutByPosition(int64_t num_documents, double fraction);

}  // namespace stemma::engine::data
