// The coordinator's token file parser: malformed lines are errors naming the line.
#include <cstddef>
#include <cstdint>

#include "common/auth.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::string_view text(reinterpret_cast<const char*>(data), size);
  auto store = stemma::TokenStore::FromText(text, "tokens");
  if (store.ok()) (void)(*store)->Lookup(text.substr(0, 64));
  (void)stemma::IsLoopbackAddress(text);
  return 0;
}
