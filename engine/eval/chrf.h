// chrF and chrF++ (Popović 2015, 2017) computed exactly as sacrebleu 2.x does
// (sacrebleu/metrics/chrf.py; algorithms.md §7). Torch-free.
//
// Strings are UTF-8; n-grams are over Unicode code points, as Python's str slicing is.
// Whitespace is Python's str.isspace() set; character n-grams are taken from the line with
// all whitespace removed (unless `whitespace`), word n-grams from str.split() tokens with
// one leading or trailing ASCII punctuation character split off. Corpus scores sum the
// per-segment statistics and compute one F-score (not a mean of sentence scores).
// Invalid UTF-8 bytes count as U+FFFD each.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace stemma::engine::eval {

struct ChrfOptions {
  int char_order = 6;
  int word_order = 0;  // 2 for chrF++
  int beta = 2;
  bool whitespace = false;     // keep whitespace inside character n-grams
  bool eps_smoothing = false;  // chrF++.py / NLTK style averaging (sacrebleu's default: off)
};

inline ChrfOptions ChrfPlusPlusOptions() {
  ChrfOptions options;
  options.word_order = 2;
  return options;
}

// Per-order statistics of one segment: 3 * (char_order + word_order) counts, each order's
// [hypothesis n-grams, reference n-grams, matches]; character orders first. With several
// references, those of the reference whose F-score is highest (the first on ties).
// `references` must not be empty.
std::vector<int64_t> ChrfSegmentStatistics(std::string_view hypothesis,
                                           std::span<const std::string> references,
                                           const ChrfOptions& options);

// The F-score (0..100) of summed statistics.
double ChrfScoreFromStatistics(std::span<const int64_t> statistics, const ChrfOptions& options);

// Corpus-level chrF of hypotheses[i] against references[i] (one reference per segment).
// The spans must have equal sizes.
double CorpusChrf(std::span<const std::string> hypotheses, std::span<const std::string> references,
                  const ChrfOptions& options);

// Sentence-level chrF (sacrebleu's sentence_score).
double SentenceChrf(std::string_view hypothesis, std::string_view reference,
                    const ChrfOptions& options);

}  // namespace stemma::engine::eval
