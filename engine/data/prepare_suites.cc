#include "engine/data/prepare_suites.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "engine/data/corpus_text.h"
#include "engine/data/prepare.h"
#include "engine/io/sha256.h"

namespace stemma::engine::data {
namespace {

using Json = nlohmann::ordered_json;

// The positions of up to three distractors for item `self` of `pool` (sorted by length):
// drawn from its neighbours in length, distinct from it and from each other by `text`.
std::vector<size_t> Distractors(const std::vector<std::string>& texts,
                                const std::vector<size_t>& by_length, size_t position,
                                SplitMix* rng) {
  const std::string& self = texts[by_length[position]];
  for (size_t radius = 8; radius <= by_length.size() + 8; radius *= 2) {
    const size_t lo = position >= radius ? position - radius : 0;
    const size_t hi = std::min(by_length.size(), position + radius + 1);
    std::vector<size_t> window;
    std::set<std::string> distinct;
    for (size_t p = lo; p < hi; ++p) {
      const std::string& t = texts[by_length[p]];
      if (p != position && t != self && distinct.insert(t).second) window.push_back(by_length[p]);
    }
    if (window.size() < 3 && hi - lo < by_length.size()) continue;
    if (window.size() < 3) return {};
    std::vector<size_t> picked;
    for (int k = 0; k < 3; ++k) {
      const size_t at = k + rng->Below(window.size() - k);
      std::swap(window[k], window[at]);
      picked.push_back(window[k]);
    }
    return picked;
  }
  return {};
}

std::vector<size_t> ByLength(const std::vector<std::string>& texts) {
  std::vector<size_t> order(texts.size());
  std::vector<int64_t> length(texts.size());
  for (size_t i = 0; i < order.size(); ++i) {
    order[i] = i;
    length[i] = CodePoints(texts[i]);
  }
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return length[a] != length[b] ? length[a] < length[b] : texts[a] < texts[b];
  });
  return order;
}

std::vector<std::string> Words(const std::string& text) {
  std::vector<std::string> words;
  size_t i = 0;
  while (i < text.size()) {
    const size_t end = text.find(' ', i);
    words.push_back(text.substr(i, end == std::string::npos ? std::string::npos : end - i));
    if (end == std::string::npos) break;
    i = end + 1;
  }
  return words;
}

// A suite's file: its name, the suite it belongs to and its rows.
struct SuiteText {
  std::string name, suite, version, format, text;
  int64_t examples = 0;
};

// The order in which pool items are tried: by hash of their key under `salt`, ties by key.
std::vector<size_t> HashOrder(const std::vector<std::string>& keys, uint64_t seed,
                              const std::string& salt) {
  std::vector<size_t> chosen(keys.size());
  std::vector<uint64_t> rank(keys.size());
  for (size_t i = 0; i < chosen.size(); ++i) {
    chosen[i] = i;
    rank[i] = CorpusHash(seed, salt, keys[i]);
  }
  std::sort(chosen.begin(), chosen.end(), [&](size_t a, size_t b) {
    return rank[a] != rank[b] ? rank[a] < rank[b] : keys[a] < keys[b];
  });
  return chosen;
}

// Each item's place in `by_length`.
std::vector<size_t> Positions(const std::vector<size_t>& by_length) {
  std::vector<size_t> position(by_length.size());
  for (size_t p = 0; p < by_length.size(); ++p) position[by_length[p]] = p;
  return position;
}

// Translation choice: the English sentence as the passage, four candidates in the language.
SuiteText TranslationChoice(const v1::CorpusSuites& options, const SuiteLanguage& l) {
  SuiteText out{absl::StrCat("translation_choice_", l.spec->code()), "translation_choice",
                kTranslationChoiceVersion, "belebele"};
  std::vector<const CorpusPair*> pool;
  for (const CorpusPair& p : *l.reserved) {
    if (CodePoints(p.en) <= options.max_chars() && CodePoints(p.tgt) <= options.max_chars())
      pool.push_back(&p);
  }
  if (pool.size() < 4) return out;
  std::vector<std::string> texts, english;
  for (const CorpusPair* p : pool) {
    texts.push_back(p->tgt);
    english.push_back(p->en);
  }
  const std::vector<size_t> by_length = ByLength(texts);
  const std::vector<size_t> position = Positions(by_length);
  const std::string question =
      absl::StrCat("Which sentence is the translation of the passage into ", l.name, "?");
  for (size_t i : HashOrder(english, options.seed(), "translation_choice")) {
    if (out.examples == options.examples()) break;
    SplitMix rng(CorpusHash(options.seed(), absl::StrCat("translation_choice/", l.spec->code()),
                            pool[i]->en));
    std::vector<size_t> distractors = Distractors(texts, by_length, position[i], &rng);
    if (distractors.size() < 3) continue;
    const int64_t gold = static_cast<int64_t>(rng.Below(4));
    std::vector<std::string> answers;
    for (size_t d : distractors) answers.push_back(texts[d]);
    answers.insert(answers.begin() + gold, pool[i]->tgt);
    Json row = {{"id", absl::StrCat(l.spec->code(), "-",
                                    absl::Hex(CorpusHash(0, "id", pool[i]->en), absl::kZeroPad16))},
                {"language", l.spec->code()},
                {"flores_passage", pool[i]->en},
                {"question", question},
                {"mc_answer1", answers[0]},
                {"mc_answer2", answers[1]},
                {"mc_answer3", answers[2]},
                {"mc_answer4", answers[3]},
                {"correct_answer_num", std::to_string(gold + 1)}};
    absl::StrAppend(&out.text, CorpusJson(row), "\n");
    ++out.examples;
  }
  return out;
}

// Continuation (general for the base language): the first half of a held-out sentence, its
// true end and three others.
SuiteText Continuation(const v1::CorpusSuites& options, const SuiteLanguage& l) {
  SuiteText out = l.base ? SuiteText{absl::StrCat("general_", l.spec->code()), "general",
                                     kGeneralVersion, "global_piqa"}
                         : SuiteText{absl::StrCat("continuation_", l.spec->code()), "continuation",
                                     kContinuationVersion, "global_piqa"};
  std::vector<std::string> contexts, endings;
  for (const std::string& d : *l.heldout) {
    if (CodePoints(d) > options.max_chars()) continue;
    const std::vector<std::string> words = Words(d);
    if (static_cast<int64_t>(words.size()) < options.min_words()) continue;
    const size_t cut = words.size() / 2;
    std::string context, ending;
    for (size_t w = 0; w < words.size(); ++w) {
      std::string& side = w < cut ? context : ending;
      if (!side.empty()) side.push_back(' ');
      side.append(words[w]);
    }
    contexts.push_back(std::move(context));
    endings.push_back(std::move(ending));
  }
  if (endings.size() < 4) return out;
  const std::vector<size_t> by_length = ByLength(endings);
  const std::vector<size_t> position = Positions(by_length);
  const std::string salt = l.base ? "general" : "continuation";
  std::vector<std::string> keys(endings.size());
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = contexts[i] + " " + endings[i];
  for (size_t i : HashOrder(keys, options.seed(), salt)) {
    if (out.examples == options.examples()) break;
    SplitMix rng(CorpusHash(options.seed(), absl::StrCat(salt, "/", l.spec->code()), keys[i]));
    std::vector<size_t> distractors = Distractors(endings, by_length, position[i], &rng);
    if (distractors.size() < 3) continue;
    const int64_t gold = static_cast<int64_t>(rng.Below(4));
    std::vector<std::string> solutions;
    for (size_t d : distractors) solutions.push_back(endings[d]);
    solutions.insert(solutions.begin() + gold, endings[i]);
    Json row = {{"id", absl::StrCat(l.spec->code(), "-",
                                    absl::Hex(CorpusHash(0, "id", keys[i]), absl::kZeroPad16))},
                {"language", l.spec->code()},
                {"prompt", contexts[i]},
                {"solution0", solutions[0]},
                {"solution1", solutions[1]},
                {"solution2", solutions[2]},
                {"solution3", solutions[3]},
                {"label", gold}};
    absl::StrAppend(&out.text, CorpusJson(row), "\n");
    ++out.examples;
  }
  return out;
}

}  // namespace

std::string CorpusJson(const nlohmann::ordered_json& j, int indent) {
  return j.dump(indent, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

CorpusSuites BuildCorpusSuites(const v1::CorpusSuites& options,
                               const std::vector<SuiteLanguage>& languages) {
  CorpusSuites out;
  auto record = [&](const SuiteLanguage& l, SuiteText suite) {
    if (suite.examples == 0) return;
    const std::string path = absl::StrCat("suites/", suite.name, ".jsonl");
    out.index.push_back({{"name", suite.name},
                         {"suite", suite.suite},
                         {"version", suite.version},
                         {"language", l.spec->code()},
                         {"file", path},
                         {"sha256", io::Sha256Hex(suite.text)},
                         {"examples", suite.examples},
                         {"format", suite.format}});
    out.files.emplace_back(path, std::move(suite.text));
  };
  for (const SuiteLanguage& l : languages) {
    if (!l.base) record(l, TranslationChoice(options, l));
  }
  for (const SuiteLanguage& l : languages) record(l, Continuation(options, l));
  Json index = {{"format", "stemma.suites/1"},
                {"versions",
                 {{"translation_choice", kTranslationChoiceVersion},
                  {"continuation", kContinuationVersion},
                  {"general", kGeneralVersion},
                  {"pairs", kPairsVersion}}},
                {"suites", out.index}};
  out.files.emplace_back("suites/suites.json", CorpusJson(index, 2) + "\n");
  return out;
}

}  // namespace stemma::engine::data
