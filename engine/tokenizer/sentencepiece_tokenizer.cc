// Tokenizer over a SentencePiece .model (the processor lives in sentencepiece_model.cc).
#include "absl/strings/str_cat.h"
#include "engine/tokenizer/loaders.h"
#include "engine/tokenizer/sentencepiece_model.h"
#include "engine/tokenizer/unicode.h"

namespace stemma::engine::tokenizer::internal {
namespace {

class SentencePieceTokenizer : public Tokenizer {
 public:
  explicit SentencePieceTokenizer(std::unique_ptr<SentencePieceModel> model)
      : model_(std::move(model)) {
    const auto known = [](int32_t id) {
      return id >= 0 ? std::optional<int32_t>(id) : std::nullopt;
    };
    special_.bos = known(model_->bos_id());
    special_.eos = known(model_->eos_id());
    special_.pad = known(model_->pad_id());
  }

  std::vector<int32_t> Encode(std::string_view text) const override {
    // The processor expects valid UTF-8.
    return model_->Encode(ToValidUtf8(text));
  }

  std::string Decode(std::span<const int32_t> ids) const override {
    std::vector<int32_t> known;
    known.reserve(ids.size());
    for (int32_t id : ids) {
      if (id >= 0 && id < model_->size()) known.push_back(id);
    }
    return model_->Decode(known);
  }

  int32_t vocab_size() const override { return model_->size(); }

  std::optional<int32_t> TokenToId(std::string_view token) const override {
    const int32_t id = model_->PieceToId(token);
    return id >= 0 ? std::optional<int32_t>(id) : std::nullopt;
  }

  bool IsSpecial(int32_t id) const override {
    return id >= 0 && id < model_->size() && model_->IsControl(id);
  }

  std::string_view kind() const override { return "sentencepiece"; }

 private:
  std::unique_ptr<SentencePieceModel> model_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadSentencePiece(const std::string& path) {
  std::string error;
  auto model = SentencePieceModel::Open(path, &error);
  if (model == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a SentencePiece model: ", error));
  }
  return std::unique_ptr<Tokenizer>(std::make_unique<SentencePieceTokenizer>(std::move(model)));
}

}  // namespace stemma::engine::tokenizer::internal
