// libstemma_sentencepiece.so: libsentencepiece behind a C interface, loaded by
// sentencepiece_model.cc with dlopen(RTLD_LOCAL | RTLD_DEEPBIND). Debian's libsentencepiece
// carries its own protobuf-lite 3.14 under the same symbol names as libprotobuf 3.21, which
// the engine links for its typed specs; linked normally, one copy takes over the other's
// calls (a crash at start, or sentencepiece's version check failing). Loaded with
// RTLD_DEEPBIND, this library and libsentencepiece resolve their symbols in themselves first,
// so each protobuf serves its own callers. No Abseil here (sentencepiece_model.h says why).
#include <sentencepiece_processor.h>

#include <cstring>
#include <string>
#include <vector>

extern "C" {

// A processor, or null with the error copied into `error` (at most `error_size` bytes).
void* stemma_spm_open(const char* path, char* error, int error_size) {
  auto* p = new sentencepiece::SentencePieceProcessor();
  const auto status = p->Load(path);
  if (!status.ok()) {
    std::strncpy(error, status.ToString().c_str(), static_cast<size_t>(error_size) - 1);
    error[error_size - 1] = '\0';
    delete p;
    return nullptr;
  }
  return p;
}

void stemma_spm_close(void* h) { delete static_cast<sentencepiece::SentencePieceProcessor*>(h); }

// Ids of `text` through `sink(ids, n, ctx)`; false on failure.
bool stemma_spm_encode(const void* h, const char* text, size_t n,
                       void (*sink)(const int*, size_t, void*), void* ctx) {
  std::vector<int> ids;
  if (!static_cast<const sentencepiece::SentencePieceProcessor*>(h)
           ->Encode(std::string_view(text, n), &ids)
           .ok()) {
    return false;
  }
  sink(ids.data(), ids.size(), ctx);
  return true;
}

bool stemma_spm_decode(const void* h, const int* ids, size_t n,
                       void (*sink)(const char*, size_t, void*), void* ctx) {
  std::string text;
  if (!static_cast<const sentencepiece::SentencePieceProcessor*>(h)
           ->Decode(std::vector<int>(ids, ids + n), &text)
           .ok()) {
    return false;
  }
  sink(text.data(), text.size(), ctx);
  return true;
}

int stemma_spm_size(const void* h) {
  return static_cast<const sentencepiece::SentencePieceProcessor*>(h)->GetPieceSize();
}

// -1 when `piece` is not in the vocabulary (not the unknown id).
int stemma_spm_piece_to_id(const void* h, const char* piece, size_t n) {
  const auto* p = static_cast<const sentencepiece::SentencePieceProcessor*>(h);
  const std::string_view s(piece, n);
  const int id = p->PieceToId(s);
  if (p->IsUnknown(id) && p->IdToPiece(id) != s) return -1;
  return id;
}

bool stemma_spm_is_control(const void* h, int id) {
  return static_cast<const sentencepiece::SentencePieceProcessor*>(h)->IsControl(id);
}

// 0 bos, 1 eos, 2 pad.
int stemma_spm_special(const void* h, int which) {
  const auto* p = static_cast<const sentencepiece::SentencePieceProcessor*>(h);
  return which == 0 ? p->bos_id() : which == 1 ? p->eos_id() : p->pad_id();
}

}  // extern "C"
