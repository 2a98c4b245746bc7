// `stemma-engine train` with the memory options (activation_checkpointing, loss_chunk_tokens;
// engine/model/checkpointing.h, loss.h) against the same run without them: the same loss
// curve and final weights to float tolerance, and the peak RSS of each run printed.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>

#include "engine/train/train_test_fixture.h"

namespace stemma::engine::train {
namespace {

// Runs `command` through /bin/sh (exec'd, so the measured process is the command itself);
// returns its exit code and sets `peak_kib` to its peak RSS (ru_maxrss).
int RunMeasured(const std::string& command, long* peak_kib) {
  const pid_t pid = fork();
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", ("exec " + command).c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  struct rusage usage {};
  if (wait4(pid, &status, 0, &usage) != pid) return -1;
  *peak_kib = usage.ru_maxrss;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

void ExpectSameRun(const Result& plain, const Result& memory, const fs::path& plain_out,
                   const fs::path& memory_out, const std::string& what) {
  ASSERT_EQ(plain.exit_code, 0) << plain.stderr_text;
  ASSERT_EQ(memory.exit_code, 0) << memory.stderr_text;
  const auto want = plain.Losses(), got = memory.Losses();
  ASSERT_EQ(got.size(), want.size()) << what;
  for (const auto& [step, loss] : want) {
    EXPECT_NEAR(got.at(step), loss, 1e-4 * loss) << what << " step " << step;
  }
  const auto a = plain.Of("step").back(), b = memory.Of("step").back();
  for (const char* key : {"load_balancing", "router_z"}) {
    if (a.contains(key)) {
      EXPECT_NEAR(b.at(key).get<double>(), a.at(key).get<double>(), 1e-4) << what << " " << key;
    }
  }
  const Tensors w_plain = ReadTensors(plain_out), w_memory = ReadTensors(memory_out);
  ASSERT_EQ(w_plain.size(), w_memory.size()) << what;
  for (const auto& [name, w] : w_plain) {
    EXPECT_LT((w_memory.at(name) - w).abs().max().item<double>(), 1e-4) << what << " " << name;
  }
}

// A dense, a Gemma (sliding windows, tied head) and an MoE model (aux losses on): checkpointing
// every layer or every 2nd with 8-token loss chunks trains like the plain path.
TEST_F(TrainTest, MemoryOptionsTrainLikeThePlainPath) {
  struct Case {
    std::string arch;
    int64_t every;
  };
  for (const Case& c : {Case{"llama", 1}, Case{"gemma3", 2}, Case{"olmoe", 1}}) {
    json plain = BaseSpec(c.arch, c.arch + "-plain");
    plain["loss_chunk_tokens"] = 0;
    json memory = BaseSpec(c.arch, c.arch + "-memory");
    memory["activation_checkpointing"] = c.every;
    memory["loss_chunk_tokens"] = 8;  // 64 tokens per micro-batch: 8 chunks
    if (c.arch == "olmoe") {
      plain["strategy"] = {{"aux_loss", {{"load_balancing", 0.01}, {"router_z", 0.001}}}};
      memory["strategy"] = plain["strategy"];
    }
    ExpectSameRun(Run(plain, c.arch + "-plain"), Run(memory, c.arch + "-memory"),
                  root_ / (c.arch + "-plain"), root_ / (c.arch + "-memory"), c.arch);
  }
}

// Peak RSS of a run whose activations and logits dominate (8 layers, vocabulary 8,192, 4 rows
// of 512 tokens), with and without the options. Printed, not asserted: the process's RSS
// also holds LibTorch and the heap's retained blocks (checkpointing_test asserts the
// allocator's peak instead).
TEST_F(TrainTest, PeakRssWithAndWithoutTheMemoryOptions) {
  const fs::path model = root_ / "llama-wide";
  ASSERT_EQ(
      Shell(absl::StrCat(STEMMA_ENGINE_BIN, " init --arch llama --num-layers 8 ",
                         "--vocab-size 8192 --seed 3 --out ", model.string(), " > /dev/null")),
      0);
  auto spec_for = [&](const std::string& name, int64_t every, int64_t chunk) {
    json spec = BaseSpec("llama", name);
    spec["model"] = model.string();
    spec["data"]["seq_len"] = 512;
    spec["steps"] = 2;
    spec["activation_checkpointing"] = every;
    spec["loss_chunk_tokens"] = chunk;
    const fs::path path = root_ / (name + ".json");
    std::ofstream(path) << spec.dump(2);
    return absl::StrCat(STEMMA_ENGINE_BIN, " train --spec ", path.string(), " > ",
                        (root_ / (name + ".stdout")).string(), " 2> ",
                        (root_ / (name + ".stderr")).string());
  };
  long plain_kib = 0, memory_kib = 0;
  ASSERT_EQ(RunMeasured(spec_for("rss-plain", 0, 0), &plain_kib), 0)
      << ReadText(root_ / "rss-plain.stderr");
  ASSERT_EQ(RunMeasured(spec_for("rss-memory", 1, 256), &memory_kib), 0)
      << ReadText(root_ / "rss-memory.stderr");
  std::printf(
      "peak RSS, llama 8 layers H 64 V 8192, 4 x 512 tokens: plain %.1f MiB, "
      "activation_checkpointing 1 + loss_chunk_tokens 256 %.1f MiB\n",
      plain_kib / 1024.0, memory_kib / 1024.0);
}

}  // namespace
}  // namespace stemma::engine::train
