#include "engine/tokenizer/loaders.h"
#include "engine/tokenizer/unicode.h"

namespace stemma::engine::tokenizer::internal {
namespace {

constexpr int32_t kBos = 256, kEos = 257, kPad = 258, kVocabSize = 259;

class ByteTokenizer : public Tokenizer {
 public:
  ByteTokenizer() {
    special_.bos = kBos;
    special_.eos = kEos;
    special_.pad = kPad;
  }

  std::vector<int32_t> Encode(std::string_view text) const override {
    std::vector<int32_t> ids;
    ids.reserve(text.size());
    for (char c : text) ids.push_back(static_cast<uint8_t>(c));
    return ids;
  }

  std::string Decode(std::span<const int32_t> ids) const override {
    std::string bytes;
    bytes.reserve(ids.size());
    for (int32_t id : ids) {
      if (id >= 0 && id < 256) bytes.push_back(static_cast<char>(id));
    }
    return ToValidUtf8(bytes);
  }

  int32_t vocab_size() const override { return kVocabSize; }

  std::optional<int32_t> TokenToId(std::string_view token) const override {
    if (token.size() == 1) return static_cast<uint8_t>(token[0]);
    return std::nullopt;
  }

  bool IsSpecial(int32_t id) const override { return id >= 256 && id < kVocabSize; }
  std::string_view kind() const override { return "bytes"; }
};

}  // namespace

std::unique_ptr<Tokenizer> MakeByteTokenizer() { return std::make_unique<ByteTokenizer>(); }

}  // namespace stemma::engine::tokenizer::internal
