// Held-out perplexity and bits per byte over a token dataset (docs/eval.md, "perplexity";
// algorithms.md §9.3): the token stream and its windows. Torch-free; the NLL itself comes
// from EvalModel::WindowLosses.
//
// Stream: the split's documents (held out by data::IsHeldOut with the training run's
// fraction and seed, or all) in index order, each followed by EOS unless the dataset was
// tokenized with --eos (the loader's packing, without the shuffle).
// Windows: non-overlapping. Each window is one context token followed by the next up to
// seq_len - 1 stream tokens, all of which are predicted. The context token is the BOS id
// (the dataset's tokenizer.bos_id), else its EOS id (GPT-2 style), else — no special token
// at all — the stream token just before the window (the first window then starts at stream
// position 1, so the very first token is context only). Every stream token is predicted
// exactly once; the last window may be shorter.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/data/dataset.h"
#include "engine/eval/perplexity_totals.h"
#include "engine/tokenizer/tokenizer.h"

namespace stemma::engine::eval {

struct PerplexityStreamOptions {
  bool heldout = true;
  double heldout_fraction = 0;
  uint64_t split_seed = 0;
  // The training loader's `last` split: the last ceil(fraction·N) documents in file order
  // (data::FirstHeldOutByPosition) instead of the hash rule.
  bool heldout_last = false;
  int64_t limit = 0;  // first N documents of the split (0 = all)
};

struct PerplexityStream {
  std::vector<int64_t> documents;        // dataset document indices, index order
  std::vector<int32_t> tokens;           // documents, each followed by EOS where inserted
  std::optional<int32_t> context_token;  // BOS, else EOS, else none
  int64_t first_predicted = 0;           // 0, or 1 without a context token
};

// InvalidArgument naming the dataset when the split is empty or a token is outside
// [0, vocab_size) of the model.
absl::StatusOr<PerplexityStream> BuildPerplexityStream(const data::Dataset& dataset,
                                                       const PerplexityStreamOptions& options,
                                                       int64_t vocab_size);

struct WindowRange {
  int64_t begin = 0;   // first predicted stream position
  int64_t length = 0;  // predicted tokens (window length - 1)
};

// The windows over stream positions [first_predicted, tokens.size()) for seq_len >= 2.
std::vector<WindowRange> PerplexityWindows(const PerplexityStream& stream, int64_t seq_len);

// The model input of one window: context token (or stream[begin - 1]) + predicted tokens.
std::vector<int32_t> WindowTokens(const PerplexityStream& stream, const WindowRange& window);

// UTF-8 bytes of the documents' text: each decoded by `tokenizer` with special tokens
// (BOS/EOS/…) removed; the bits-per-byte denominator.
int64_t DocumentBytes(const data::Dataset& dataset, const std::vector<int64_t>& documents,
                      const tokenizer::Tokenizer& tokenizer);

}  // namespace stemma::engine::eval
