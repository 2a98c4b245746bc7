// tokenizer.json (Hugging Face byte-level BPE) as the engine loads it from a checkpoint
// directory: a bad file is a status, and a file that loads encodes and decodes text.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "engine/tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string dir = [] {
    std::string d = std::string(::access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp") +
                    "/stemma-fuzz-tok-" + std::to_string(::getpid());
    ::mkdir(d.c_str(), 0700);
    return d;
  }();
  const std::string path = dir + "/tokenizer.json";
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) return 0;
  size_t done = 0;
  while (done < size) {
    ssize_t n = ::write(fd, data + done, size - done);
    if (n <= 0) break;
    done += n;
  }
  ::close(fd);
  auto tok = stemma::engine::tokenizer::Tokenizer::Load(dir);
  if (tok.ok()) {
    auto ids = (*tok)->Encode("Hello, world! Привет мир. नमस्ते 123 \xF0\x9F\x98\x80");
    (void)(*tok)->Decode(ids);
  }
  return 0;
}
