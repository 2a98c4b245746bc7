// No Abseil here: see sentencepiece_model.h.
#include "engine/tokenizer/sentencepiece_model.h"

#include <sentencepiece_processor.h>

namespace stemma::engine::tokenizer::internal {

SentencePieceModel::SentencePieceModel(
    std::unique_ptr<sentencepiece::SentencePieceProcessor> processor)
    : processor_(std::move(processor)) {}

SentencePieceModel::~SentencePieceModel() = default;

std::unique_ptr<SentencePieceModel> SentencePieceModel::Open(const std::string& path,
                                                             std::string* error) {
  auto processor = std::make_unique<sentencepiece::SentencePieceProcessor>();
  const auto status = processor->Load(path);
  if (!status.ok()) {
    *error = status.ToString();
    return nullptr;
  }
  return std::unique_ptr<SentencePieceModel>(new SentencePieceModel(std::move(processor)));
}

std::vector<int32_t> SentencePieceModel::Encode(std::string_view text) const {
  std::vector<int> ids;
  if (!processor_->Encode(text, &ids).ok()) return {};
  return std::vector<int32_t>(ids.begin(), ids.end());
}

std::string SentencePieceModel::Decode(const std::vector<int32_t>& ids) const {
  std::string text;
  const std::vector<int> in(ids.begin(), ids.end());
  if (!processor_->Decode(in, &text).ok()) return {};
  return text;
}

int32_t SentencePieceModel::size() const { return processor_->GetPieceSize(); }

int32_t SentencePieceModel::PieceToId(std::string_view piece) const {
  const int id = processor_->PieceToId(piece);
  if (processor_->IsUnknown(id) && processor_->IdToPiece(id) != piece) return -1;
  return id;
}

bool SentencePieceModel::IsControl(int32_t id) const { return processor_->IsControl(id); }
int32_t SentencePieceModel::bos_id() const { return processor_->bos_id(); }
int32_t SentencePieceModel::eos_id() const { return processor_->eos_id(); }
int32_t SentencePieceModel::pad_id() const { return processor_->pad_id(); }

}  // namespace stemma::engine::tokenizer::internal
