#include "engine/eval/choice.h"

#include <fstream>
#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/json_line.h"
#include "common/status.h"
#include "engine/eval/eval_text.h"

namespace stemma::engine::eval {
namespace {

// Reads the fields of one JSONL record, errors naming "file:line: field 'x' ...".
class Record {
 public:
  Record(const nlohmann::json& j, std::string where) : j_(j), where_(std::move(where)) {}
  absl::Status Error(const std::string& field, const std::string& what) const {
    return absl::InvalidArgumentError(absl::StrCat(where_, ": field '", field, "' ", what));
  }
  bool Has(const std::string& field) const { return j_.contains(field); }
  absl::StatusOr<std::string> String(const std::string& field) const {
    if (!Has(field)) return Error(field, "missing");
    if (!j_[field].is_string()) {
      return Error(field, absl::StrCat("is ", j_[field].type_name(), ", not a string"));
    }
    return j_[field].get<std::string>();
  }
  // An integer label, also accepted as a string of digits ("2"), as datasets vary.
  absl::StatusOr<int64_t> Label(const std::string& field, int64_t first, int64_t count) const {
    if (!Has(field)) return Error(field, "missing");
    const auto& v = j_[field];
    int64_t value = -1;
    if (v.is_number_integer()) {
      value = v.get<int64_t>();
    } else if (v.is_string() && !v.get<std::string>().empty() &&
               v.get<std::string>().find_first_not_of("0123456789") == std::string::npos &&
               v.get<std::string>().size() < 10) {
      value = std::stoll(v.get<std::string>());
    } else {
      return Error(field, absl::StrCat("is ", v.type_name(), ", not an integer label"));
    }
    if (value < first || value >= first + count) {
      return Error(field, absl::StrCat("is ", value, ", outside ", first, "..", first + count - 1));
    }
    return value - first;
  }

 private:
  const nlohmann::json& j_;
  std::string where_;
};

absl::StatusOr<ChoiceDoc> BelebeleDoc(const Record& r) {
  ChoiceDoc doc;
  ASSIGN_OR_RETURN(std::string passage, r.String("flores_passage"));
  ASSIGN_OR_RETURN(std::string question, r.String("question"));
  doc.query = absl::StrCat("P: ", passage, "\nQ: ", PythonStrip(question));
  static const char* kLetters[] = {"A", "B", "C", "D"};
  for (int i = 0; i < 4; ++i) {
    ASSIGN_OR_RETURN(std::string answer, r.String(absl::StrCat("mc_answer", i + 1)));
    absl::StrAppend(&doc.query, "\n", kLetters[i], ": ", answer);
    doc.choices.push_back(kLetters[i]);
  }
  absl::StrAppend(&doc.query, "\nAnswer:");
  ASSIGN_OR_RETURN(doc.gold, r.Label("correct_answer_num", 1, 4));
  return doc;
}

absl::StatusOr<ChoiceDoc> PiqaDoc(const Record& r) {
  ChoiceDoc doc;
  ASSIGN_OR_RETURN(std::string goal, r.String("goal"));
  doc.query = absl::StrCat("Question: ", goal, "\nAnswer:");
  for (const char* field : {"sol1", "sol2"}) {
    ASSIGN_OR_RETURN(std::string solution, r.String(field));
    doc.choices.push_back(std::move(solution));
  }
  ASSIGN_OR_RETURN(doc.gold, r.Label("label", 0, 2));
  return doc;
}

absl::StatusOr<ChoiceDoc> GlobalPiqaDoc(const Record& r) {
  ChoiceDoc doc;
  ASSIGN_OR_RETURN(doc.query, r.String("prompt"));
  for (int i = 0; i < 2 || r.Has(absl::StrCat("solution", i)); ++i) {
    ASSIGN_OR_RETURN(std::string solution, r.String(absl::StrCat("solution", i)));
    doc.choices.push_back(std::move(solution));
  }
  ASSIGN_OR_RETURN(doc.gold, r.Label("label", 0, static_cast<int64_t>(doc.choices.size())));
  return doc;
}

}  // namespace

absl::StatusOr<ChoiceFormat> ChoiceFormatFromName(const std::string& name) {
  if (name == "belebele") return ChoiceFormat::kBelebele;
  if (name == "piqa") return ChoiceFormat::kPiqa;
  if (name == "global_piqa") return ChoiceFormat::kGlobalPiqa;
  return absl::InvalidArgumentError(
      absl::StrCat("format '", name, "' is not one of: belebele, piqa, global_piqa"));
}

absl::StatusOr<std::vector<ChoiceDoc>> ReadChoiceDocs(const std::string& path, ChoiceFormat format,
                                                      int64_t limit) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open the dataset"));
  std::vector<ChoiceDoc> docs;
  std::string line;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    if (limit > 0 && static_cast<int64_t>(docs.size()) == limit) break;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = absl::StrCat(path, ":", number);
    ASSIGN_OR_RETURN(nlohmann::json j, ParseJsonObject(line, where));
    Record record(j, where);
    absl::StatusOr<ChoiceDoc> doc = format == ChoiceFormat::kBelebele ? BelebeleDoc(record)
                                    : format == ChoiceFormat::kPiqa   ? PiqaDoc(record)
                                                                      : GlobalPiqaDoc(record);
    if (!doc.ok()) return doc.status();
    docs.push_back(*std::move(doc));
  }
  if (docs.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": no documents"));
  return docs;
}

std::string ChoiceContext(const std::vector<const ChoiceDoc*>& shots, const ChoiceDoc& doc) {
  std::string context;
  for (const ChoiceDoc* shot : shots) {
    absl::StrAppend(&context, shot->query, " ", shot->choices[shot->gold], "\n\n");
  }
  absl::StrAppend(&context, doc.query);
  return context;
}

EncodedPair EncodePair(const tokenizer::Tokenizer& tokenizer, const std::string& context,
                       const std::string& continuation, std::optional<int32_t> bos) {
  std::string ctx = PythonRstrip(context);
  const std::string cont = context.substr(ctx.size()) + continuation;
  auto encode = [&](const std::string& text) {
    std::vector<int32_t> ids;
    if (bos) ids.push_back(*bos);
    const auto body = tokenizer.Encode(text);
    ids.insert(ids.end(), body.begin(), body.end());
    return ids;
  };
  EncodedPair pair;
  pair.context = encode(ctx);
  const auto whole = encode(ctx + cont);
  const size_t split = std::min(pair.context.size(), whole.size());
  pair.continuation.assign(whole.begin() + split, whole.end());
  return pair;
}

ChoiceOutcome ScoreChoices(const std::vector<double>& log_likelihoods,
                           const std::vector<std::string>& choices, int64_t gold) {
  auto argmax = [&](auto&& scale) {
    int64_t best = 0;
    for (size_t i = 1; i < log_likelihoods.size(); ++i) {
      if (log_likelihoods[i] / scale(i) > log_likelihoods[best] / scale(best)) best = i;
    }
    return best;
  };
  ChoiceOutcome outcome;
  outcome.acc = argmax([](size_t) { return 1.0; }) == gold;
  outcome.acc_norm =
      argmax([&](size_t i) { return static_cast<double>(CodePointLength(choices[i])); }) == gold;
  outcome.acc_bytes =
      argmax([&](size_t i) { return static_cast<double>(choices[i].size()); }) == gold;
  return outcome;
}

}  // namespace stemma::engine::eval
