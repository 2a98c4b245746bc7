#include "engine/data/prepare.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <set>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/engine_spec.h"
#include "common/status.h"
#include "engine/data/corpus_text.h"
#include "engine/data/mo_file.h"
#include "engine/data/prepare_suites.h"
#include "engine/data/text_input.h"
#include "engine/io/durable.h"
#include "engine/io/fs.h"
#include "engine/io/sha256.h"

namespace stemma::engine::data {
namespace {

using Json = nlohmann::ordered_json;

// Salts of the hashes, so that the reserved-pair, held-out, order and suite decisions are
// independent of each other.
constexpr char kSaltEval[] = "eval";
constexpr char kSaltHeldout[] = "heldout";
constexpr char kSaltOrder[] = "order";

std::string Dump(const Json& j, int indent = -1) { return CorpusJson(j, indent); }

struct Stats {
  int64_t strings = 0;       // source strings read (msgstrs, lines, JSONL records)
  int64_t untranslated = 0;  // gettext entries without a translation
  int64_t invalid_utf8 = 0;
  int64_t too_short = 0;
  int64_t no_letters = 0;
  int64_t duplicates = 0;
  int64_t reserved_excluded = 0;       // a side of an evaluation pair
  int64_t train_overlap_excluded = 0;  // held_out language: a string trained on elsewhere
  int64_t budget_dropped = 0;
  Json ToJson() const {
    return {{"strings", strings},
            {"untranslated", untranslated},
            {"invalid_utf8", invalid_utf8},
            {"too_short", too_short},
            {"no_letters", no_letters},
            {"duplicates", duplicates},
            {"reserved_excluded", reserved_excluded},
            {"train_overlap_excluded", train_overlap_excluded},
            {"budget_dropped", budget_dropped}};
  }
};

struct Language {
  const v1::CorpusLanguage* spec = nullptr;
  int index = 0;
  std::string name;  // display name
  bool base = false, held_out = false;
  std::vector<CorpusPair> pairs;  // gettext pairs in read order (normalised, both sides kept)
  std::vector<std::string> docs;  // documents in read order (before dedup)
  // Per document of `docs`: taken as it is (keep_documents: a text or JSONL document, never
  // normalised, deduplicated or filtered by length).
  std::vector<bool> as_is;
  std::vector<std::string> train, heldout;  // final texts, in hash or source order
  std::vector<CorpusPair> reserved;         // evaluation pairs, in hash order of the English side
  Stats stats;
  Json sources = Json::array();
};

void Count(DropReason reason, Stats* stats) {
  if (reason == DropReason::kInvalidUtf8) ++stats->invalid_utf8;
  if (reason == DropReason::kTooShort) ++stats->too_short;
  if (reason == DropReason::kNoLetters) ++stats->no_letters;
}

bool IsDirectory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

absl::StatusOr<std::vector<std::string>> MoFiles(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return ErrnoStatus("open directory " + dir, errno);
  std::vector<std::string> names;
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (absl::EndsWith(name, ".mo")) names.push_back(name);
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

bool Utf8Charset(const std::string& charset) {
  const std::string c = absl::AsciiStrToLower(charset);
  return c.empty() || c == "utf-8" || c == "utf8" || c == "ascii" || c == "us-ascii" ||
         c == "charset";
}

// A normaliser that remembers: the same msgid appears in the catalogues of every language.
class Normalizer {
 public:
  explicit Normalizer(NormalizeOptions options) : options_(std::move(options)) {}
  const NormalizedText& operator()(const std::string& raw) {
    auto it = cache_.find(raw);
    if (it != cache_.end()) return it->second;
    return cache_.emplace(raw, NormalizeCorpusText(raw, options_)).first->second;
  }
  NormalizedText Once(std::string_view raw) const { return NormalizeCorpusText(raw, options_); }

 private:
  NormalizeOptions options_;
  absl::flat_hash_map<std::string, NormalizedText> cache_;
};

class Preparer {
 public:
  Preparer(const v1::PrepareSpec& spec,
           const std::function<void(double, const std::string&)>& progress)
      : spec_(spec),
        progress_(progress),
        english_(NormalizeOptions{spec.placeholder(), spec.min_chars()}),
        target_(NormalizeOptions{spec.placeholder(), spec.min_chars()}) {}

  absl::StatusOr<PrepareSummary> Run();

 private:
  void Progress(double fraction, const std::string& message) const {
    if (progress_) progress_(fraction, message);
  }
  absl::Status ReadSources();
  absl::Status ReadGettext(Language* l, const std::string& root, const std::string& field);
  absl::Status ReadText(Language* l, const std::string& path, const std::string& field);
  absl::Status ReadJsonl(Language* l, const std::string& path, const std::string& json_field,
                         const std::string& field);
  absl::Status AddDocument(Language* l, std::string_view raw, const std::string& where);
  bool Excluded(const std::string& doc, bool as_is) const;
  void Reserve();
  void Split();
  void Mixtures();
  absl::Status Instructions();
  void Suites();
  absl::StatusOr<PrepareSummary> Write();
  void AddFile(const std::string& path, std::string contents) {
    files_[path] = std::move(contents);
  }

  const v1::PrepareSpec& spec_;
  const std::function<void(double, const std::string&)>& progress_;
  Normalizer english_, target_;
  std::vector<Language> languages_;
  Language* base_ = nullptr;
  absl::flat_hash_set<std::string> gettext_english_;  // every normalised msgid kept
  absl::flat_hash_set<std::string> excluded_;         // both sides of every reserved pair
  std::map<std::string, std::string> files_;          // path in the corpus -> contents
  Json mixtures_ = Json::array();
  Json instructions_ = Json::array();
  Json suites_ = Json::array();
};

// A text or JSONL document: normalised (and dropped for the reasons normalisation has), or
// with keep_documents taken as it is, refused only when the corpus cannot hold it: invalid
// UTF-8 is dropped, a blank document skipped, and a line break is an error (train/ and
// heldout/ hold one document per line).
absl::Status Preparer::AddDocument(Language* l, std::string_view raw, const std::string& where) {
  ++l->stats.strings;
  if (!spec_.keep_documents()) {
    NormalizedText n = target_.Once(raw);
    if (n.reason != DropReason::kKept) {
      Count(n.reason, &l->stats);
      return absl::OkStatus();
    }
    l->docs.push_back(std::move(n.text));
    l->as_is.push_back(false);
    return absl::OkStatus();
  }
  if (!IsValidUtf8(raw)) {
    ++l->stats.invalid_utf8;
    return absl::OkStatus();
  }
  if (raw.find_first_not_of(" \t\r\n\f\v") == std::string_view::npos) {
    ++l->stats.too_short;
    return absl::OkStatus();
  }
  if (raw.find_first_of("\r\n") != std::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(where,
                     ": the document holds a line break, and keep_documents writes each document "
                     "as it is on one line of train/ and heldout/ (join its lines, or unset "
                     "keep_documents to have whitespace collapsed)"));
  }
  l->docs.emplace_back(raw);
  l->as_is.push_back(true);
  return absl::OkStatus();
}

absl::Status Preparer::ReadGettext(Language* l, const std::string& root, const std::string& field) {
  if (!IsDirectory(root)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", root, ": no such directory (the gettext root)"));
  }
  std::vector<std::string> locales(l->spec->locales().begin(), l->spec->locales().end());
  if (locales.empty()) locales.push_back(l->spec->code());
  for (const std::string& locale : locales) {
    const std::string dir = absl::StrCat(root, "/", locale, "/LC_MESSAGES");
    if (!IsDirectory(dir)) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": ", dir, ": no such directory (no gettext catalogues for '", locale,
                       "' under ", root, ")"));
    }
    ASSIGN_OR_RETURN(std::vector<std::string> names, MoFiles(dir));
    std::string listing;
    int64_t entries = 0, kept_pairs = 0;
    Json skipped = Json::array();
    for (const std::string& name : names) {
      const std::string path = absl::StrCat(dir, "/", name);
      ASSIGN_OR_RETURN(std::string bytes, io::ReadFile(path));
      absl::StrAppend(&listing, io::Sha256Hex(bytes), "  ", name, "\n");
      absl::StatusOr<MoCatalogue> cat = ParseMoFile(bytes, path);
      if (!cat.ok()) return cat.status();
      if (!Utf8Charset(cat->charset)) {
        // Debian's catalogues are UTF-8; one in another charset is left out, and said so.
        skipped.push_back({{"file", name}, {"charset", cat->charset}});
        continue;
      }
      l->stats.untranslated += cat->untranslated;
      entries += static_cast<int64_t>(cat->entries.size());
      for (const MoEntry& e : cat->entries) {
        ++l->stats.strings;
        const NormalizedText& en = english_(e.msgid);
        NormalizedText tgt = target_.Once(e.msgstr);
        if (en.reason == DropReason::kKept) gettext_english_.insert(en.text);
        if (tgt.reason != DropReason::kKept) {
          Count(tgt.reason, &l->stats);
          continue;
        }
        if (l->base) {
          l->docs.push_back(std::move(tgt.text));
          l->as_is.push_back(false);
          continue;
        }
        if (en.reason == DropReason::kKept && en.text == tgt.text) {
          ++l->stats.untranslated;  // identical once normalised
          continue;
        }
        l->docs.push_back(tgt.text);
        l->as_is.push_back(false);
        if (en.reason == DropReason::kKept) {
          l->pairs.push_back({en.text, std::move(tgt.text)});
          ++kept_pairs;
        }
      }
    }
    Json source = {{"type", "gettext"},
                   {"root", root},
                   {"locale", locale},
                   {"catalogues", names.size()},
                   {"catalogues_sha256", io::Sha256Hex(listing)},
                   {"entries", entries},
                   {"pairs", kept_pairs}};
    if (!skipped.empty()) source["skipped"] = skipped;
    l->sources.push_back(std::move(source));
  }
  return absl::OkStatus();
}

absl::Status Preparer::ReadText(Language* l, const std::string& path, const std::string& field) {
  auto in = LineReader::Open(path);
  if (!in.ok())
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", path, ": cannot open the file"));
  std::string line, all;
  for (int64_t number = 1; (*in)->Next(&line); ++number) {
    absl::StrAppend(&all, line, "\n");
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    RETURN_IF_ERROR(AddDocument(l, line, absl::StrCat(path, ":", number)));
  }
  RETURN_IF_ERROR((*in)->status());
  l->sources.push_back({{"type", "text"}, {"path", path}, {"sha256", io::Sha256Hex(all)}});
  return absl::OkStatus();
}

absl::Status Preparer::ReadJsonl(Language* l, const std::string& path,
                                 const std::string& json_field, const std::string& field) {
  auto in = LineReader::Open(path);
  if (!in.ok())
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", path, ": cannot open the file"));
  std::string line, all;
  for (int64_t number = 1; (*in)->Next(&line); ++number) {
    absl::StrAppend(&all, line, "\n");
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = absl::StrCat(path, ":", number);
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": not a JSON object (", field, ")"));
    }
    auto it = j.find(json_field);
    if (it == j.end())
      return absl::InvalidArgumentError(absl::StrCat(where, ": field '", json_field, "' missing"));
    if (!it->is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": field '", json_field, "' is ", it->type_name(), ", not a string"));
    }
    RETURN_IF_ERROR(AddDocument(l, it->get<std::string>(), where));
  }
  RETURN_IF_ERROR((*in)->status());
  l->sources.push_back(
      {{"type", "jsonl"}, {"path", path}, {"field", json_field}, {"sha256", io::Sha256Hex(all)}});
  return absl::OkStatus();
}

absl::Status Preparer::ReadSources() {
  languages_.resize(spec_.languages_size());
  for (int i = 0; i < spec_.languages_size(); ++i) {
    Language& l = languages_[i];
    l.spec = &spec_.languages(i);
    l.index = i;
    l.name = l.spec->name().empty() ? l.spec->code() : l.spec->name();
    l.base = l.spec->role() == "base";
    l.held_out = l.spec->role() == "held_out";
    if (l.base) base_ = &l;
  }
  if (base_ == nullptr) return absl::InvalidArgumentError("languages: no language has role base");
  for (size_t i = 0; i < languages_.size(); ++i) {
    Language& l = languages_[i];
    const v1::CorpusLanguage& s = *l.spec;
    const std::string at = absl::StrCat("languages[", i, "]");
    Progress(0.6 * static_cast<double>(i) / languages_.size(), absl::StrCat("reading ", s.code()));
    const bool own = !s.gettext().empty() || s.text_size() > 0 || s.jsonl_size() > 0;
    if (!s.gettext().empty()) {
      RETURN_IF_ERROR(ReadGettext(&l, s.gettext(), at + ".gettext"));
    } else if (!own && !l.base && !spec_.gettext().empty()) {
      RETURN_IF_ERROR(ReadGettext(&l, spec_.gettext(), "gettext"));
    } else if (!own && !l.base) {
      return absl::InvalidArgumentError(absl::StrCat(
          at, ".code: language '", s.code(), "' has no source: set its gettext, text or jsonl"));
    }
    for (int k = 0; k < s.text_size(); ++k) {
      const std::string field = absl::StrCat(at, ".text[", k, "]");
      ASSIGN_OR_RETURN(std::vector<std::string> paths, ExpandInputs({s.text(k)}, field));
      for (const std::string& path : paths) RETURN_IF_ERROR(ReadText(&l, path, field));
    }
    for (int k = 0; k < s.jsonl_size(); ++k) {
      const std::string field = absl::StrCat(at, ".jsonl[", k, "]");
      ASSIGN_OR_RETURN(std::vector<std::string> paths, ExpandInputs({s.jsonl(k).path()}, field));
      for (const std::string& path : paths)
        RETURN_IF_ERROR(ReadJsonl(&l, path, s.jsonl(k).field(), field));
    }
  }
  // The base language's documents: every gettext msgid read (sorted, so that the order
  // does not depend on the hash table), then its own sources.
  std::vector<std::string> docs(gettext_english_.begin(), gettext_english_.end());
  std::sort(docs.begin(), docs.end());
  std::vector<bool> as_is(docs.size(), false);
  docs.insert(docs.end(), std::make_move_iterator(base_->docs.begin()),
              std::make_move_iterator(base_->docs.end()));
  as_is.insert(as_is.end(), base_->as_is.begin(), base_->as_is.end());
  base_->docs = std::move(docs);
  base_->as_is = std::move(as_is);
  if (!gettext_english_.empty()) {
    base_->sources.push_back({{"type", "gettext msgids"}, {"strings", gettext_english_.size()}});
  }
  return absl::OkStatus();
}

// Evaluation pairs: the distinct English gettext strings whose hash falls under
// eval_fraction, with each language's first translation of them.
void Preparer::Reserve() {
  absl::flat_hash_set<std::string> reserved_english;
  for (const std::string& en : gettext_english_) {
    if (CorpusHashFraction(spec_.split_seed(), kSaltEval, en) < spec_.eval_fraction())
      reserved_english.insert(en);
  }
  excluded_.insert(reserved_english.begin(), reserved_english.end());
  for (Language& l : languages_) {
    if (l.base) continue;
    absl::flat_hash_set<std::string_view> seen;  // views into l.pairs, which stays put
    for (CorpusPair& p : l.pairs) {
      if (!seen.insert(p.en).second) continue;  // pairs are deduplicated on the English side
      if (reserved_english.count(p.en) > 0) l.reserved.push_back(p);
    }
    std::vector<std::pair<uint64_t, size_t>> keys;
    for (size_t i = 0; i < l.reserved.size(); ++i) {
      keys.emplace_back(CorpusHash(spec_.split_seed(), kSaltOrder, l.reserved[i].en), i);
    }
    std::sort(keys.begin(), keys.end(), [&](const auto& a, const auto& b) {
      return a.first != b.first ? a.first < b.first
                                : l.reserved[a.second].en < l.reserved[b.second].en;
    });
    std::vector<CorpusPair> sorted;
    for (const auto& [h, i] : keys) sorted.push_back(std::move(l.reserved[i]));
    l.reserved = std::move(sorted);
    for (const CorpusPair& p : l.reserved) excluded_.insert(p.tgt);
  }
}

// Whether a document is a side of a reserved evaluation pair. A document taken as it is
// counts by its normalised form too, so a reserved sentence with other spacing stays out.
bool Preparer::Excluded(const std::string& doc, bool as_is) const {
  if (excluded_.empty()) return false;
  if (excluded_.count(doc) > 0) return true;
  if (!as_is) return false;
  const NormalizedText n = target_.Once(doc);
  return n.reason == DropReason::kKept && excluded_.count(n.text) > 0;
}

// How many of n documents the `last` split holds out: ⌈fraction·n⌉, where a product within
// 1e-9 of an integer counts as that integer (0.07·100 is 7.000000000000001 in doubles).
size_t HeldoutCount(double fraction, size_t n) {
  const double k = std::ceil(fraction * static_cast<double>(n) - 1e-9);
  return k <= 0 ? 0 : std::min(n, static_cast<size_t>(k));
}

// The longest prefix of `docs` within `limit` bytes (with newlines); 0: no limit.
void Budget(std::vector<std::string>* docs, int64_t limit, int64_t* dropped) {
  if (limit <= 0) return;
  int64_t bytes = 0;
  size_t keep = 0;
  while (keep < docs->size() && bytes + static_cast<int64_t>((*docs)[keep].size()) + 1 <= limit) {
    bytes += static_cast<int64_t>((*docs)[keep].size()) + 1;
    ++keep;
  }
  *dropped += static_cast<int64_t>(docs->size() - keep);
  docs->resize(keep);
}

// Drops the documents of `docs` that are in `trained`, counting them.
void DropTrained(const absl::flat_hash_set<std::string>& trained, std::vector<std::string>* docs,
                 int64_t* dropped) {
  std::vector<std::string> kept;
  for (std::string& d : *docs) {
    if (trained.count(d) > 0) {
      ++*dropped;
    } else {
      kept.push_back(std::move(d));
    }
  }
  *docs = std::move(kept);
}

// Deduplicates each language's documents (not those taken as they are), drops the excluded
// ones, splits the rest and applies the budgets. The `hash` split depends only on a
// document's text, so a string shared by two languages lands on the same side in both; the
// `last` split holds out each language's tail, and then drops from held-out text every string
// trained on anywhere. A held_out language's text loses every string trained on elsewhere.
// Texts are in hash order, or in source order with `last` or keep_documents.
void Preparer::Split() {
  const bool last = spec_.heldout_split() == "last";
  const bool source_order = last || spec_.keep_documents();
  auto order = [&](std::vector<std::string>* docs) {
    if (source_order) return;
    std::vector<std::pair<uint64_t, std::string>> keyed;
    keyed.reserve(docs->size());
    for (std::string& d : *docs)
      keyed.emplace_back(CorpusHash(spec_.split_seed(), kSaltOrder, d), std::move(d));
    std::sort(keyed.begin(), keyed.end());
    docs->clear();
    for (auto& [h, d] : keyed) docs->push_back(std::move(d));
  };
  absl::flat_hash_set<std::string> trained;
  for (Language& l : languages_) {
    absl::flat_hash_set<std::string_view> seen;  // views into l.docs, which stays put here
    std::vector<std::string> unique;
    for (size_t i = 0; i < l.docs.size(); ++i) {
      std::string& d = l.docs[i];
      if (!l.as_is[i] && !seen.insert(std::string_view(d)).second) {
        ++l.stats.duplicates;
        continue;
      }
      if (Excluded(d, l.as_is[i])) {
        ++l.stats.reserved_excluded;
        continue;
      }
      unique.push_back(d);
    }
    seen.clear();
    l.docs.clear();
    l.docs.shrink_to_fit();
    l.as_is.clear();
    if (l.held_out) {
      l.heldout = std::move(unique);
      continue;
    }
    const size_t held = last ? HeldoutCount(spec_.heldout_fraction(), unique.size()) : 0;
    for (size_t i = 0; i < unique.size(); ++i) {
      std::string& d = unique[i];
      const bool out =
          last ? i >= unique.size() - held
               : CorpusHashFraction(spec_.split_seed(), kSaltHeldout, d) < spec_.heldout_fraction();
      (out ? l.heldout : l.train).push_back(std::move(d));
    }
    order(&l.train);
    order(&l.heldout);
    Budget(&l.train, l.spec->budget_bytes(), &l.stats.budget_dropped);
    trained.insert(l.train.begin(), l.train.end());
  }
  for (Language& l : languages_) {
    if (!l.held_out && !last) continue;
    DropTrained(trained, &l.heldout, &l.stats.train_overlap_excluded);
    if (!l.held_out) continue;
    order(&l.heldout);
    Budget(&l.heldout, l.spec->budget_bytes(), &l.stats.budget_dropped);
  }
}

std::string Lines(const std::vector<std::string>& docs) {
  size_t size = 0;
  for (const auto& d : docs) size += d.size() + 1;
  std::string out;
  out.reserve(size);
  for (const auto& d : docs) {
    out.append(d);
    out.push_back('\n');
  }
  return out;
}

int64_t Bytes(const std::vector<std::string>& docs) {
  int64_t n = 0;
  for (const auto& d : docs) n += static_cast<int64_t>(d.size()) + 1;
  return n;
}

void Preparer::Mixtures() {
  std::map<std::string, const Language*> by_code;
  for (const Language& l : languages_) by_code[l.spec->code()] = &l;
  for (const v1::CorpusMixture& m : spec_.mixtures()) {
    std::vector<const Language*> members;
    std::vector<double> weights;
    for (const std::string& code : m.languages()) {
      const Language* l = by_code.at(code);
      members.push_back(l);
      const double n = static_cast<double>(Bytes(l->train));
      weights.push_back(n > 0 ? std::pow(n, 1.0 / m.temperature()) : 0.0);
    }
    double total_weight = 0;
    for (double w : weights) total_weight += w;
    std::vector<size_t> next(members.size(), 0);
    std::vector<int64_t> taken(members.size(), 0), taken_docs(members.size(), 0);
    SplitMix rng(CorpusHash(m.seed(), "mixture", m.name()));
    std::string text;
    int64_t bytes = 0;
    for (;;) {
      double live = 0;
      for (size_t i = 0; i < members.size(); ++i) {
        if (next[i] < members[i]->train.size()) live += weights[i];
      }
      if (live <= 0) break;
      double u = rng.Uniform() * live;
      size_t pick = members.size();
      for (size_t i = 0; i < members.size(); ++i) {
        if (next[i] >= members[i]->train.size() || weights[i] <= 0) continue;
        pick = i;
        if (u < weights[i]) break;
        u -= weights[i];
      }
      const std::string& doc = members[pick]->train[next[pick]];
      const int64_t size = static_cast<int64_t>(doc.size()) + 1;
      if (m.budget_bytes() > 0 && bytes + size > m.budget_bytes()) break;
      ++next[pick];
      text.append(doc);
      text.push_back('\n');
      bytes += size;
      taken[pick] += size;
      ++taken_docs[pick];
    }
    Json per = Json::array();
    for (size_t i = 0; i < members.size(); ++i) {
      per.push_back({{"language", members[i]->spec->code()},
                     {"probability", total_weight > 0 ? weights[i] / total_weight : 0.0},
                     {"train_bytes", Bytes(members[i]->train)},
                     {"bytes", taken[i]},
                     {"documents", taken_docs[i]}});
    }
    const std::string path = absl::StrCat("mix/", m.name(), ".txt");
    mixtures_.push_back({{"name", m.name()},
                         {"file", path},
                         {"temperature", m.temperature()},
                         {"budget_bytes", m.budget_bytes()},
                         {"seed", m.seed()},
                         {"bytes", bytes},
                         {"languages", per}});
    AddFile(path, std::move(text));
  }
}

absl::Status Preparer::Instructions() {
  std::set<std::string> names;
  for (int i = 0; i < spec_.instructions_size(); ++i) {
    const v1::CorpusInstructions& task = spec_.instructions(i);
    const std::string field = absl::StrCat("instructions[", i, "]");
    if (!names.insert(task.name()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".name: '", task.name(), "' is used twice"));
    }
    const Language* l = nullptr;
    for (const Language& c : languages_) {
      if (c.spec->code() == task.language()) l = &c;
    }
    if (l == nullptr || l->base) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".language: '", task.language(),
                                                     "' is not a non-base language of this spec"));
    }
    absl::flat_hash_set<std::string> reserved, seen;
    for (const CorpusPair& p : l->reserved) reserved.insert(p.en);
    std::vector<std::string> train, heldout;
    for (const CorpusPair& p : l->pairs) {
      if (reserved.count(p.en) > 0 || excluded_.count(p.tgt) > 0 || !seen.insert(p.en).second)
        continue;
      std::string doc = task.template_();
      doc = absl::StrReplaceAll(doc, {{"{src}", p.en}, {"{tgt}", p.tgt}, {"{name}", l->name}});
      if (CorpusHashFraction(spec_.split_seed(), kSaltHeldout, p.en) < spec_.heldout_fraction()) {
        heldout.push_back(std::move(doc));
      } else {
        train.push_back(std::move(doc));
      }
    }
    if (train.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".language: '", task.language(),
                       "' has no gettext pairs outside the evaluation pairs"));
    }
    auto order = [&](std::vector<std::string>* docs) {
      std::sort(docs->begin(), docs->end(), [&](const std::string& a, const std::string& b) {
        const uint64_t ha = CorpusHash(spec_.split_seed(), kSaltOrder, a),
                       hb = CorpusHash(spec_.split_seed(), kSaltOrder, b);
        return ha != hb ? ha < hb : a < b;
      });
    };
    order(&train);
    order(&heldout);
    if (task.budget_bytes() > 0) {
      int64_t bytes = 0;
      size_t keep = 0;
      while (keep < train.size() &&
             bytes + static_cast<int64_t>(train[keep].size()) + 1 <= task.budget_bytes()) {
        bytes += static_cast<int64_t>(train[keep].size()) + 1;
        ++keep;
      }
      train.resize(keep);
    }
    const std::string train_path = absl::StrCat("instruct/", task.name(), ".train.txt");
    const std::string heldout_path = absl::StrCat("instruct/", task.name(), ".heldout.txt");
    instructions_.push_back({{"name", task.name()},
                             {"language", task.language()},
                             {"template", task.template_()},
                             {"train", train_path},
                             {"heldout", heldout_path},
                             {"train_documents", train.size()},
                             {"heldout_documents", heldout.size()},
                             {"train_bytes", Bytes(train)},
                             {"heldout_bytes", Bytes(heldout)}});
    AddFile(train_path, Lines(train));
    AddFile(heldout_path, Lines(heldout));
  }
  return absl::OkStatus();
}

void Preparer::Suites() {
  std::vector<SuiteLanguage> languages;
  for (const Language& l : languages_) {
    languages.push_back({l.spec, l.name, l.base, &l.reserved, &l.heldout});
  }
  CorpusSuites suites = BuildCorpusSuites(spec_.suites(), languages);
  for (auto& [path, text] : suites.files) AddFile(path, std::move(text));
  suites_ = std::move(suites.index);
}

int64_t LineCount(const std::string& text) {
  return static_cast<int64_t>(std::count(text.begin(), text.end(), '\n'));
}

absl::StatusOr<PrepareSummary> Preparer::Write() {
  PrepareSummary summary;
  summary.out = spec_.out();
  Json languages = Json::array();
  for (const Language& l : languages_) {
    const std::string& code = l.spec->code();
    Json files = Json::object();
    Json entry = {{"code", code},
                  {"family", l.spec->family()},
                  {"role", l.spec->role()},
                  {"name", l.name},
                  {"budget_bytes", l.spec->budget_bytes()}};
    Json sizes = {{"code", code}, {"role", l.spec->role()}};
    if (!l.held_out) {
      const std::string path = absl::StrCat("train/", code, ".txt");
      AddFile(path, Lines(l.train));
      files["train"] = path;
      sizes["train_bytes"] = Bytes(l.train);
      sizes["train_lines"] = l.train.size();
    }
    {
      const std::string path = absl::StrCat("heldout/", code, ".txt");
      AddFile(path, Lines(l.heldout));
      files["heldout"] = path;
      sizes["heldout_bytes"] = Bytes(l.heldout);
      sizes["heldout_lines"] = l.heldout.size();
    }
    if (!l.base && !l.reserved.empty()) {
      const std::string path = absl::StrCat("pairs/", base_->spec->code(), "-", code, ".jsonl");
      std::string text;
      for (const CorpusPair& p : l.reserved) {
        // src/tgt for translation; the same pair keyed by language code for analyze's alignment.
        Json row = {
            {"id", absl::StrCat(code, "-", absl::Hex(CorpusHash(0, "id", p.en), absl::kZeroPad16))},
            {"src", p.en},
            {"tgt", p.tgt},
            {base_->spec->code(), p.en},
            {code, p.tgt}};
        absl::StrAppend(&text, Dump(row), "\n");
      }
      AddFile(path, std::move(text));
      files["pairs"] = path;
    }
    sizes["pairs"] = l.reserved.size();
    for (const auto& s : suites_) {
      if (s["language"] == code) files[s["suite"].get<std::string>()] = s["file"];
    }
    entry["files"] = files;
    entry["counts"] = l.stats.ToJson();
    entry["counts"]["train_documents"] = l.train.size();
    entry["counts"]["heldout_documents"] = l.heldout.size();
    entry["counts"]["gettext_pairs"] = l.pairs.size();
    entry["counts"]["reserved_pairs"] = l.reserved.size();
    entry["sources"] = l.sources;
    languages.push_back(std::move(entry));
    summary.languages.push_back(std::move(sizes));
  }

  Json files = Json::array();
  std::string listing;
  int64_t bytes = 0;
  for (const auto& [path, contents] : files_) {
    const std::string sha = io::Sha256Hex(contents);
    files.push_back({{"path", path},
                     {"bytes", contents.size()},
                     {"lines", LineCount(contents)},
                     {"sha256", sha}});
    absl::StrAppend(&listing, sha, "  ", path, "\n");
    bytes += static_cast<int64_t>(contents.size());
  }
  // The parameters that made it: the spec without where it was written.
  v1::PrepareSpec parameters = spec_;
  parameters.clear_out();
  parameters.clear_overwrite();
  Json manifest = {
      {"format", kCorpusFormat},
      {"content_hash", io::Sha256Hex(listing)},
      {"content_hash_of", "sha256 of the sorted \"<sha256>  <path>\\n\" lines of files"},
      {"base", base_->spec->code()},
      {"languages", languages},
      {"files", files},
      {"mixtures", mixtures_},
      {"instructions", instructions_},
      {"suites",
       {{"translation_choice", kTranslationChoiceVersion},
        {"continuation", kContinuationVersion},
        {"general", kGeneralVersion},
        {"pairs", kPairsVersion}}},
      {"normalisation", spec_.keep_documents()
                            ? "normalise@1 (gettext); text and jsonl documents as they are"
                            : "normalise@1"},
      {"parameters", Json::parse(SpecToJson(parameters))}};
  const std::string manifest_text = Dump(manifest, 2) + "\n";
  summary.content_hash = manifest["content_hash"];
  summary.manifest_sha256 = io::Sha256Hex(manifest_text);
  summary.bytes = bytes + static_cast<int64_t>(manifest_text.size());

  ASSIGN_OR_RETURN(std::string staging, io::CreateStagingDir(spec_.out(), spec_.overwrite()));
  auto write_all = [&]() -> absl::Status {
    std::set<std::string> dirs;
    for (const auto& [path, contents] : files_) {
      const size_t slash = path.rfind('/');
      if (slash != std::string::npos) {
        const std::string dir = absl::StrCat(staging, "/", path.substr(0, slash));
        if (dirs.insert(dir).second && ::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
          return ErrnoStatus("mkdir " + dir, errno);
        }
      }
      RETURN_IF_ERROR(io::WriteFileSynced(absl::StrCat(staging, "/", path), contents));
    }
    for (const std::string& dir : dirs) RETURN_IF_ERROR(io::SyncDir(dir));
    RETURN_IF_ERROR(io::WriteFileSynced(staging + "/manifest.json", manifest_text));
    return io::PublishDir(staging, spec_.out(), spec_.overwrite());
  };
  if (absl::Status s = write_all(); !s.ok()) {
    io::RemoveTree(staging).IgnoreError();
    return s;
  }
  return summary;
}

absl::StatusOr<PrepareSummary> Preparer::Run() {
  const auto start = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(ReadSources());
  Progress(0.6, "reserving evaluation pairs");
  Reserve();
  Progress(0.7, "splitting");
  Split();
  Progress(0.8, "mixtures and suites");
  Mixtures();
  RETURN_IF_ERROR(Instructions());
  Suites();
  Progress(0.9, "writing");
  ASSIGN_OR_RETURN(PrepareSummary summary, Write());
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return summary;
}

}  // namespace

uint64_t CorpusHash(uint64_t seed, std::string_view salt, std::string_view text) {
  uint64_t h = 0xcbf29ce484222325ull ^ (seed * 0x9E3779B97F4A7C15ull);
  auto mix = [&](std::string_view bytes) {
    for (unsigned char c : bytes) {
      h ^= c;
      h *= 0x100000001b3ull;
    }
  };
  mix(salt);
  mix(std::string_view("\xff", 1));
  mix(text);
  h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9ull;
  h = (h ^ (h >> 27)) * 0x94D049BB133111EBull;
  return h ^ (h >> 31);
}

double CorpusHashFraction(uint64_t seed, std::string_view salt, std::string_view text) {
  return static_cast<double>(CorpusHash(seed, salt, text) >> 11) * 0x1.0p-53;
}

absl::StatusOr<PrepareSummary> PrepareCorpus(
    const v1::PrepareSpec& spec, const std::function<void(double, const std::string&)>& progress) {
  v1::PrepareSpec filled = spec;
  filled.mutable_suites();
  FillSpecDefaults(&filled);
  return Preparer(filled, progress).Run();
}

}  // namespace stemma::engine::data
