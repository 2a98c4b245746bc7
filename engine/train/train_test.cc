// End-to-end tests of `stemma-engine train`: the real binary on tiny models (made by
// `stemma-engine init`) and synthetic token datasets, checked the way a user would check a
// run: the events it printed, the tensors it wrote, what it refused. The strategies have
// their own file (train_strategies_test.cc); the fixture is train_test_fixture.h.
#include <cmath>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "engine/train/train_test_fixture.h"

namespace stemma::engine::train {
namespace {

// Every architecture trains: the loss falls, events follow the contract, the output loads.
TEST_F(TrainTest, EveryArchitectureTrainsAndReportsEvents) {
  for (const char* arch : {"llama", "qwen2", "gemma3", "olmoe"}) {
    SCOPED_TRACE(arch);
    json spec = BaseSpec(arch, absl::StrCat("full_", arch));
    spec["steps"] = 12;
    Result r = Run(spec, absl::StrCat("full_", arch));
    ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
    ASSERT_FALSE(r.events.empty());
    EXPECT_EQ(r.events.front()["event"], "start");
    EXPECT_EQ(r.events.front()["command"], "train");
    EXPECT_EQ(r.events.back()["event"], "done");
    auto steps = r.Of("step");
    ASSERT_EQ(steps.size(), 12u);
    for (size_t i = 0; i < steps.size(); ++i) {
      EXPECT_EQ(steps[i]["step"], static_cast<int64_t>(i + 1));
      EXPECT_EQ(steps[i]["total_steps"], 12);
      EXPECT_EQ(steps[i]["tokens"], static_cast<int64_t>((i + 1) * 4 * 16));
      EXPECT_GT(steps[i]["tokens_per_s"].get<double>(), 0.0);
      EXPECT_GE(steps[i]["grad_norm"].get<double>(), 0.0);
    }
    EXPECT_LT(steps.back()["loss"].get<double>(), steps.front()["loss"].get<double>() - 1.0);
    auto outputs = r.Of("output");
    ASSERT_EQ(outputs.size(), 1u);
    EXPECT_EQ(outputs[0]["name"], "model");
    EXPECT_EQ(outputs[0]["path"], (root_ / absl::StrCat("full_", arch)).string());
    // What the checkpoint registry records (engine/events.h).
    EXPECT_EQ(outputs[0]["type"], "checkpoint") << outputs[0].dump();
    EXPECT_EQ(outputs[0]["operation"], "cpt");
    EXPECT_EQ(outputs[0]["manifest_sha256"].get<std::string>().size(), 64u);
    EXPECT_EQ(outputs[0]["parents"], json::array({(root_ / arch).string()}));
    EXPECT_EQ(r.events.back()["trainable_fraction"], 1.0);
    // The output is a complete, verified checkpoint with every tensor of the base model.
    Tensors base = ReadTensors(root_ / arch),
            trained = ReadTensors(root_ / absl::StrCat("full_", arch));
    ASSERT_EQ(base.size(), trained.size());
    int changed = 0;
    for (const auto& [name, t] : base) {
      ASSERT_TRUE(trained.count(name)) << name;
      changed += !Same(t, trained[name]);
    }
    EXPECT_GE(changed, static_cast<int>(base.size()) - 1);  // all but possibly an unused row set
    EXPECT_TRUE(io::VerifyCheckpoint((root_ / absl::StrCat("full_", arch)).string()).ok());
  }
}

TEST_F(TrainTest, ResumedRunRepeatsTheLossCurveExactly) {
  json spec = BaseSpec("llama", "straight");
  spec["steps"] = 7;
  spec["grad_accum"] = 2;
  spec["optimizer"]["weight_decay"] = 0.05;
  spec["schedule"] = {{"warmup_steps", 2}, {"min_lr_ratio", 0.1}};
  spec["checkpoint"] = {{"every", 2}, {"keep", 2}};
  Result straight = Run(spec, "straight");
  ASSERT_EQ(straight.exit_code, 0) << straight.stderr_text;

  spec["out"] = (root_ / "resumed").string();
  Result first = Run(spec, "resumed_1", "--stop-after-step 5");
  EXPECT_NE(first.exit_code, 0);
  EXPECT_TRUE(absl::StrContains(first.stderr_text, "stopped after step 5")) << first.stderr_text;
  EXPECT_FALSE(fs::exists(root_ / "resumed"));
  ASSERT_EQ(first.Of("checkpoint").size(), 2u);  // steps 2 and 4
  Result second = Run(spec, "resumed_2");
  ASSERT_EQ(second.exit_code, 0) << second.stderr_text;
  EXPECT_EQ(second.events.front()["resumed_from_step"], 4);
  // Steps 5..7 again after the restart; every loss, lr and grad norm equals the straight run's.
  auto expected = straight.Of("step");
  std::map<int64_t, json> by_step;
  for (const json& e : first.Of("step")) by_step[e["step"]] = e;
  for (const json& e : second.Of("step")) by_step[e["step"]] = e;  // the restart's win
  ASSERT_EQ(by_step.size(), 7u);
  for (const json& e : expected) {
    const json& got = by_step[e["step"]];
    EXPECT_EQ(got["loss"].get<double>(), e["loss"].get<double>()) << "step " << e["step"];
    EXPECT_EQ(got["grad_norm"].get<double>(), e["grad_norm"].get<double>()) << "step " << e["step"];
    EXPECT_EQ(got["lr"].get<double>(), e["lr"].get<double>());
    EXPECT_EQ(got["tokens"], e["tokens"]);
  }
  Tensors a = ReadTensors(root_ / "straight"), b = ReadTensors(root_ / "resumed");
  for (const auto& [name, t] : a) EXPECT_TRUE(Same(t, b[name])) << name;
  // keep: 2 -> only the newest two checkpoints stay.
  int kept = 0;
  for (const auto& entry : fs::directory_iterator(root_ / "straight.checkpoints")) {
    EXPECT_TRUE(absl::StartsWith(entry.path().filename().string(), "step-")) << entry.path();
    ++kept;
  }
  EXPECT_EQ(kept, 2);
  // Running the finished spec again reports the published model instead of failing.
  Result again = Run(spec, "resumed_3");
  ASSERT_EQ(again.exit_code, 0) << again.stderr_text;
  ASSERT_EQ(again.Of("output").size(), 1u);
}

// The loss curve equals transformers' model + torch.optim.AdamW + clip_grad_norm_ on the same
// rows (a one-document dataset without shuffling, whose windows the script rebuilds).
TEST_F(TrainTest, LossCurveMatchesTransformersWithTorchAdamW) {
  std::vector<int32_t> doc;
  for (int k = 0; k < 37; ++k) doc.push_back(3 + (k * 5) % 16);
  data::DatasetWriterOptions o;
  o.out_dir = (root_ / "one_doc").string();
  o.language = "xx";
  o.tokenizer = {.name = "synthetic",
                 .kind = "none",
                 .file = "",
                 .sha256 = "",
                 .vocab_size = 256,
                 .bos_id = 1,
                 .eos_id = 2};
  auto writer = data::DatasetWriter::Create(o);
  ASSERT_TRUE(writer.ok()) << writer.status();
  ASSERT_TRUE((*writer)->AddDocument(doc).ok());
  ASSERT_TRUE((*writer)->Finish({}).ok());
  for (const char* arch : {"llama", "qwen2", "gemma3"}) {
    SCOPED_TRACE(arch);
    json spec = BaseSpec(arch, absl::StrCat("reference_", arch));
    spec["data"] = {{"datasets", {{{"path", (root_ / "one_doc").string()}, {"weight", 1}}}},
                    {"seq_len", 16},
                    {"shuffle", false}};
    spec["steps"] = 5;
    spec["optimizer"] = {
        {"lr", 3e-3}, {"betas", {0.9, 0.95}}, {"eps", 1e-8}, {"weight_decay", 0.0}};
    spec["schedule"] = {{"type", "constant"}, {"warmup_steps", 0}};
    Result r = Run(spec, absl::StrCat("reference_", arch));
    ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
    json job = {{"model", (root_ / arch).string()},
                {"doc", doc},
                {"eos", 2},
                {"seq_len", 16},
                {"batch_size", 4},
                {"steps", 5},
                {"lr", 3e-3},
                {"betas", {0.9, 0.95}},
                {"eps", 1e-8},
                {"clip", 1.0}};
    std::ofstream(root_ / "reference_job.json") << job.dump();
    const fs::path out = root_ / "reference_out.json";
    ASSERT_EQ(Shell(absl::StrCat(STEMMA_PYTHON, " ", STEMMA_SOURCE_DIR,
                                 "/tests/engine/train_reference.py ",
                                 (root_ / "reference_job.json").string(), " > ", out.string())),
              0);
    json expected = json::parse(ReadText(out));
    auto losses = r.Losses();
    ASSERT_EQ(losses.size(), 5u);
    for (int step = 1; step <= 5; ++step) {
      EXPECT_NEAR(losses[step], expected[step - 1].get<double>(), 1e-4) << "step " << step;
    }
    EXPECT_LT(losses[5], losses[1]);
  }
}

// A run killed with SIGKILL at an arbitrary moment (here: once its second checkpoint is out,
// possibly while it writes the next) resumes and ends with the weights of an uninterrupted run.
TEST_F(TrainTest, KilledRunResumesToTheSameWeights) {
  json spec = BaseSpec("qwen2", "unkilled");
  spec["steps"] = 40;
  spec["checkpoint"] = {{"every", 3}, {"keep", 1}};
  Result straight = Run(spec, "unkilled");
  ASSERT_EQ(straight.exit_code, 0) << straight.stderr_text;

  spec["out"] = (root_ / "killed").string();
  const fs::path spec_path = root_ / "killed.json", out = root_ / "killed.stdout";
  std::ofstream(spec_path) << spec.dump(2);
  ASSERT_EQ(Shell(absl::StrCat(STEMMA_ENGINE_BIN, " train --spec ", spec_path.string(), " > ",
                               out.string(), " 2>/dev/null & echo $! > ",
                               (root_ / "killed.pid").string())),
            0);
  const std::string pid = ReadText(root_ / "killed.pid");
  bool killed = false;
  for (int i = 0; i < 6000 && !killed; ++i) {
    std::string text = ReadText(out);
    size_t checkpoints = 0;
    for (size_t at = text.find("\"checkpoint\""); at != std::string::npos;
         at = text.find("\"checkpoint\"", at + 1)) {
      ++checkpoints;
    }
    if (checkpoints >= 2) {
      killed = Shell("kill -9 " + pid) == 0;
    } else {
      usleep(5000);
    }
  }
  ASSERT_TRUE(killed) << "the run ended before it could be killed";
  usleep(200000);
  EXPECT_FALSE(fs::exists(root_ / "killed"));
  Result resumed = Run(spec, "killed_again");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.stderr_text;
  EXPECT_GE(resumed.events.front()["resumed_from_step"].get<int64_t>(), 6);
  Tensors a = ReadTensors(root_ / "unkilled"), b = ReadTensors(root_ / "killed");
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, t] : a) EXPECT_TRUE(Same(t, b[name])) << name;
  EXPECT_EQ(resumed.Losses().rbegin()->second, straight.Losses().rbegin()->second);
}

struct BadCase {
  std::string name;
  std::function<void(json&, const fs::path&)> edit;  // edits the spec; may damage files
  std::string expected_error;                        // substring of stderr
  int exit_code = 4;  // bad input (not retried), unless the failure is not the spec's
};

// Mixed precision: the forward runs under bf16 autocast, master weights and the saved model
// stay fp32, and the loss curve follows the fp32 one closely.
TEST_F(TrainTest, Bf16AutocastTrainsWithFp32MasterWeights) {
  json fp32 = BaseSpec("llama", "prec_fp32");
  fp32["steps"] = 12;
  json bf16 = BaseSpec("llama", "prec_bf16");
  bf16["steps"] = 12;
  bf16["precision"] = "bfloat16";
  Result a = Run(fp32, "prec_fp32"), b = Run(bf16, "prec_bf16");
  ASSERT_EQ(a.exit_code, 0) << a.stderr_text;
  ASSERT_EQ(b.exit_code, 0) << b.stderr_text;
  EXPECT_EQ(b.events.front()["precision"], "bfloat16");
  auto sa = a.Of("step"), sb = b.Of("step");
  ASSERT_EQ(sa.size(), sb.size());
  EXPECT_LT(sb.back()["loss"].get<double>(), sb.front()["loss"].get<double>() - 1.0);
  bool any_different = false;
  for (size_t i = 0; i < sa.size(); ++i) {
    const double la = sa[i]["loss"].get<double>(), lb = sb[i]["loss"].get<double>();
    EXPECT_NEAR(lb, la, 0.05 * la) << "step " << i + 1;
    any_different |= la != lb;
  }
  EXPECT_TRUE(any_different) << "bf16 autocast had no effect";
  Tensors trained = ReadTensors(root_ / "prec_bf16");
  for (const auto& [name, t] : trained) EXPECT_EQ(t.scalar_type(), torch::kFloat32) << name;
}

// On a GPU machine (CTest label gpu is not needed: it skips without CUDA): the same run on
// cuda with bf16 autocast follows the CPU fp32 curve.
TEST_F(TrainTest, TrainsOnCudaWithBf16Autocast) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA GPU";
  json cpu = BaseSpec("llama", "cuda_ref");
  cpu["steps"] = 8;
  json gpu = BaseSpec("llama", "cuda_bf16");
  gpu["steps"] = 8;
  gpu["device"] = "cuda";
  gpu["precision"] = "bfloat16";
  gpu["checkpoint"] = {{"every", 4}};
  Result a = Run(cpu, "cuda_ref"), b = Run(gpu, "cuda_bf16");
  ASSERT_EQ(a.exit_code, 0) << a.stderr_text;
  ASSERT_EQ(b.exit_code, 0) << b.stderr_text;
  auto sa = a.Of("step"), sb = b.Of("step");
  ASSERT_EQ(sa.size(), sb.size());
  for (size_t i = 0; i < sa.size(); ++i) {
    EXPECT_NEAR(sb[i]["loss"].get<double>(), sa[i]["loss"].get<double>(),
                0.05 * sa[i]["loss"].get<double>());
  }
  EXPECT_TRUE(io::VerifyCheckpoint((root_ / "cuda_bf16").string()).ok());
}

TEST_F(TrainTest, HeldOutLossPerDatasetWithoutDisturbingTraining) {
  if (!fs::exists(root_ / "yo")) WriteDataset("yo", 12);
  json plain = BaseSpec("llama", "heldout_plain");
  plain["steps"] = 6;
  plain["data"]["datasets"] = {{{"path", (root_ / "sw").string()}, {"weight", 1}},
                               {{"path", (root_ / "yo").string()}, {"weight", 1}}};
  plain["data"]["heldout_fraction"] = 0.2;
  json spec = plain;
  spec["out"] = (root_ / "heldout").string();
  spec["eval"] = {{"every", 2}, {"batches", 2}, {"batch_size", 3}};
  Result r = Run(spec, "heldout");
  ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
  // name -> step -> value
  std::map<std::string, std::map<int64_t, double>> metrics;
  for (const json& e : r.Of("metric")) {
    if (absl::StartsWith(e["name"].get<std::string>(), "trainable_"))
      continue;  // the start's size points
    metrics[e["name"].get<std::string>()][e["step"].get<int64_t>()] = e["value"].get<double>();
  }
  ASSERT_EQ(metrics.size(), 3u);
  for (const char* name : {"heldout_loss/sw", "heldout_loss/yo", "heldout_loss"}) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(metrics.count(name));
    const auto& curve = metrics[name];
    ASSERT_EQ(curve.size(), 4u);  // before step 1, then steps 2, 4, 6
    for (int64_t step : {0, 2, 4, 6}) ASSERT_TRUE(curve.count(step)) << step;
    for (const auto& [step, value] : curve) EXPECT_TRUE(std::isfinite(value)) << step;
    EXPECT_LT(curve.at(6), curve.at(0) - 0.5);  // the learnable pattern is learnt
  }
  // Both datasets weigh the same number of tokens: the overall loss is their mean.
  EXPECT_NEAR(metrics["heldout_loss"][6],
              (metrics["heldout_loss/sw"][6] + metrics["heldout_loss/yo"][6]) / 2, 1e-9);
  // Evaluating draws nothing from the training data or the RNG: the same curve without it.
  Result without = Run(plain, "heldout_plain");
  ASSERT_EQ(without.exit_code, 0) << without.stderr_text;
  EXPECT_EQ(r.Losses(), without.Losses());
  for (const json& e : without.Of("metric")) {  // only the start's size points, no held-out loss
    EXPECT_TRUE(absl::StartsWith(e["name"].get<std::string>(), "trainable_")) << e.dump();
  }
}

// A copy of the test's llama model at dir/name, to damage.
void CopyModel(const fs::path& dir, const std::string& name) {
  fs::remove_all(dir / name);
  fs::copy(dir / "llama", dir / name, fs::copy_options::recursive);
}

// Specs (edits of BaseSpec, with files in the test directory `dir`) that must fail.
std::vector<BadCase> BadCases() {
  std::vector<BadCase> cases = {
      {"unknown_field", [](json& s, const fs::path&) { s["optimizer"]["learning_rate"] = 1; },
       "learning_rate"},
      {"bad_range",
       [](json& s, const fs::path&) {
         s["strategy"] = {{"freeze", {{"layers", {"1:9"}}}}};
       },
       "strategy.freeze.layers[0]: layers '1:9' reach past the model's 2 layers"},
      {"empty_range",
       [](json& s, const fs::path&) {
         s["strategy"] = {{"freeze", {{"layers", {"3:3"}}}}};
       },
       "'3:3' is not a layer range (it is empty"},
      {"missing_model", [](json& s, const fs::path&) { s["model"] = "/nonexistent/model"; },
       "/nonexistent/model"},
      {"damaged_safetensors",
       [](json& s, const fs::path& dir) {
         CopyModel(dir, "damaged");
         fs::remove(dir / "damaged" / "stemma.json");  // so the file itself must be caught
         fs::resize_file(dir / "damaged" / "model.safetensors",
                         fs::file_size(dir / "damaged" / "model.safetensors") - 100);
         s["model"] = (dir / "damaged").string();
       },
       "model.safetensors", 1},
      {"shape_mismatch",
       [](json& s, const fs::path& dir) {
         CopyModel(dir, "reshaped");
         json config = json::parse(ReadText(dir / "reshaped" / "config.json"));
         config["intermediate_size"] = 96;
         std::ofstream(dir / "reshaped" / "config.json") << config.dump();
         fs::remove(dir / "reshaped" / "stemma.json");
         s["model"] = (dir / "reshaped").string();
       },
       "mlp.gate_proj.weight"},
      {"unknown_architecture",
       [](json& s, const fs::path& dir) {
         CopyModel(dir, "gpt2");
         json config = json::parse(ReadText(dir / "gpt2" / "config.json"));
         config["model_type"] = "gpt2";
         std::ofstream(dir / "gpt2" / "config.json") << config.dump();
         fs::remove(dir / "gpt2" / "stemma.json");
         s["model"] = (dir / "gpt2").string();
       },
       "gpt2"},
      {"nan_loss",
       [](json& s, const fs::path&) {
         s["optimizer"]["lr"] = 1e30;
         s["schedule"] = {{"warmup_steps", 0}};
         s["clip_grad_norm"] = 0;
         s["steps"] = 6;
         s["checkpoint"] = {{"every", 1}};
       },
       "training diverged at step", 1},
      {"neuron_mask_on_moe",
       [](json& s, const fs::path& dir) {
         s["model"] = (dir / "olmoe").string();
         s["strategy"] = {{"neuron_mask", {{"file", (dir / "mask.json").string()}}}};
       },
       "neuron_mask: needs a dense model"},
      {"missing_mask_language",
       [](json& s, const fs::path& dir) {
         json mask = {{"format", "stemma.neuron_mask/1"},
                      {"num_layers", 2},
                      {"intermediate_size", 128},
                      {"languages", {{"sw", {{1}, {2}}}}}};
         std::ofstream(dir / "mask_sw.json") << mask.dump();
         s["strategy"] = {
             {"neuron_mask", {{"file", (dir / "mask_sw.json").string()}, {"languages", {"zu"}}}}};
       },
       "languages.zu"},
      {"both_steps_and_tokens", [](json& s, const fs::path&) { s["max_tokens"] = 1000; },
       "exactly one of 'steps' and 'max_tokens'"},
      {"bad_device", [](json& s, const fs::path&) { s["device"] = "tpu"; },
       "device: 'tpu' is not cpu, cuda or cuda:N"},
      {"bad_precision", [](json& s, const fs::path&) { s["precision"] = "fp8"; },
       "precision: 'fp8' is not one of float32, bfloat16"},
      {"eval_without_heldout",
       [](json& s, const fs::path&) {
         s["eval"] = {{"every", 2}};
       },
       "eval.every: needs held-out documents"},
      {"eval_heldout_too_small",  // no document of 300 falls in a 1e-9 split
       [](json& s, const fs::path&) {
         s["data"]["heldout_fraction"] = 1e-9;
         s["eval"] = {{"every", 2}};
       },
       "eval: data.datasets[0]"},
  };
  if (!torch::cuda::is_available()) {
    cases.push_back({"cuda_without_gpu", [](json& s, const fs::path&) { s["device"] = "cuda"; },
                     "LibTorch sees no CUDA GPU"});
  }
  return cases;
}

TEST_F(TrainTest, BadInputsFailWithNamedCauseAndPublishNothing) {
  for (const BadCase& c : BadCases()) {
    SCOPED_TRACE(c.name);
    json spec = BaseSpec("llama", "bad_" + c.name);
    c.edit(spec, root_);
    Result r = Run(spec, "bad_" + c.name);
    if (c.name == "damaged_safetensors" || c.name == "shape_mismatch") {
      EXPECT_NE(r.exit_code, 0);  // the reader's code for a damaged file
    } else {
      EXPECT_EQ(r.exit_code, c.exit_code) << r.stderr_text;
    }
    EXPECT_TRUE(absl::StrContains(r.stderr_text, "stemma-engine: error: ")) << r.stderr_text;
    EXPECT_TRUE(absl::StrContains(r.stderr_text, c.expected_error)) << r.stderr_text;
    EXPECT_FALSE(fs::exists(root_ / ("bad_" + c.name))) << "output published despite the error";
    EXPECT_TRUE(r.Of("done").empty());
    // No half-written checkpoint or output: no staging directories left beside them.
    for (const auto& entry : fs::directory_iterator(root_)) {
      EXPECT_FALSE(absl::StrContains(entry.path().filename().string(), ".tmp-")) << entry.path();
    }
    const fs::path ckpts = root_ / ("bad_" + c.name + ".checkpoints");
    if (fs::exists(ckpts)) {
      for (const auto& entry : fs::directory_iterator(ckpts)) {
        const std::string name = entry.path().filename().string();
        EXPECT_FALSE(absl::StrContains(name, ".tmp-")) << entry.path();
        EXPECT_TRUE(io::VerifyCheckpoint(entry.path().string()).ok()) << entry.path();
      }
    }
  }
}

// Issue 16 point 11: the first step is always reported, so a run shows its starting loss.
TEST_F(TrainTest, LogEveryReportsTheFirstStepToo) {
  json spec = BaseSpec("llama", "log_every");
  spec["steps"] = 7;
  spec["log_every"] = 3;
  Result r = Run(spec, "log_every");
  ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
  std::vector<int64_t> steps;
  for (const json& e : r.Of("step")) steps.push_back(e["step"]);
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 3, 6, 7}));
}

// Issue 16 points 5 and 6 and 8: "middle" resolved and printed; relative paths against the
// storage root; threads from the job's CPUs and refused above them; the attempt in the manifest.
TEST_F(TrainTest, MiddleStorageRootThreadsAndAttempt) {
  json spec = BaseSpec("gemma3", "middle");  // 3 layers: middle is layer 1
  spec["model"] = "gemma3";                  // relative: under STEMMA_STORAGE_ROOT
  spec["out"] = "rel/middle";
  spec["data"]["datasets"] = {{{"path", "sw"}}};
  spec.erase("threads");
  spec["strategy"] = {{"freeze", {{"layers", {"middle"}}}}};
  const fs::path elsewhere = root_ / "specs";
  fs::create_directories(elsewhere);
  const std::string env = absl::StrCat("STEMMA_STORAGE_ROOT=", root_.string(),
                                       " STEMMA_CPUS=1 STEMMA_JOB_ID=j7 STEMMA_ATTEMPT_ID=j7.2 ");
  Result r = Run(spec, "specs/middle", "", env);
  ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
  const json& start = r.events.front();
  EXPECT_EQ(start["model"], (root_ / "gemma3").string());
  EXPECT_EQ(start["out"], (root_ / "rel" / "middle").string());
  EXPECT_EQ(start["threads"], 1);
  EXPECT_EQ(start["num_layers"], 3);
  ASSERT_EQ(start["layer_ranges"].size(), 1u) << start.dump();
  EXPECT_EQ(start["layer_ranges"][0]["field"], "strategy.freeze.layers[0]");
  EXPECT_EQ(start["layer_ranges"][0]["range"], "middle");
  EXPECT_EQ(start["layer_ranges"][0]["layers"], "1");
  Tensors base = ReadTensors(root_ / "gemma3"), trained = ReadTensors(root_ / "rel" / "middle");
  for (const auto& [name, t] : base) {
    if (absl::StartsWith(name, "model.layers.1.")) EXPECT_TRUE(Same(t, trained[name])) << name;
    if (absl::StartsWith(name, "model.layers.0.mlp.")) EXPECT_FALSE(Same(t, trained[name])) << name;
  }
  json manifest = json::parse(ReadText(root_ / "rel" / "middle" / "stemma.json"));
  EXPECT_EQ(manifest["producer"]["job"], "j7") << manifest["producer"].dump();
  EXPECT_EQ(manifest["producer"]["attempt"], "j7.2");
  // More threads than the job's CPUs: refused before any work, as bad input.
  spec["threads"] = 2;
  spec["out"] = "rel/too_many";
  Result refused = Run(spec, "specs/too_many", "", env);
  EXPECT_EQ(refused.exit_code, 4);
  EXPECT_TRUE(
      absl::StrContains(refused.stderr_text, "threads: 2 threads is more than the job's 1 CPUs"))
      << refused.stderr_text;
}

// Issue 16 point 4: held out by position (the end of the corpus) and by a separate dataset.
TEST_F(TrainTest, HeldOutByPositionAndBySeparateDataset) {
  if (!fs::exists(root_ / "yo")) WriteDataset("yo", 12);
  json spec = BaseSpec("llama", "heldout_last");
  spec["data"]["heldout_fraction"] = 0.05;
  spec["data"]["heldout_split"] = "last";
  spec["eval"] = {{"every", 4}, {"batches", 1}};
  Result last = Run(spec, "heldout_last");
  ASSERT_EQ(last.exit_code, 0) << last.stderr_text;
  // heldout_loss/sw and heldout_loss at steps 0 and 4, after trainable_fraction and
  // trainable_params at the start.
  ASSERT_EQ(last.Of("metric").size(), 6u);
  EXPECT_EQ(last.Of("metric")[0]["name"], "trainable_fraction");
  EXPECT_EQ(last.Of("metric")[0]["value"], 1.0);
  EXPECT_EQ(last.Of("metric")[1]["name"], "trainable_params");
  json separate = BaseSpec("llama", "heldout_separate");
  separate["data"]["datasets"] = {
      {{"path", (root_ / "sw").string()}, {"heldout_path", (root_ / "yo").string()}}};
  separate["eval"] = {{"every", 4}, {"batches", 1}};
  Result r = Run(separate, "heldout_separate");
  ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
  std::set<std::string> names;
  for (const json& e : r.Of("metric")) names.insert(e["name"]);
  EXPECT_EQ(names, (std::set<std::string>{"heldout_loss/sw", "heldout_loss", "trainable_fraction",
                                          "trainable_params"}));
  // All of sw trains: the same curve as without any held-out set.
  json plain = BaseSpec("llama", "heldout_none");
  Result none = Run(plain, "heldout_none");
  ASSERT_EQ(none.exit_code, 0) << none.stderr_text;
  EXPECT_EQ(r.Losses(), none.Losses());
}

TEST_F(TrainTest, HelpListsEveryFieldWithItsDefault) {
  const fs::path out = root_ / "help.stdout";
  ASSERT_EQ(Shell(absl::StrCat(STEMMA_ENGINE_BIN, " train --help > ", out.string())), 0);
  const std::string help = ReadText(out);
  for (const char* needle : {"usage: stemma-engine train", "optimizer.betas", "default [0.9, 0.95]",
                             "schedule.min_lr_ratio", "data.heldout_split", "--stop-after-step"}) {
    EXPECT_TRUE(absl::StrContains(help, needle)) << needle << "\n" << help;
  }
}

// Early stopping (common/engine_contract.h kStopFile): with <STEMMA_WORKDIR>/stop present,
// training ends after the current step and publishes that step's model as `out`, noting
// stopped_at_step, with its output event, and exits 0.
TEST_F(TrainTest, StopFileEndsTrainingAfterTheStepAndPublishesTheModel) {
  const fs::path workdir = root_ / "stop_attempt";
  fs::create_directories(workdir);
  std::ofstream(workdir / "stop") << "stopped early at rung 1 (step 1)";
  json spec = BaseSpec("llama", "stopped");
  spec["steps"] = 6;
  Result r = Run(spec, "stopped", "", absl::StrCat("STEMMA_WORKDIR=", workdir.string(), " "));
  ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
  EXPECT_EQ(r.Of("step").size(), 1u) << r.stdout_text;
  ASSERT_EQ(r.Of("output").size(), 1u) << r.stdout_text;
  EXPECT_EQ(r.Of("output")[0]["path"], (root_ / "stopped").string());
  ASSERT_EQ(r.Of("done").size(), 1u);
  EXPECT_EQ(r.Of("done")[0]["stopped_at_step"], 1);
  json manifest = json::parse(ReadText(root_ / "stopped" / "stemma.json"));
  EXPECT_EQ(manifest["producer"]["params"]["stopped_at_step"], 1) << manifest["producer"].dump();
  // The published model is a whole checkpoint: it trains on.
  json next = BaseSpec("stopped", "after_stop");
  Result more = Run(next, "after_stop");
  EXPECT_EQ(more.exit_code, 0) << more.stderr_text;
  // Without the file the same spec runs every step.
  spec["out"] = (root_ / "not_stopped").string();
  Result full = Run(spec, "not_stopped");
  ASSERT_EQ(full.exit_code, 0) << full.stderr_text;
  EXPECT_EQ(full.Of("step").size(), 6u);
  EXPECT_EQ(full.Of("done")[0]["stopped_at_step"], 0);
}

// Preemption (common/engine_contract.h kPreemptFile): with <STEMMA_WORKDIR>/preempt present,
// the trainer saves the checkpoint of the step it just did at once (not only every
// checkpoint.every steps), exits 5 (kExitPreempted) without publishing, and the next run
// resumes there: no step is done twice, the loss curve and the final weights equal a run
// that was never interrupted.
TEST_F(TrainTest, PreemptFileCheckpointsAtOnceAndTheNextRunResumesThere) {
  json spec = BaseSpec("llama", "unpreempted");
  spec["steps"] = 6;
  spec["log_every"] = 1;
  spec["checkpoint"] = {{"every", 4}};
  Result straight = Run(spec, "unpreempted");
  ASSERT_EQ(straight.exit_code, 0) << straight.stderr_text;

  const fs::path workdir = root_ / "preempt_attempt";
  fs::create_directories(workdir);
  std::ofstream(workdir / "preempt") << "j-9";
  spec["out"] = (root_ / "preempted").string();
  const std::string env = absl::StrCat("STEMMA_WORKDIR=", workdir.string(), " ");
  Result first = Run(spec, "preempted_1", "", env);
  EXPECT_EQ(first.exit_code, 5) << first.stderr_text;
  ASSERT_EQ(first.Of("step").size(), 1u) << first.stdout_text;
  ASSERT_EQ(first.Of("checkpoint").size(), 1u) << first.stdout_text;
  EXPECT_EQ(first.Of("checkpoint")[0]["step"], 1);
  EXPECT_TRUE(first.Of("output").empty());
  EXPECT_TRUE(first.Of("done").empty());
  EXPECT_FALSE(fs::exists(root_ / "preempted"));
  EXPECT_TRUE(
      io::VerifyCheckpoint((root_ / "preempted.checkpoints" / "step-00000001").string()).ok())
      << "the preemption's checkpoint is a whole one";

  fs::remove(workdir / "preempt");
  Result second = Run(spec, "preempted_2", "", env);
  ASSERT_EQ(second.exit_code, 0) << second.stderr_text;
  EXPECT_EQ(second.events.front()["resumed_from_step"], 1);
  std::map<int64_t, double> losses = first.Losses();
  for (const auto& [step, loss] : second.Losses()) {
    EXPECT_EQ(losses.count(step), 0u) << "step " << step << " done twice";
    losses[step] = loss;
  }
  EXPECT_EQ(losses, straight.Losses());
  Tensors a = ReadTensors(root_ / "unpreempted"), b = ReadTensors(root_ / "preempted");
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, t] : a) EXPECT_TRUE(Same(t, b[name])) << name;
}

}  // namespace
}  // namespace stemma::engine::train
