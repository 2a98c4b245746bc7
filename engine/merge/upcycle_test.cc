// The upcycled MoE computes what the dense model computes: with every expert a copy of the
// dense FFN and the top-k weights renormalised, the logits of the engine's forward are equal
// (fp32 rounding), for every dense family the engine upcycles.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "engine/model/causal_lm.h"
#include "engine/model/checkpoint.h"

namespace stemma::engine::merge {
namespace {

namespace fs = std::filesystem;

// The binary under test: the build's stemma-engine, or $STEMMA_ENGINE_BIN when set.
const char* EngineBin() {
  const char* env = std::getenv("STEMMA_ENGINE_BIN");
  return env != nullptr && *env != '\0' ? env : STEMMA_ENGINE_BIN;
}

class UpcycleTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    dir_ = (fs::temp_directory_path() / absl::StrCat("upcycle_test_", ::getpid(), "_", GetParam()))
               .string();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  int Engine(const std::string& args) {
    const std::string cmd =
        absl::StrCat(EngineBin(), " ", args, " >", dir_, "/out 2>", dir_, "/err");
    int status = std::system(cmd.c_str());
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

  int Upcycle(const std::string& out, bool norm_topk) {
    const std::string spec = absl::StrCat(dir_, "/", out, ".json");
    std::ofstream(spec) << nlohmann::json{{"model", dir_ + "/dense"},
                                          {"out", dir_ + "/" + out},
                                          {"experts", 4},
                                          {"top_k", 2},
                                          {"norm_topk_prob", norm_topk},
                                          // A large router spread, so tokens really pick
                                          // different experts with unequal weights.
                                          {"router_init",
                                           {{"method", "normal"}, {"std", 0.3}, {"seed", 5}}}}
                               .dump();
    return Engine("upcycle --spec " + spec);
  }

  torch::Tensor Logits(const std::string& name, model::ForwardOutput* out = nullptr) {
    auto lm = model::LoadModel(dir_ + "/" + name);
    EXPECT_TRUE(lm.ok()) << lm.status();
    torch::NoGradGuard no_grad;
    auto ids = torch::tensor({3, 17, 42, 5, 99, 7, 64, 12}, torch::kLong).view({1, 8}) %
               (*lm)->config().vocab_size;
    model::ForwardOutput o = (*lm)->forward(ids);
    if (out != nullptr) *out = o;
    return o.logits;
  }

  std::string dir_;
};

TEST_P(UpcycleTest, LogitsEqualTheDenseModel) {
  ASSERT_EQ(Engine(absl::StrCat("init --arch ", GetParam(), " --preset tiny --seed 3 --out ", dir_,
                                "/dense")),
            0);
  ASSERT_EQ(Upcycle("moe", true), 0);
  ASSERT_EQ(Upcycle("moe-unnormalised", false), 0);

  torch::Tensor dense = Logits("dense");
  model::ForwardOutput moe_out;
  torch::Tensor moe = Logits("moe", &moe_out);
  ASSERT_FALSE(moe_out.router_logits.empty()) << "the upcycled checkpoint loads as an MoE";
  // The router spreads tokens over several experts, so equality is not a one-expert accident.
  auto picked = std::get<1>(torch::topk(moe_out.router_logits[0], 2, -1));
  EXPECT_GE(std::get<0>(at::_unique(picked)).numel(), 3);

  const double scale = dense.abs().max().item<double>();
  EXPECT_GT(scale, 0);
  EXPECT_LE((moe - dense).abs().max().item<double>(), 1e-5 * scale + 1e-6);
  // Control: without renormalisation the output is scaled by the top-k mass, and differs.
  torch::Tensor unnormalised = Logits("moe-unnormalised");
  EXPECT_GT((unnormalised - dense).abs().max().item<double>(), 1e-3 * scale);
}

INSTANTIATE_TEST_SUITE_P(Families, UpcycleTest, ::testing::Values("llama", "qwen2", "gemma3"));

}  // namespace
}  // namespace stemma::engine::merge
