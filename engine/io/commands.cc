// stemma-engine inspect / verify. No LibTorch here: headers and hashes only.
#include "engine/io/commands.h"

#include <cstdio>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/io/checkpoint.h"
#include "engine/io/fs.h"
#include "engine/io/safetensors.h"

namespace stemma::engine {
namespace {

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "stemma-engine: error: %s\n", std::string(s.message()).c_str());
  return 1;
}

std::string Shape(const io::TensorInfo& t) {
  return absl::StrCat("[", absl::StrJoin(t.shape, ", "), "]");
}

void PrintTensor(const io::TensorInfo& t, const std::string& shard) {
  std::printf("%-60s %-5s %-20s %s\n", t.name.c_str(), io::DtypeName(t.dtype), Shape(t).c_str(),
              shard.c_str());
}

int InspectFile(const std::string& path) {
  auto file = io::SafetensorsFile::Open(path);
  if (!file.ok()) return Fail(file.status());
  std::printf("file %s: %llu bytes, header %llu bytes, %zu tensors\n", path.c_str(),
              static_cast<unsigned long long>((*file)->file_bytes()),
              static_cast<unsigned long long>((*file)->header_bytes()), (*file)->tensors().size());
  for (const auto& [k, v] : (*file)->metadata())
    std::printf("metadata %s=%s\n", k.c_str(), v.c_str());
  for (const auto& t : (*file)->tensors()) PrintTensor(t, "");
  return 0;
}

}  // namespace

int RunInspect(int argc, char** argv) {
  if (argc != 2 || absl::StartsWith(argv[1], "-")) {
    std::fputs("usage: stemma-engine inspect DIR|FILE.safetensors\n", stderr);
    return 2;
  }
  const std::string path = argv[1];
  if (absl::EndsWith(path, ".safetensors")) return InspectFile(path);
  auto reader =
      io::CheckpointReader::Open(path, {.verify = io::CheckpointReaderOptions::Verify::kNever});
  if (!reader.ok()) return Fail(reader.status());
  const auto& r = **reader;
  std::printf("checkpoint %s\n", path.c_str());
  if (r.config().is_object()) {
    std::printf(
        "config model_type=%s architectures=%s\n",
        r.config().value("model_type", std::string("?")).c_str(),
        r.config().contains("architectures") ? r.config()["architectures"].dump().c_str() : "?");
  } else {
    std::printf("config: none\n");
  }
  int64_t params = 0;
  for (const auto& name : r.TensorNames()) params += r.Find(name)->numel();
  std::printf("shards %zu, tensors %zu, parameters %lld\n", r.shards().size(),
              r.TensorNames().size(), static_cast<long long>(params));
  for (const auto& shard : r.shards()) std::printf("shard %s\n", shard.c_str());
  if (!r.has_manifest()) {
    std::printf("manifest: none\n");
  } else {
    absl::Status s = io::VerifyCheckpoint(path);
    std::printf("manifest: %s\n", s.ok() ? "ok" : absl::StrCat("DAMAGED: ", s.message()).c_str());
  }
  for (const auto& name : r.TensorNames()) PrintTensor(*r.Find(name), r.ShardOf(name));
  return 0;
}

int RunVerify(int argc, char** argv) {
  if (argc != 2 || absl::StartsWith(argv[1], "-")) {
    std::fputs("usage: stemma-engine verify DIR\n", stderr);
    return 2;
  }
  absl::Status s = io::VerifyCheckpoint(argv[1]);
  if (!s.ok()) return Fail(s);
  // Also parse every safetensors header: the manifest proves the bytes, this the format.
  auto reader =
      io::CheckpointReader::Open(argv[1], {.verify = io::CheckpointReaderOptions::Verify::kNever});
  if (!reader.ok()) return Fail(reader.status());
  std::printf("%s: ok (%zu tensors in %zu shards)\n", argv[1], (*reader)->TensorNames().size(),
              (*reader)->shards().size());
  return 0;
}

}  // namespace stemma::engine
