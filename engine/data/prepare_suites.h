// The evaluation suites of a prepared corpus (docs/corpus.md, "Suites"), built from its
// reserved pairs and held-out texts: translation choice per language (Belebele layout),
// continuation per language and general over the base language (Global-PIQA layout, four
// endings). Internal to `stemma-engine prepare` (prepare.cc); deterministic like it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "stemma/v1/specs/data.pb.h"

namespace stemma::engine::data {

// splitmix64: the seeded draws of mixtures and suites (fully specified, unlike the
// standard library's distributions).
class SplitMix {
 public:
  explicit SplitMix(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }
  uint64_t Below(uint64_t n) { return n == 0 ? 0 : Next() % n; }

 private:
  uint64_t state_;
};

// An evaluation pair: a normalised English string and its translation.
struct CorpusPair {
  std::string en, tgt;
};

// What the suites read of one language.
struct SuiteLanguage {
  const v1::CorpusLanguage* spec = nullptr;
  std::string name;  // display name, in the translation question
  bool base = false;
  const std::vector<CorpusPair>* reserved = nullptr;  // in hash order of the English side
  const std::vector<std::string>* heldout = nullptr;  // in hash order
};

// One line of JSON (or indented), invalid UTF-8 replaced rather than thrown on.
std::string CorpusJson(const nlohmann::ordered_json& j, int indent = -1);

struct CorpusSuites {
  std::vector<std::pair<std::string, std::string>> files;          // (path in the corpus, contents)
  nlohmann::ordered_json index = nlohmann::ordered_json::array();  // suites.json's entries
};

// Every suite of `languages` with enough material (four candidates), and suites/suites.json.
CorpusSuites BuildCorpusSuites(const v1::CorpusSuites& options,
                               const std::vector<SuiteLanguage>& languages);

}  // namespace stemma::engine::data
