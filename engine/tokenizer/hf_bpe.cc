// Byte-level BPE from a Hugging Face tokenizer.json, following `tokenizers` (0.2x):
// added tokens are split off first (those with normalized=false on the raw text, the others
// after normalization), the rest is normalized (NFC or nothing), pre-tokenized (Split
// patterns, then ByteLevel: GPT-2's byte-to-unicode alphabet), and each piece merged by
// rank (models/bpe/word.rs: lowest rank first, leftmost among equals).
#include <fstream>
#include <queue>
#include <sstream>
#include <unordered_map>
#include <unordered_set>
#include <variant>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status.h"
#include "engine/tokenizer/loaders.h"
#include "engine/tokenizer/pretokenizer.h"
#include "engine/tokenizer/unicode.h"
#include "nlohmann/json.hpp"

namespace stemma::engine::tokenizer::internal {
namespace {

using json = nlohmann::json;

// GPT-2's bytes_to_unicode: printable bytes stand for themselves, the others (control,
// space, 0x7F-0xA0, 0xAD) for U+0100 upwards in byte order.
std::array<uint32_t, 256> ByteToCodePoint() {
  std::array<uint32_t, 256> map{};
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
    map[b] = printable ? b : next++;
  }
  return map;
}

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
  bool special = false;
};

// A pre-tokenizer step.
struct SplitStep {
  SplitPattern pattern;
};
struct ByteLevelStep {
  bool add_prefix_space = false;
  bool use_regex = true;
};
using PreTokenizerStep = std::variant<SplitStep, ByteLevelStep>;

// Leftmost-longest matching of a set of added tokens (what `tokenizers` builds with
// aho-corasick's LeftmostLongest), with single_word / lstrip / rstrip.
class AddedTokenMatcher {
 public:
  void Add(const AddedToken* token) {
    if (token->content.empty()) return;
    by_first_byte_[static_cast<uint8_t>(token->content[0])].push_back(token);
    empty_ = false;
  }
  bool empty() const { return empty_; }

  // Appends to `out` the pieces of `text`: (nullptr, text) for plain text and (token, span)
  // for matches. Empty plain pieces are dropped.
  void Split(std::string_view text,
             std::vector<std::pair<const AddedToken*, std::string_view>>* out) const {
    if (empty_) {
      if (!text.empty()) out->emplace_back(nullptr, text);
      return;
    }
    size_t emitted = 0;  // text before this is in `out`
    size_t pos = 0;
    while (pos < text.size()) {
      const AddedToken* best = nullptr;
      for (const AddedToken* t : by_first_byte_[static_cast<uint8_t>(text[pos])]) {
        if (text.compare(pos, t->content.size(), t->content) == 0 &&
            (best == nullptr || t->content.size() > best->content.size())) {
          best = t;
        }
      }
      if (best == nullptr) {
        ++pos;
        continue;
      }
      size_t start = pos, stop = pos + best->content.size();
      pos = stop;
      if (best->single_word && (IsWordBefore(text, start) || IsWordAfter(text, stop))) continue;
      if (best->lstrip) {
        while (start > emitted) {
          size_t prev = start - 1;
          while (prev > 0 && (static_cast<uint8_t>(text[prev]) & 0xC0) == 0x80) --prev;
          int len = 0;
          if (Classify(DecodeUtf8At(text, prev, &len)) != CharClass::kSpace) break;
          start = prev;
        }
      }
      if (best->rstrip) {
        while (stop < text.size()) {
          int len = 0;
          if (Classify(DecodeUtf8At(text, stop, &len)) != CharClass::kSpace) break;
          stop += len;
        }
        pos = stop;
      }
      if (start > emitted) out->emplace_back(nullptr, text.substr(emitted, start - emitted));
      out->emplace_back(best, text.substr(start, stop - start));
      emitted = stop;
    }
    if (emitted < text.size()) out->emplace_back(nullptr, text.substr(emitted));
  }

 private:
  // Rust's char::is_alphanumeric, approximated by \p{L} and \p{N}.
  static bool IsWordChar(uint32_t cp) {
    const CharClass c = Classify(cp);
    return c == CharClass::kLetter || c == CharClass::kNumber;
  }
  static bool IsWordBefore(std::string_view text, size_t pos) {
    if (pos == 0) return false;
    size_t prev = pos - 1;
    while (prev > 0 && (static_cast<uint8_t>(text[prev]) & 0xC0) == 0x80) --prev;
    int len = 0;
    return IsWordChar(DecodeUtf8At(text, prev, &len));
  }
  static bool IsWordAfter(std::string_view text, size_t pos) {
    if (pos >= text.size()) return false;
    int len = 0;
    return IsWordChar(DecodeUtf8At(text, pos, &len));
  }

  std::array<std::vector<const AddedToken*>, 256> by_first_byte_;
  bool empty_ = true;
};

class HfBpeTokenizer : public Tokenizer {
 public:
  std::vector<int32_t> Encode(std::string_view text) const override;
  std::string Decode(std::span<const int32_t> ids) const override;
  int32_t vocab_size() const override { return vocab_size_; }
  std::optional<int32_t> TokenToId(std::string_view token) const override;
  bool IsSpecial(int32_t id) const override { return special_ids_set_.count(id) > 0; }
  std::string_view kind() const override { return "hf_bpe"; }

  static absl::StatusOr<std::unique_ptr<Tokenizer>> Load(const std::string& path);

 private:
  struct Merge {
    int32_t rank;
    int32_t new_id;
  };
  static uint64_t PairKey(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

  absl::Status ParseModel(const json& model, const std::string& file);
  absl::Status ParseNormalizer(const json& normalizer, const std::string& file);
  absl::Status ParsePreTokenizer(const json& pre, const std::string& file,
                                 const std::string& field);
  absl::Status ParseAddedTokens(const json& added, const std::string& file);

  std::string Normalize(std::string_view text) const {
    return nfc_ ? NfcNormalize(text) : std::string(text);
  }
  // Pre-tokenizes one plain segment (already normalized) and appends the BPE ids of each piece.
  void EncodeSegment(std::string_view segment, std::vector<int32_t>* ids) const;
  void EncodeWord(std::string_view bytes, std::vector<int32_t>* ids) const;

  std::unordered_map<std::string, int32_t> vocab_;
  std::vector<std::string> id_to_token_;  // "" where unused
  std::unordered_map<uint64_t, Merge> merges_;
  std::array<int32_t, 256> byte_ids_{};  // id of each byte's one-character token, or -1
  std::array<uint32_t, 256> byte_to_cp_ = ByteToCodePoint();
  std::unordered_map<uint32_t, uint8_t> cp_to_byte_;
  std::optional<int32_t> unk_id_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  bool nfc_ = false;
  std::vector<PreTokenizerStep> steps_;
  std::vector<AddedToken> added_;
  std::unordered_map<int32_t, const AddedToken*> added_by_id_;
  std::unordered_map<std::string, int32_t> added_by_content_;
  std::unordered_set<int32_t> special_ids_set_;
  AddedTokenMatcher raw_matcher_;               // added tokens with normalized=false
  AddedTokenMatcher normalized_matcher_;        // normalized=true, contents normalized
  std::vector<AddedToken> normalized_storage_;  // normalized=true tokens, normalized content
  int32_t vocab_size_ = 0;
};

absl::Status FieldError(const std::string& file, const std::string& field,
                        const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(file, ": field '", field, "' ", what));
}
absl::Status Unsupported(const std::string& file, const std::string& field,
                         const std::string& what) {
  return absl::UnimplementedError(absl::StrCat(file, ": field '", field, "' ", what,
                                               " is not supported (byte-level BPE only)"));
}

// Reads a bool field that may be absent (default) or null.
absl::StatusOr<bool> OptBool(const json& obj, const char* key, bool def, const std::string& file,
                             const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return def;
  if (!it->is_boolean()) return FieldError(file, where + "." + key, "must be a boolean");
  return it->get<bool>();
}

absl::Status HfBpeTokenizer::ParseModel(const json& model, const std::string& file) {
  if (!model.is_object()) return FieldError(file, "model", "must be an object");
  if (auto t = model.find("type"); t != model.end() && *t != "BPE") {
    return Unsupported(file, "model.type",
                       t->is_string() ? "\"" + t->get<std::string>() + "\"" : t->dump());
  }
  auto vocab = model.find("vocab");
  if (vocab == model.end() || !vocab->is_object()) {
    return FieldError(file, "model.vocab", "must be an object of token: id");
  }
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 ||
        it.value().get<int64_t>() > INT32_MAX) {
      return FieldError(file, "model.vocab[\"" + it.key() + "\"]", "must be a non-negative id");
    }
    vocab_[it.key()] = it.value().get<int32_t>();
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    auto it = model.find(key);
    if (it != model.end() && !it->is_null() &&
        !(it->is_string() && it->get<std::string>().empty())) {
      return Unsupported(file, std::string("model.") + key, it->dump());
    }
  }
  if (auto d = model.find("dropout"); d != model.end() && !d->is_null()) {
    if (!d->is_number() || d->get<double>() != 0.0)
      return Unsupported(file, "model.dropout", d->dump());
  }
  ASSIGN_OR_RETURN(fuse_unk_, OptBool(model, "fuse_unk", false, file, "model"));
  ASSIGN_OR_RETURN(byte_fallback_, OptBool(model, "byte_fallback", false, file, "model"));
  ASSIGN_OR_RETURN(ignore_merges_, OptBool(model, "ignore_merges", false, file, "model"));
  if (auto u = model.find("unk_token"); u != model.end() && !u->is_null()) {
    if (!u->is_string()) return FieldError(file, "model.unk_token", "must be a string or null");
    auto id = vocab_.find(u->get<std::string>());
    if (id == vocab_.end()) {
      return FieldError(file, "model.unk_token",
                        "\"" + u->get<std::string>() + "\" is not in model.vocab");
    }
    unk_id_ = id->second;
  }

  auto merges = model.find("merges");
  if (merges == model.end() || !merges->is_array()) {
    return FieldError(file, "model.merges", "must be an array");
  }
  for (size_t i = 0; i < merges->size(); ++i) {
    const json& m = (*merges)[i];
    const std::string field = absl::StrCat("model.merges[", i, "]");
    std::string a, b;
    if (m.is_string()) {  // "a b" (tokenizers < 0.20)
      const std::string s = m.get<std::string>();
      const size_t space = s.find(' ');
      if (space == std::string::npos) return FieldError(file, field, "must be \"left right\"");
      a = s.substr(0, space);
      b = s.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    } else {
      return FieldError(file, field, "must be \"left right\" or [\"left\", \"right\"]");
    }
    auto ia = vocab_.find(a), ib = vocab_.find(b), ic = vocab_.find(a + b);
    if (ia == vocab_.end() || ib == vocab_.end() || ic == vocab_.end()) {
      return FieldError(file, field,
                        "has a token that is not in model.vocab: \"" +
                            (ia == vocab_.end()   ? a
                             : ib == vocab_.end() ? b
                                                  : a + b) +
                            "\"");
    }
    // A repeated pair takes its last rank, as tokenizers' collect() into a HashMap does.
    merges_[PairKey(ia->second, ib->second)] = Merge{static_cast<int32_t>(i), ic->second};
  }
  return absl::OkStatus();
}

absl::Status HfBpeTokenizer::ParseNormalizer(const json& n, const std::string& file) {
  if (n.is_null()) return absl::OkStatus();
  if (!n.is_object() || !n.contains("type") || !n["type"].is_string()) {
    return FieldError(file, "normalizer", "must be null or an object with a type");
  }
  const std::string type = n["type"].get<std::string>();
  if (type == "NFC") {
    nfc_ = true;
    if (NfcNormalize("e\xCC\x81") != "\xC3\xA9") {
      return absl::InternalError("ICU's NFC normalizer does not work (ICU data missing?)");
    }
    return absl::OkStatus();
  }
  if (type == "Sequence") {
    auto list = n.find("normalizers");
    if (list == n.end() || !list->is_array()) {
      return FieldError(file, "normalizer.normalizers", "must be an array");
    }
    for (const json& item : *list) RETURN_IF_ERROR(ParseNormalizer(item, file));
    return absl::OkStatus();
  }
  return Unsupported(file, "normalizer.type", "\"" + type + "\"");
}

absl::Status HfBpeTokenizer::ParsePreTokenizer(const json& p, const std::string& file,
                                               const std::string& field) {
  if (!p.is_object() || !p.contains("type") || !p["type"].is_string()) {
    return FieldError(file, field, "must be an object with a type");
  }
  const std::string type = p["type"].get<std::string>();
  if (type == "Sequence") {
    auto list = p.find("pretokenizers");
    if (list == p.end() || !list->is_array()) {
      return FieldError(file, field + ".pretokenizers", "must be an array");
    }
    for (size_t i = 0; i < list->size(); ++i) {
      RETURN_IF_ERROR(
          ParsePreTokenizer((*list)[i], file, absl::StrCat(field, ".pretokenizers[", i, "]")));
    }
    return absl::OkStatus();
  }
  if (type == "ByteLevel") {
    ByteLevelStep step;
    ASSIGN_OR_RETURN(step.add_prefix_space, OptBool(p, "add_prefix_space", true, file, field));
    ASSIGN_OR_RETURN(step.use_regex, OptBool(p, "use_regex", true, file, field));
    steps_.push_back(step);
    return absl::OkStatus();
  }
  if (type == "Split") {
    auto pattern = p.find("pattern");
    if (pattern == p.end() || !pattern->is_object()) {
      return FieldError(file, field + ".pattern", "must be {\"Regex\": ...} or {\"String\": ...}");
    }
    auto regex = pattern->find("Regex");
    if (regex == pattern->end() || !regex->is_string()) {
      return Unsupported(file, field + ".pattern", pattern->dump());
    }
    auto known = SplitPatternFromRegex(regex->get<std::string>());
    if (!known) {
      return Unsupported(
          file, field + ".pattern.Regex",
          "\"" + regex->get<std::string>() + "\" (known: the Llama-3, Qwen2 and GPT-2 patterns)");
    }
    auto behavior = p.find("behavior");
    if (behavior == p.end() || *behavior != "Isolated") {
      return Unsupported(file, field + ".behavior",
                         behavior == p.end() ? "(missing)" : behavior->dump());
    }
    ASSIGN_OR_RETURN(bool invert, OptBool(p, "invert", false, file, field));
    if (invert) return Unsupported(file, field + ".invert", "true");
    steps_.push_back(SplitStep{*known});
    return absl::OkStatus();
  }
  return Unsupported(file, field + ".type", "\"" + type + "\"");
}

absl::Status HfBpeTokenizer::ParseAddedTokens(const json& added, const std::string& file) {
  if (added.is_null()) return absl::OkStatus();
  if (!added.is_array()) return FieldError(file, "added_tokens", "must be an array");
  added_.reserve(added.size());
  for (size_t i = 0; i < added.size(); ++i) {
    const json& t = added[i];
    const std::string field = absl::StrCat("added_tokens[", i, "]");
    if (!t.is_object()) return FieldError(file, field, "must be an object");
    AddedToken token;
    if (!t.contains("id") || !t["id"].is_number_integer() || t["id"].get<int64_t>() < 0 ||
        t["id"].get<int64_t>() > INT32_MAX) {
      return FieldError(file, field + ".id", "must be a non-negative id");
    }
    if (!t.contains("content") || !t["content"].is_string() ||
        t["content"].get<std::string>().empty()) {
      return FieldError(file, field + ".content", "must be a non-empty string");
    }
    token.id = t["id"].get<int32_t>();
    token.content = t["content"].get<std::string>();
    ASSIGN_OR_RETURN(token.special, OptBool(t, "special", false, file, field));
    ASSIGN_OR_RETURN(token.single_word, OptBool(t, "single_word", false, file, field));
    ASSIGN_OR_RETURN(token.lstrip, OptBool(t, "lstrip", false, file, field));
    ASSIGN_OR_RETURN(token.rstrip, OptBool(t, "rstrip", false, file, field));
    ASSIGN_OR_RETURN(token.normalized, OptBool(t, "normalized", !token.special, file, field));
    added_.push_back(std::move(token));
  }
  for (AddedToken& t : added_) {
    added_by_id_[t.id] = &t;
    added_by_content_[t.content] = t.id;
    if (t.special) special_ids_set_.insert(t.id);
    if (!t.normalized) raw_matcher_.Add(&t);
  }
  // The normalized matcher needs tokens whose content is the normalized text.
  normalized_storage_.reserve(added_.size());
  for (const AddedToken& t : added_) {
    if (!t.normalized) continue;
    AddedToken copy = t;
    copy.content = Normalize(t.content);
    normalized_storage_.push_back(copy);
  }
  for (const AddedToken& t : normalized_storage_) normalized_matcher_.Add(&t);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Tokenizer>> HfBpeTokenizer::Load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::stringstream buffer;
  buffer << in.rdbuf();
  json root;
  try {
    root = json::parse(buffer.str());
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not JSON: ", e.what()));
  }
  if (!root.is_object())
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object"));

  auto tok = std::make_unique<HfBpeTokenizer>();
  if (!root.contains("model")) return FieldError(path, "model", "is missing");
  RETURN_IF_ERROR(tok->ParseModel(root["model"], path));
  RETURN_IF_ERROR(tok->ParseNormalizer(root.value("normalizer", json()), path));

  const json pre = root.value("pre_tokenizer", json());
  if (pre.is_null()) return Unsupported(path, "pre_tokenizer", "null");
  RETURN_IF_ERROR(tok->ParsePreTokenizer(pre, path, "pre_tokenizer"));
  // ByteLevel maps the bytes of every piece to its alphabet, so it must come last and once.
  for (size_t i = 0; i < tok->steps_.size(); ++i) {
    const bool byte_level = std::holds_alternative<ByteLevelStep>(tok->steps_[i]);
    if (byte_level != (i + 1 == tok->steps_.size())) {
      return Unsupported(path, "pre_tokenizer",
                         "a pre-tokenizer that does not end with exactly one ByteLevel");
    }
  }

  const json decoder = root.value("decoder", json());
  if (!decoder.is_object() || decoder.value("type", "") != "ByteLevel") {
    return Unsupported(path, "decoder", decoder.dump());
  }
  RETURN_IF_ERROR(tok->ParseAddedTokens(root.value("added_tokens", json()), path));

  // Ids: the vocabulary, then added tokens (which may reuse vocabulary ids).
  int32_t max_id = -1;
  for (const auto& [token, id] : tok->vocab_) max_id = std::max(max_id, id);
  for (const AddedToken& t : tok->added_) max_id = std::max(max_id, t.id);
  tok->vocab_size_ = max_id + 1;
  tok->id_to_token_.assign(tok->vocab_size_, "");
  for (const auto& [token, id] : tok->vocab_) tok->id_to_token_[id] = token;

  for (uint32_t b = 0; b < 256; ++b) {
    tok->cp_to_byte_[tok->byte_to_cp_[b]] = static_cast<uint8_t>(b);
    std::string s;
    AppendUtf8(tok->byte_to_cp_[b], &s);
    auto it = tok->vocab_.find(s);
    tok->byte_ids_[b] = it == tok->vocab_.end() ? -1 : it->second;
  }
  return std::unique_ptr<Tokenizer>(std::move(tok));
}

std::optional<int32_t> HfBpeTokenizer::TokenToId(std::string_view token) const {
  const std::string key(token);
  if (auto it = added_by_content_.find(key); it != added_by_content_.end()) return it->second;
  if (auto it = vocab_.find(key); it != vocab_.end()) return it->second;
  return std::nullopt;
}

std::vector<int32_t> HfBpeTokenizer::Encode(std::string_view text) const {
  std::vector<int32_t> ids;
  std::vector<std::pair<const AddedToken*, std::string_view>> raw;
  raw_matcher_.Split(text, &raw);
  for (const auto& [token, piece] : raw) {
    if (token != nullptr) {
      ids.push_back(token->id);
      continue;
    }
    const std::string normalized = Normalize(piece);
    std::vector<std::pair<const AddedToken*, std::string_view>> parts;
    normalized_matcher_.Split(normalized, &parts);
    for (const auto& [t, part] : parts) {
      if (t != nullptr) {
        ids.push_back(t->id);
      } else {
        EncodeSegment(part, &ids);
      }
    }
  }
  return ids;
}

void HfBpeTokenizer::EncodeSegment(std::string_view segment, std::vector<int32_t>* ids) const {
  // Pieces are owned strings only where ByteLevel's add_prefix_space changes them.
  std::vector<std::string> pieces{std::string(segment)};
  for (const PreTokenizerStep& step : steps_) {
    std::vector<std::string> next;
    for (const std::string& piece : pieces) {
      if (const auto* split = std::get_if<SplitStep>(&step)) {
        for (std::string_view p : SplitText(piece, split->pattern)) next.emplace_back(p);
        continue;
      }
      const auto& byte_level = std::get<ByteLevelStep>(step);
      std::string p = piece;
      if (byte_level.add_prefix_space && (p.empty() || p[0] != ' ')) p.insert(p.begin(), ' ');
      if (byte_level.use_regex) {
        for (std::string_view q : SplitText(p, SplitPattern::kGpt2)) next.emplace_back(q);
      } else {
        next.push_back(std::move(p));
      }
    }
    pieces = std::move(next);
  }
  for (const std::string& piece : pieces) {
    if (!piece.empty()) EncodeWord(piece, ids);
  }
}

void HfBpeTokenizer::EncodeWord(std::string_view bytes, std::vector<int32_t>* ids) const {
  if (ignore_merges_) {
    std::string mapped;
    for (char c : bytes) AppendUtf8(byte_to_cp_[static_cast<uint8_t>(c)], &mapped);
    if (auto it = vocab_.find(mapped); it != vocab_.end()) {
      ids->push_back(it->second);
      return;
    }
  }
  // Symbols of the word as a doubly linked list (models/bpe/word.rs).
  struct Symbol {
    int32_t id;
    int prev;
    int next;
    bool alive;
  };
  std::vector<Symbol> symbols;
  symbols.reserve(bytes.size());
  bool pending_unk = false;
  auto push = [&](int32_t id) {
    const int n = static_cast<int>(symbols.size());
    symbols.push_back(Symbol{id, n - 1, -1, true});
    if (n > 0) symbols[n - 1].next = n;
  };
  for (char c : bytes) {
    const uint8_t b = static_cast<uint8_t>(c);
    if (byte_ids_[b] >= 0) {
      push(byte_ids_[b]);
      pending_unk = false;
      continue;
    }
    if (byte_fallback_) {
      // `tokenizers` falls back on the UTF-8 bytes of the (mapped) character.
      std::string mapped;
      AppendUtf8(byte_to_cp_[b], &mapped);
      std::vector<int32_t> fallback;
      for (char m : mapped) {
        auto it = vocab_.find(absl::StrFormat("<0x%02X>", static_cast<uint8_t>(m)));
        if (it == vocab_.end()) break;
        fallback.push_back(it->second);
      }
      if (fallback.size() == mapped.size()) {
        for (int32_t id : fallback) push(id);
        pending_unk = false;
        continue;
      }
    }
    if (unk_id_) {
      if (!(fuse_unk_ && pending_unk)) push(*unk_id_);
      pending_unk = true;
    }
    // Without an unk token `tokenizers` drops the character.
  }

  struct Candidate {
    int32_t rank;
    int pos;
    int32_t new_id;
  };
  auto worse = [](const Candidate& x, const Candidate& y) {
    return x.rank != y.rank ? x.rank > y.rank : x.pos > y.pos;
  };
  std::priority_queue<Candidate, std::vector<Candidate>, decltype(worse)> queue(worse);
  auto consider = [&](int pos) {
    const int next = symbols[pos].next;
    if (next < 0) return;
    auto it = merges_.find(PairKey(symbols[pos].id, symbols[next].id));
    if (it != merges_.end()) queue.push(Candidate{it->second.rank, pos, it->second.new_id});
  };
  for (int i = 0; i + 1 < static_cast<int>(symbols.size()); ++i) consider(i);
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.pos];
    if (!left.alive || left.next < 0) continue;
    Symbol& right = symbols[left.next];
    auto it = merges_.find(PairKey(left.id, right.id));
    if (it == merges_.end() || it->second.new_id != top.new_id) continue;  // stale
    left.id = top.new_id;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.pos;
    if (left.prev >= 0) consider(left.prev);
    consider(top.pos);
  }
  for (const Symbol& s : symbols) {
    if (s.alive) ids->push_back(s.id);
  }
}

std::string HfBpeTokenizer::Decode(std::span<const int32_t> ids) const {
  // ByteLevel's decoder: every token's characters back to bytes (a token with a character
  // outside the alphabet, e.g. an added token with a space, keeps its UTF-8 bytes), then
  // one lossy UTF-8 conversion of the whole.
  std::string bytes;
  for (int32_t id : ids) {
    const std::string* token = nullptr;
    if (auto it = added_by_id_.find(id); it != added_by_id_.end()) {
      token = &it->second->content;
    } else if (id >= 0 && id < vocab_size_ && !id_to_token_[id].empty()) {
      token = &id_to_token_[id];
    }
    if (token == nullptr) continue;
    std::string mapped;
    bool in_alphabet = true;
    for (size_t pos = 0; pos < token->size() && in_alphabet;) {
      int len = 0;
      const uint32_t cp = DecodeUtf8At(*token, pos, &len);
      auto b = cp_to_byte_.find(cp);
      if (b == cp_to_byte_.end()) {
        in_alphabet = false;
      } else {
        mapped.push_back(static_cast<char>(b->second));
      }
      pos += len;
    }
    bytes += in_alphabet ? mapped : *token;
  }
  return ToValidUtf8(bytes);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadHfBpe(const std::string& path) {
  return HfBpeTokenizer::Load(path);
}

}  // namespace stemma::engine::tokenizer::internal
