#include "engine/eval/chrf.h"

#include <algorithm>
#include <string>
#include <unordered_map>

#include "engine/eval/eval_text.h"

namespace stemma::engine::eval {
namespace {

using Counts = std::unordered_map<std::u32string, int64_t>;

// Python's str.split() with no arguments: maximal runs of non-whitespace.
std::vector<std::u32string> SplitWords(const std::u32string& line) {
  std::vector<std::u32string> words;
  std::u32string current;
  for (char32_t c : line) {
    if (IsPythonSpace(c)) {
      if (!current.empty()) words.push_back(std::move(current));
      current.clear();
    } else {
      current.push_back(c);
    }
  }
  if (!current.empty()) words.push_back(std::move(current));
  return words;
}

bool IsPunct(char32_t c) {
  static constexpr std::u32string_view kPunct = U"!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~";
  return kPunct.find(c) != std::u32string_view::npos;
}

// sacrebleu's _remove_punctuation: one trailing (checked first) or leading punctuation
// character of a word longer than one character becomes its own token.
std::vector<std::u32string> WordsForNgrams(const std::u32string& line) {
  std::vector<std::u32string> tokens;
  for (auto& w : SplitWords(line)) {
    if (w.size() > 1 && IsPunct(w.back())) {
      tokens.push_back(w.substr(0, w.size() - 1));
      tokens.push_back(w.substr(w.size() - 1));
    } else if (w.size() > 1 && IsPunct(w.front())) {
      tokens.push_back(w.substr(0, 1));
      tokens.push_back(w.substr(1));
    } else {
      tokens.push_back(std::move(w));
    }
  }
  return tokens;
}

// Character n-gram counts for n = 1..order, then word n-gram counts for n = 1..word_order.
std::vector<Counts> ExtractNgrams(std::string_view text, const ChrfOptions& options) {
  const std::u32string line = DecodeUtf8(text);
  std::u32string chars;
  if (options.whitespace) {
    chars = line;
  } else {
    for (const auto& w : SplitWords(line)) chars += w;
  }
  std::vector<Counts> all;
  for (int n = 1; n <= options.char_order; ++n) {
    Counts counts;
    for (size_t i = 0; i + n <= chars.size(); ++i) ++counts[chars.substr(i, n)];
    all.push_back(std::move(counts));
  }
  if (options.word_order > 0) {
    const auto words = WordsForNgrams(line);
    for (int n = 1; n <= options.word_order; ++n) {
      Counts counts;
      for (size_t i = 0; i + n <= words.size(); ++i) {
        std::u32string gram = words[i];
        for (int k = 1; k < n; ++k) gram += U' ' + words[i + k];
        ++counts[gram];
      }
      all.push_back(std::move(counts));
    }
  }
  return all;
}

// [hyp count (0 when the reference has no n-gram of this order), ref count, matches].
void AppendMatchStatistics(const Counts& hyp, const Counts& ref, std::vector<int64_t>* out) {
  int64_t hyp_count = 0, ref_count = 0, matches = 0;
  for (const auto& [gram, count] : hyp) {
    hyp_count += count;
    if (auto it = ref.find(gram); it != ref.end()) matches += std::min(count, it->second);
  }
  for (const auto& [gram, count] : ref) ref_count += count;
  out->push_back(ref.empty() ? 0 : hyp_count);
  out->push_back(ref_count);
  out->push_back(matches);
}

}  // namespace

std::vector<int64_t> ChrfSegmentStatistics(std::string_view hypothesis,
                                           std::span<const std::string> references,
                                           const ChrfOptions& options) {
  const auto hyp_ngrams = ExtractNgrams(hypothesis, options);
  std::vector<int64_t> best;
  double best_score = -1.0;
  for (const auto& reference : references) {
    const auto ref_ngrams = ExtractNgrams(reference, options);
    std::vector<int64_t> stats;
    for (size_t i = 0; i < hyp_ngrams.size(); ++i) {
      AppendMatchStatistics(hyp_ngrams[i], ref_ngrams[i], &stats);
    }
    const double score = ChrfScoreFromStatistics(stats, options);
    if (score > best_score) {
      best_score = score;
      best = std::move(stats);
    }
  }
  return best;
}

// The arithmetic follows sacrebleu's _compute_f_score operation by operation, so that the
// doubles agree bit for bit rather than merely to rounding.
double ChrfScoreFromStatistics(std::span<const int64_t> statistics, const ChrfOptions& options) {
  constexpr double kEps = 1e-16;
  const int orders = options.char_order + options.word_order;
  const double factor = static_cast<double>(options.beta) * options.beta;
  double eps_score = 0.0, avg_prec = 0.0, avg_rec = 0.0;
  int effective_order = 0;
  for (int i = 0; i < orders; ++i) {
    const int64_t n_hyp = statistics[3 * i], n_ref = statistics[3 * i + 1],
                  n_match = statistics[3 * i + 2];
    const double prec = n_hyp > 0 ? static_cast<double>(n_match) / n_hyp : kEps;
    const double rec = n_ref > 0 ? static_cast<double>(n_match) / n_ref : kEps;
    const double denom = factor * prec + rec;
    eps_score += denom > 0 ? (1 + factor) * prec * rec / denom : kEps;
    if (n_hyp > 0 && n_ref > 0) {
      avg_prec += prec;
      avg_rec += rec;
      ++effective_order;
    }
  }
  if (options.eps_smoothing) return 100 * eps_score / orders;
  if (effective_order == 0) {
    avg_prec = avg_rec = 0.0;
  } else {
    avg_prec /= effective_order;
    avg_rec /= effective_order;
  }
  if (avg_prec + avg_rec == 0.0) return 0.0;
  double score = (1 + factor) * avg_prec * avg_rec;
  score /= factor * avg_prec + avg_rec;
  return 100 * score;
}

double CorpusChrf(std::span<const std::string> hypotheses, std::span<const std::string> references,
                  const ChrfOptions& options) {
  std::vector<int64_t> total(3 * (options.char_order + options.word_order), 0);
  for (size_t i = 0; i < hypotheses.size() && i < references.size(); ++i) {
    const auto stats = ChrfSegmentStatistics(hypotheses[i], references.subspan(i, 1), options);
    for (size_t k = 0; k < total.size(); ++k) total[k] += stats[k];
  }
  return ChrfScoreFromStatistics(total, options);
}

double SentenceChrf(std::string_view hypothesis, std::string_view reference,
                    const ChrfOptions& options) {
  const std::string refs[] = {std::string(reference)};
  return ChrfScoreFromStatistics(ChrfSegmentStatistics(hypothesis, refs, options), options);
}

}  // namespace stemma::engine::eval
