// The safetensors header parser (engine/io/safetensors.cc): any file must open with its
// tensors inside the file, or fail with a status.
#include <fcntl.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "engine/io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path =
      std::string(::access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp") + "/stemma-fuzz-" +
      std::to_string(::getpid()) + ".safetensors";
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) return 0;
  size_t done = 0;
  while (done < size) {
    ssize_t n = ::write(fd, data + done, size - done);
    if (n <= 0) break;
    done += n;
  }
  ::close(fd);
  auto file = stemma::engine::io::SafetensorsFile::Open(path);
  if (file.ok()) {
    for (const auto& t : (*file)->tensors()) {
      // Every range the parser accepted must be readable: ASan checks these reads.
      const uint8_t* p = (*file)->Data(t);
      volatile uint8_t sink = 0;
      if (t.nbytes() > 0) sink = p[0] ^ p[t.nbytes() - 1];
      (void)sink;
    }
  }
  return 0;
}
