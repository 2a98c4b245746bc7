// The library behind `stemma-engine prepare` (docs/corpus.md, docs/engine/prepare.md):
// per-language gettext catalogues, text and JSONL files to a prepared corpus directory
//
//   manifest.json                 format stemma.corpus/1: languages, files {path, bytes,
//                                 lines, sha256}, content_hash, sources, parameters, suites
//   train/<code>.txt              training documents, one per line (held_in and base)
//   heldout/<code>.txt            held-out documents of every language
//   mix/<name>.txt                temperature-sampled mixtures of train texts
//   pairs/<base>-<code>.jsonl     reserved evaluation pairs {"id","src","tgt"}
//   suites/translation_choice_<code>.jsonl   Belebele layout
//   suites/continuation_<code>.jsonl         Global-PIQA layout, four endings
//   suites/general_<base>.jsonl              the same over the base language
//   suites/suites.json            name, version, file, sha256, examples, format per suite
//
// published atomically (engine/io/durable.h). Deterministic: the same sources and spec give
// byte-identical files, whatever the machine. heldout_split `last` holds out each language's
// tail by position; keep_documents takes text and JSONL documents as they are (no
// normalisation, filter or deduplication; source order). docs/corpus.md says both in full.
//
// Thread-safety: PrepareCorpus may run concurrently for different `out` directories.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "stemma/v1/specs/data.pb.h"

namespace stemma::engine::data {

inline constexpr char kCorpusFormat[] = "stemma.corpus/1";
inline constexpr char kTranslationChoiceVersion[] = "translation_choice@1";
inline constexpr char kContinuationVersion[] = "continuation@1";
inline constexpr char kGeneralVersion[] = "general@1";
inline constexpr char kPairsVersion[] = "pairs@1";  // pairs/<base>-<code>.jsonl

struct PrepareSummary {
  std::string out;
  std::string manifest_sha256;  // sha256 of out/manifest.json
  std::string content_hash;     // the manifest's content_hash
  int64_t bytes = 0;            // every file the manifest lists, manifest.json included
  nlohmann::ordered_json languages =
      nlohmann::ordered_json::array();  // code, role, bytes and lines per split
  double seconds = 0;
};

// The split hash of the corpus: a 64-bit FNV-1a of (seed, salt, text) finished with
// splitmix64's mixer, as a fraction in [0, 1). Documented in docs/corpus.md so that other
// tools can reproduce the splits.
double CorpusHashFraction(uint64_t seed, std::string_view salt, std::string_view text);
uint64_t CorpusHash(uint64_t seed, std::string_view salt, std::string_view text);

// Builds and publishes the corpus of `spec` (defaults filled, checked by the spec rules).
// `progress(fraction, message)` is called as the work advances (may be empty).
// Errors: InvalidArgument / NotFound naming the field and file ("languages[3].gettext:
// /usr/share/locale/xx/LC_MESSAGES: no such directory", "a.jsonl:7: field 'text' missing"),
// AlreadyExists when `out` exists without overwrite.
absl::StatusOr<PrepareSummary> PrepareCorpus(
    const v1::PrepareSpec& spec,
    const std::function<void(double, const std::string&)>& progress = {});

}  // namespace stemma::engine::data
