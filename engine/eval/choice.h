// k-shot multiple choice as lm-evaluation-harness defines it (algorithms.md §8; docs/eval.md,
// "choice"): dataset readers for the Belebele, PIQA and Global-PIQA JSONL layouts, prompt
// assembly, the context/continuation token split, and acc / acc_norm / acc_bytes.
// Torch-free; the log-likelihoods come from EvalModel::ContinuationLogLikelihoods.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/tokenizer/tokenizer.h"

namespace stemma::engine::eval {

enum class ChoiceFormat { kBelebele, kPiqa, kGlobalPiqa };

absl::StatusOr<ChoiceFormat> ChoiceFormatFromName(const std::string& name);

struct ChoiceDoc {
  std::string query;                 // doc_to_text: the prompt for this doc
  std::vector<std::string> choices;  // doc_to_choice, without the target delimiter
  int64_t gold = 0;                  // index into choices
};

// One JSON object per non-blank line:
//   belebele:    flores_passage, question, mc_answer1..mc_answer4 (strings),
//                correct_answer_num ("1".."4" or 1..4)
//                -> "P: {passage}\nQ: {question.strip()}\nA: {a1}\nB: {a2}\nC: {a3}\nD:
//                {a4}\nAnswer:",
//                   choices A, B, C, D
//   piqa:        goal, sol1, sol2 (strings), label (0 or 1) -> "Question: {goal}\nAnswer:",
//                choices sol1, sol2
//   global_piqa: prompt, solution0, solution1[, solution2, ...] (strings), label
//                -> the prompt, choices the solutions
// `limit` > 0 reads the first `limit` docs only. InvalidArgument naming file:line and the
// field (missing, wrong type, label out of range); NotFound for a missing file; an empty file
// is an error too.
absl::StatusOr<std::vector<ChoiceDoc>> ReadChoiceDocs(const std::string& path, ChoiceFormat format,
                                                      int64_t limit = 0);

// lm-eval's context: for each shot, query + " " + gold choice + "\n\n"; then doc.query.
std::string ChoiceContext(const std::vector<const ChoiceDoc*>& shots, const ChoiceDoc& doc);

// lm-eval's _encode_pair for (context, " " + choice): trailing whitespace of the context
// moves to the continuation; whole = encode(context + continuation), the continuation's
// tokens are whole[len(encode(context)):]. With `bos`, both encodings start with it.
struct EncodedPair {
  std::vector<int32_t> context;
  std::vector<int32_t> continuation;
};
EncodedPair EncodePair(const tokenizer::Tokenizer& tokenizer, const std::string& context,
                       const std::string& continuation, std::optional<int32_t> bos);

// Per-doc outcome of the three metrics (1 = correct). Ties go to the first choice, as
// numpy's argmax.
struct ChoiceOutcome {
  double acc = 0, acc_norm = 0, acc_bytes = 0;
};
// acc: argmax ll; acc_norm: argmax ll / len(choice) in code points; acc_bytes: argmax
// ll / UTF-8 bytes of the choice.
ChoiceOutcome ScoreChoices(const std::vector<double>& log_likelihoods,
                           const std::vector<std::string>& choices, int64_t gold);

}  // namespace stemma::engine::eval
