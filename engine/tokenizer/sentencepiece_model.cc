// No Abseil here: see sentencepiece_model.h. libsentencepiece is reached only through
// libstemma_sentencepiece.so (sentencepiece_shim.cc), loaded with RTLD_DEEPBIND so that its
// bundled protobuf 3.14 and the engine's libprotobuf 3.21 each serve their own callers.
#include "engine/tokenizer/sentencepiece_model.h"

#include <dlfcn.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <mutex>

namespace stemma::engine::tokenizer::internal {
namespace {

struct Shim {
  void* (*open)(const char*, char*, int) = nullptr;
  void (*close)(void*) = nullptr;
  bool (*encode)(const void*, const char*, size_t, void (*)(const int*, size_t, void*),
                 void*) = nullptr;
  bool (*decode)(const void*, const int*, size_t, void (*)(const char*, size_t, void*),
                 void*) = nullptr;
  int (*size)(const void*) = nullptr;
  int (*piece_to_id)(const void*, const char*, size_t) = nullptr;
  bool (*is_control)(const void*, int) = nullptr;
  int (*special)(const void*, int) = nullptr;
  std::string error;
};

// The shim beside the running binary (build/bin, or the image's bin), or
// $STEMMA_SENTENCEPIECE_SHIM.
const Shim& LoadShim() {
  static Shim* shim = [] {
    auto* s = new Shim;
    std::string path;
    if (const char* env = std::getenv("STEMMA_SENTENCEPIECE_SHIM")) {
      path = env;
    } else {
      char exe[PATH_MAX];
      const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
      std::string dir = n > 0 ? std::string(exe, static_cast<size_t>(n)) : std::string(".");
      dir = dir.substr(0, dir.find_last_of('/'));
      path = dir + "/libstemma_sentencepiece.so";
    }
    void* h = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
    if (h == nullptr) {
      const char* e = ::dlerror();
      s->error = std::string("cannot load ") + path + " (SentencePiece support): " + (e ? e : "");
      return s;
    }
    auto sym = [&](const char* name) { return ::dlsym(h, name); };
    s->open = reinterpret_cast<decltype(s->open)>(sym("stemma_spm_open"));
    s->close = reinterpret_cast<decltype(s->close)>(sym("stemma_spm_close"));
    s->encode = reinterpret_cast<decltype(s->encode)>(sym("stemma_spm_encode"));
    s->decode = reinterpret_cast<decltype(s->decode)>(sym("stemma_spm_decode"));
    s->size = reinterpret_cast<decltype(s->size)>(sym("stemma_spm_size"));
    s->piece_to_id = reinterpret_cast<decltype(s->piece_to_id)>(sym("stemma_spm_piece_to_id"));
    s->is_control = reinterpret_cast<decltype(s->is_control)>(sym("stemma_spm_is_control"));
    s->special = reinterpret_cast<decltype(s->special)>(sym("stemma_spm_special"));
    if (!s->open || !s->close || !s->encode || !s->decode || !s->size || !s->piece_to_id ||
        !s->is_control || !s->special) {
      s->error = path + ": not a Stemma SentencePiece shim (missing functions)";
      s->open = nullptr;
    }
    return s;
  }();
  return *shim;
}

}  // namespace

SentencePieceModel::SentencePieceModel(void* handle) : handle_(handle) {}

SentencePieceModel::~SentencePieceModel() {
  if (handle_ != nullptr) LoadShim().close(handle_);
}

std::unique_ptr<SentencePieceModel> SentencePieceModel::Open(const std::string& path,
                                                             std::string* error) {
  const Shim& shim = LoadShim();
  if (shim.open == nullptr) {
    *error = shim.error;
    return nullptr;
  }
  char message[1024] = {0};
  void* h = shim.open(path.c_str(), message, sizeof message);
  if (h == nullptr) {
    *error = message;
    return nullptr;
  }
  return std::unique_ptr<SentencePieceModel>(new SentencePieceModel(h));
}

std::vector<int32_t> SentencePieceModel::Encode(std::string_view text) const {
  std::vector<int32_t> ids;
  auto sink = [](const int* v, size_t n, void* ctx) {
    static_cast<std::vector<int32_t>*>(ctx)->assign(v, v + n);
  };
  if (!LoadShim().encode(handle_, text.data(), text.size(), sink, &ids)) return {};
  return ids;
}

std::string SentencePieceModel::Decode(const std::vector<int32_t>& ids) const {
  std::string text;
  const std::vector<int> in(ids.begin(), ids.end());
  auto sink = [](const char* s, size_t n, void* ctx) {
    static_cast<std::string*>(ctx)->assign(s, n);
  };
  if (!LoadShim().decode(handle_, in.data(), in.size(), sink, &text)) return {};
  return text;
}

int32_t SentencePieceModel::size() const { return LoadShim().size(handle_); }

int32_t SentencePieceModel::PieceToId(std::string_view piece) const {
  return LoadShim().piece_to_id(handle_, piece.data(), piece.size());
}

bool SentencePieceModel::IsControl(int32_t id) const { return LoadShim().is_control(handle_, id); }
int32_t SentencePieceModel::bos_id() const { return LoadShim().special(handle_, 0); }
int32_t SentencePieceModel::eos_id() const { return LoadShim().special(handle_, 1); }
int32_t SentencePieceModel::pad_id() const { return LoadShim().special(handle_, 2); }

}  // namespace stemma::engine::tokenizer::internal
