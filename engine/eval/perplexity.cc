#include "engine/eval/perplexity.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/data/loader.h"

namespace stemma::engine::eval {

absl::StatusOr<PerplexityStream> BuildPerplexityStream(const data::Dataset& dataset,
                                                       const PerplexityStreamOptions& options,
                                                       int64_t vocab_size) {
  const auto& info = dataset.tokenizer();
  const bool insert_eos = !dataset.eos_appended() && info.eos_id.has_value();
  PerplexityStream stream;
  stream.context_token = info.bos_id ? info.bos_id : info.eos_id;
  stream.first_predicted = stream.context_token ? 0 : 1;
  const int64_t first_last =
      data::FirstHeldOutByPosition(dataset.num_documents(), options.heldout_fraction);
  for (int64_t doc = options.heldout && options.heldout_last ? first_last : 0;
       doc < dataset.num_documents(); ++doc) {
    if (options.limit > 0 && static_cast<int64_t>(stream.documents.size()) == options.limit) break;
    std::vector<int32_t> tokens = dataset.Document(doc);
    if (options.heldout && !options.heldout_last &&
        !data::IsHeldOut(tokens, options.heldout_fraction, options.split_seed)) {
      continue;
    }
    stream.documents.push_back(doc);
    stream.tokens.insert(stream.tokens.end(), tokens.begin(), tokens.end());
    if (insert_eos) stream.tokens.push_back(*info.eos_id);
  }
  if (static_cast<int64_t>(stream.tokens.size()) <= stream.first_predicted) {
    return absl::InvalidArgumentError(absl::StrCat(
        dataset.dir(), ": no tokens to evaluate in the ",
        options.heldout
            ? absl::StrCat("held-out split (fraction ", options.heldout_fraction,
                           options.heldout_last ? ", the last documents"
                                                : absl::StrCat(", split_seed ", options.split_seed),
                           ")")
            : std::string("dataset")));
  }
  auto out_of_range = [&](int32_t t) { return t < 0 || t >= vocab_size; };
  if (auto it = std::find_if(stream.tokens.begin(), stream.tokens.end(), out_of_range);
      it != stream.tokens.end() || (stream.context_token && out_of_range(*stream.context_token))) {
    const int32_t bad = it != stream.tokens.end() ? *it : *stream.context_token;
    return absl::InvalidArgumentError(
        absl::StrCat(dataset.dir(), ": token id ", bad, " is outside the model's vocabulary (",
                     vocab_size, "); was the dataset made with another tokenizer?"));
  }
  return stream;
}

std::vector<WindowRange> PerplexityWindows(const PerplexityStream& stream, int64_t seq_len) {
  std::vector<WindowRange> windows;
  const int64_t end = static_cast<int64_t>(stream.tokens.size());
  for (int64_t begin = stream.first_predicted; begin < end; begin += seq_len - 1) {
    windows.push_back({begin, std::min(seq_len - 1, end - begin)});
  }
  return windows;
}

std::vector<int32_t> WindowTokens(const PerplexityStream& stream, const WindowRange& window) {
  std::vector<int32_t> tokens;
  tokens.reserve(window.length + 1);
  tokens.push_back(stream.context_token ? *stream.context_token : stream.tokens[window.begin - 1]);
  tokens.insert(tokens.end(), stream.tokens.begin() + window.begin,
                stream.tokens.begin() + window.begin + window.length);
  return tokens;
}

int64_t DocumentBytes(const data::Dataset& dataset, const std::vector<int64_t>& documents,
                      const tokenizer::Tokenizer& tokenizer) {
  int64_t bytes = 0;
  for (int64_t doc : documents) {
    std::vector<int32_t> tokens = dataset.Document(doc);
    std::erase_if(tokens, [&](int32_t t) { return tokenizer.IsSpecial(t); });
    bytes += static_cast<int64_t>(tokenizer.Decode(tokens).size());
  }
  return bytes;
}

}  // namespace stemma::engine::eval
