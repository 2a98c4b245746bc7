// A thin wrapper of libsentencepiece's processor with std types only, reached through a
// shim library loaded with RTLD_DEEPBIND (sentencepiece_model.cc says why). Debian's
// sentencepiece_processor.h (0.1.97) defines `namespace absl { using std::string_view; }`,
// which clashes with Debian's Abseil (whose absl::string_view is its own class), so
// sentencepiece_model.cc includes no Abseil header and this header includes neither.
// Internal to engine/tokenizer/. Thread-safety: const methods may run concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace stemma::engine::tokenizer::internal {

class SentencePieceModel {
 public:
  // nullptr with *error set when `path` cannot be loaded.
  static std::unique_ptr<SentencePieceModel> Open(const std::string& path, std::string* error);
  ~SentencePieceModel();

  std::vector<int32_t> Encode(std::string_view text) const;
  // Ids outside [0, size()) must already be removed.
  std::string Decode(const std::vector<int32_t>& ids) const;
  int32_t size() const;
  int32_t PieceToId(std::string_view piece) const;  // -1 when absent (not unk)
  bool IsControl(int32_t id) const;
  int32_t bos_id() const;  // -1 when the model has none
  int32_t eos_id() const;
  int32_t pad_id() const;

 private:
  explicit SentencePieceModel(void* handle);
  void* handle_;  // a processor inside libstemma_sentencepiece.so (sentencepiece_model.cc)
};

}  // namespace stemma::engine::tokenizer::internal
