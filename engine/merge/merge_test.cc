// stemma-engine merge|revert|interpolate|graft|upcycle, end to end: small random
// checkpoints written here (mixed dtypes, sharded), the real binary run on a spec, the
// outputs read back and compared with an independent double-precision reference (and with
// mergekit). Bad input, determinism and crash safety: merge_durability_test.cc.
#include "engine/merge/merge_test_fixture.h"

namespace stemma::engine::merge {
namespace {

TEST(TensorSelectorTest, LayersModulesAndPatternsOnDecoderNames) {
  EXPECT_EQ(LayerOf("model.layers.12.mlp.up_proj.weight"), 12);
  EXPECT_EQ(LayerOf("language_model.model.layers.3.self_attn.q_norm.weight"), 3);
  EXPECT_EQ(LayerOf("model.embed_tokens.weight"), -1);
  EXPECT_EQ(LayerOf("vision_tower.vision_model.encoder.layers.5.mlp.fc1.weight"), -1);
  TensorSelector middle{{{9, 28}}, true, {}, ""};  // half-open: layers 9..27
  EXPECT_TRUE(middle.Matches("language_model.model.layers.9.mlp.down_proj.weight"));
  EXPECT_FALSE(middle.Matches("model.layers.28.mlp.down_proj.weight"));
  EXPECT_FALSE(middle.Matches("vision_tower.vision_model.encoder.layers.10.mlp.fc1.weight"));
  TensorSelector norms{{}, false, {"norms", "embeddings"}, ""};
  EXPECT_TRUE(norms.Matches("model.layers.0.input_layernorm.weight"));
  EXPECT_TRUE(norms.Matches("model.layers.0.self_attn.q_norm.weight"));
  EXPECT_TRUE(norms.Matches("model.norm.weight"));
  EXPECT_TRUE(norms.Matches("lm_head.weight"));
  EXPECT_FALSE(norms.Matches("model.layers.0.mlp.up_proj.weight"));
  EXPECT_FALSE(norms.Matches("vision_tower.vision_model.post_layernorm.weight"));
  TensorSelector pattern{{}, false, {}, "q_proj|k_proj"};
  EXPECT_TRUE(pattern.Matches("model.layers.1.self_attn.k_proj.weight"));
  EXPECT_FALSE(pattern.Matches("model.layers.1.self_attn.v_proj.weight"));
}

TEST_F(MergeTest, SoupOfMixedDtypesAndShardsIsTheWeightedAverage) {
  Model a = RandomModel(1, Dtype::kBF16), b = RandomModel(2, Dtype::kF32),
        c = RandomModel(3, Dtype::kF16);
  WriteModel(P("a"), a, TinyConfig());
  WriteModel(P("b"), b, TinyConfig(), /*shards=*/3);
  WriteModel(P("c"), c, TinyConfig(), /*shards=*/2);
  Result r = Run("merge", {{"models",
                            {{{"path", P("a")}, {"weight", 1}},
                             {{"path", P("b")}, {"weight", 2}},
                             {{"path", P("c")}, {"weight", 1}}}},
                           {"out", P("soup")},
                           {"shard_size", 3000},
                           {"tensor_hashes", true}});
  ASSERT_EQ(r.code, 0) << r.err;
  // The output event carries what the checkpoint registry records (engine/events.h).
  const json* output = nullptr;
  for (const json& e : r.events) {
    if (e["event"] == "output") output = &e;
  }
  ASSERT_NE(output, nullptr) << r.out;
  EXPECT_EQ((*output)["path"], P("soup"));
  EXPECT_EQ((*output)["type"], "checkpoint");
  EXPECT_EQ((*output)["operation"], "soup");
  EXPECT_EQ((*output)["parents"], json::array({P("a"), P("b"), P("c")}));
  EXPECT_EQ((*output)["manifest_sha256"], io::Sha256Hex(ReadText(P("soup/stemma.json"))));
  uint64_t on_disk = 0;
  for (const auto& e : fs::directory_iterator(P("soup"))) {
    if (e.path().filename() != "stemma.json") on_disk += fs::file_size(e.path());
  }
  EXPECT_EQ((*output)["bytes"], on_disk);
  Model soup = ReadModel(P("soup"));
  ASSERT_EQ(soup.size(), a.size());
  for (const auto& [name, t] : soup) {
    EXPECT_EQ(t.dtype, Dtype::kBF16) << name << ": the first model's dtype";
    std::vector<double> ref(t.values.size());
    for (size_t i = 0; i < ref.size(); ++i) {
      ref[i] = (1.0 * a[name].values[i] + 2.0 * b[name].values[i] + 1.0 * c[name].values[i]) / 4.0;
    }
    ExpectRounded(t, ref, name);
  }
  // Sharded at 3000 bytes, with index and manifest that verify; lineage recorded.
  EXPECT_TRUE(fs::exists(P("soup/model.safetensors.index.json")));
  EXPECT_TRUE(fs::exists(P("soup/config.json")));
  EXPECT_TRUE(io::VerifyCheckpoint(P("soup")).ok());
  json manifest = json::parse(ReadText(P("soup/stemma.json")));
  EXPECT_EQ(manifest["parents"].size(), 3u);
  EXPECT_EQ(manifest["producer"]["command"], "merge");
  EXPECT_EQ(manifest["producer"]["params"]["method"], "linear");
  size_t hashed = 0;
  for (const auto& [file, entry] : manifest["files"].items()) {
    if (file.find(".safetensors") != std::string::npos && file.find(".json") == std::string::npos) {
      hashed += entry.at("tensors").size();
    }
  }
  EXPECT_EQ(hashed, soup.size()) << "tensor_hashes: one sha256 per tensor";
  // Events: start, progress, one output naming the checkpoint, done.
  ASSERT_GE(r.events.size(), 3u);
  EXPECT_EQ(r.events.front()["event"], "start");
  EXPECT_EQ(r.events.back()["event"], "done");
  int outputs = 0;
  for (const json& e : r.events) {
    if (e["event"] == "output") {
      ++outputs;
      EXPECT_EQ(e["path"], P("soup"));
    }
  }
  EXPECT_EQ(outputs, 1);
}

TEST_F(MergeTest, OutputDtypeCanBeChosen) {
  WriteModel(P("a"), RandomModel(1, Dtype::kBF16), TinyConfig());
  WriteModel(P("b"), RandomModel(2, Dtype::kBF16), TinyConfig());
  Result r =
      Run("merge", {{"models", Paths({P("a"), P("b")})}, {"out", P("soup")}, {"dtype", "float32"}});
  ASSERT_EQ(r.code, 0) << r.err;
  Model a = ReadModel(P("a")), b = ReadModel(P("b")), soup = ReadModel(P("soup"));
  // By default stemma.json hashes whole files only.
  EXPECT_FALSE(json::parse(ReadText(P("soup/stemma.json")))["files"]["model.safetensors"].contains(
      "tensors"));
  for (const auto& [name, t] : soup) {
    ASSERT_EQ(t.dtype, Dtype::kF32);
    for (size_t i = 0; i < t.values.size(); ++i) {
      ASSERT_EQ(t.values[i], 0.5f * a[name].values[i] + 0.5f * b[name].values[i])
          << name;  // exact in fp32
    }
  }
}

// Reference generalized task arithmetic (mergekit's definition, algorithms.md 5.2), in double.
std::vector<double> ReferenceGeneralized(const std::string& method, const std::vector<float>& base,
                                         const std::vector<const std::vector<float>*>& models,
                                         const std::vector<double>& weights,
                                         const std::vector<double>& densities,
                                         const std::string& name, uint64_t seed) {
  const size_t n = base.size(), k = models.size();
  std::vector<std::vector<double>> wd(k, std::vector<double>(n));
  for (size_t m = 0; m < k; ++m) {
    std::vector<double> d(n);
    for (size_t i = 0; i < n; ++i) d[i] = static_cast<double>((*models[m])[i]) - base[i];
    std::vector<char> keep(n, 1);
    if (method == "ties" && densities[m] < 1) {
      std::vector<size_t> order(n);
      for (size_t i = 0; i < n; ++i) order[i] = i;
      std::stable_sort(order.begin(), order.end(),
                       [&](size_t x, size_t y) { return std::fabs(d[x]) > std::fabs(d[y]); });
      std::fill(keep.begin(), keep.end(), 0);
      const size_t top = static_cast<size_t>(densities[m] * n);
      for (size_t j = 0; j < top; ++j) keep[order[j]] = 1;
    }
    double scale = 1.0;
    if (method == "dare_ties" && densities[m] < 1) {
      double before = 0, after = 0;
      for (size_t i = 0; i < n; ++i) {
        keep[i] = Uniform(seed, StreamId(name, m), i) < densities[m];
        before += std::fabs(d[i]);
        after += keep[i] ? std::fabs(d[i]) : 0;
      }
      scale = before / after;
    }
    for (size_t i = 0; i < n; ++i) wd[m][i] = weights[m] * (keep[i] ? d[i] * scale : 0.0);
  }
  std::vector<double> out(n);
  for (size_t i = 0; i < n; ++i) {
    double mixed = 0, divisor = 0;
    if (method == "task_arithmetic") {
      for (size_t m = 0; m < k; ++m) mixed += wd[m][i];
    } else {
      double total = 0;
      for (size_t m = 0; m < k; ++m) total += wd[m][i];
      for (size_t m = 0; m < k; ++m) {
        if ((total >= 0 && wd[m][i] > 0) || (total < 0 && wd[m][i] < 0)) {
          mixed += wd[m][i];
          divisor += weights[m];
        }
      }
      if (method == "ties") mixed /= divisor == 0 ? 1 : divisor;  // ties normalises by default
    }
    out[i] = base[i] + mixed;
  }
  return out;
}

TEST_F(MergeTest, TaskArithmeticTiesAndDareMatchTheirDefinitions) {
  Model base = RandomModel(10, Dtype::kF32);
  Model a = RandomModel(11, Dtype::kF32), b = RandomModel(12, Dtype::kBF16),
        c = RandomModel(13, Dtype::kF32);
  WriteModel(P("base"), base, TinyConfig());
  WriteModel(P("a"), a, TinyConfig(), 2);
  WriteModel(P("b"), b, TinyConfig());
  WriteModel(P("c"), c, TinyConfig());
  const std::vector<double> weights = {1.0, 0.5, 0.75}, densities = {0.5, 0.3, 0.8};
  for (const std::string method : {"task_arithmetic", "ties", "dare_ties"}) {
    json models = json::array();
    const char* names[] = {"a", "b", "c"};
    for (int m = 0; m < 3; ++m) {
      json e = {{"path", P(names[m])}, {"weight", weights[m]}};
      if (method != "task_arithmetic") e["density"] = densities[m];
      models.push_back(e);
    }
    const std::string out = P("out-" + method);
    Result r = Run("merge", {{"method", method},
                             {"base", P("base")},
                             {"models", models},
                             {"out", out},
                             {"seed", 7},
                             {"dtype", "float32"}});
    ASSERT_EQ(r.code, 0) << method << ": " << r.err;
    Model merged = ReadModel(out);
    ASSERT_EQ(merged.size(), base.size());
    for (const auto& [name, t] : merged) {
      std::vector<double> ref = ReferenceGeneralized(
          method, base[name].values, {&a[name].values, &b[name].values, &c[name].values}, weights,
          method == "task_arithmetic" ? std::vector<double>{1, 1, 1} : densities, name, 7);
      for (size_t i = 0; i < ref.size(); ++i) {
        ASSERT_NEAR(t.values[i], ref[i], 2e-5 * (1 + std::fabs(ref[i])))
            << method << " " << name << "[" << i << "]";
      }
    }
  }
}

TEST_F(MergeTest, DareIsSeededAndKeepsAboutDensity) {
  // bf16 inputs: base + (model - base) rounds back to exactly the model's value.
  WriteModel(P("base"), RandomModel(20, Dtype::kBF16), TinyConfig());
  WriteModel(P("a"), RandomModel(21, Dtype::kBF16), TinyConfig());
  auto spec = [&](int seed, const std::string& out) {
    return json{{"method", "dare_linear"},
                {"base", P("base")},
                {"models", {{{"path", P("a")}, {"density", 0.25}}}},
                {"seed", seed},
                {"out", P(out)},
                {"rescale", false}};
  };
  ASSERT_EQ(Run("merge", spec(1, "s1")).code, 0);
  ASSERT_EQ(Run("merge", spec(1, "s1b")).code, 0);
  ASSERT_EQ(Run("merge", spec(2, "s2")).code, 0);
  EXPECT_EQ(ReadText(P("s1/model.safetensors")), ReadText(P("s1b/model.safetensors")));
  EXPECT_NE(ReadText(P("s1/model.safetensors")), ReadText(P("s2/model.safetensors")));
  Model base = ReadModel(P("base")), a = ReadModel(P("a")), s1 = ReadModel(P("s1"));
  size_t kept = 0, total = 0;
  for (const auto& [name, t] : s1) {
    for (size_t i = 0; i < t.values.size(); ++i, ++total) {
      // Without rescale each element is either the base or the model's value.
      const bool is_model = t.values[i] == a[name].values[i];
      ASSERT_TRUE(is_model || t.values[i] == base[name].values[i]) << name;
      kept += is_model;
    }
  }
  EXPECT_NEAR(static_cast<double>(kept) / total, 0.25, 0.02);
}

TEST_F(MergeTest, RevertCopiesTheMiddleLayersOrModulesBackFromTheBase) {
  Model base = RandomModel(30, Dtype::kBF16), model = RandomModel(31, Dtype::kBF16);
  WriteModel(P("base"), base, TinyConfig(8));
  WriteModel(P("model"), model, TinyConfig(8));
  base = ReadModel(P("base"));
  model = ReadModel(P("model"));
  // Default: the middle block, the one convention (common/layer_range.h): of 8 layers,
  // [round(9*8/34), 8 - round(6*8/34)) = 2:7, i.e. layers 2..6 — and the start event says so.
  Result r = Run("revert", {{"base", P("base")}, {"model", P("model")}, {"out", P("mid")}});
  ASSERT_EQ(r.code, 0) << r.err;
  ASSERT_FALSE(r.events.empty());
  EXPECT_EQ(r.events[0]["event"], "start");
  EXPECT_EQ(r.events[0]["layers"], json::array({"2:7"})) << r.events[0].dump();
  EXPECT_EQ(r.events[0]["num_layers"], 8);
  Model mid = ReadModel(P("mid"));
  for (const auto& [name, t] : mid) {
    const int layer = LayerOf(name);
    const bool reverted = layer >= 2 && layer < 7;
    EXPECT_EQ(t.values, (reverted ? base : model)[name].values) << name;
  }
  // "middle" written out gives the same bytes; a half-open "2:7" too.
  ASSERT_EQ(
      Run("revert",
          {{"base", P("base")}, {"model", P("model")}, {"out", P("mid2")}, {"layers", {"2:7"}}})
          .code,
      0);
  EXPECT_EQ(ReadText(P("mid2/model.safetensors")), ReadText(P("mid/model.safetensors")));
  ASSERT_EQ(Run("revert", {{"base", P("base")},
                           {"model", P("model")},
                           {"out", P("attn")},
                           {"modules", {"attention", "embeddings"}},
                           {"layers", {"0:2"}}})
                .code,
            0);
  Model attn = ReadModel(P("attn"));
  for (const auto& [name, t] : attn) {
    const int layer = LayerOf(name);
    const bool reverted = layer >= 0 && layer < 2 && name.find("self_attn") != std::string::npos;
    EXPECT_EQ(t.values, (reverted ? base : model)[name].values) << name;
  }
  ASSERT_EQ(Run("revert", {{"base", P("base")},
                           {"model", P("model")},
                           {"out", P("pat")},
                           {"pattern", "embed_tokens|norm\\.weight$"}})
                .code,
            0);
  Model pat = ReadModel(P("pat"));
  EXPECT_EQ(pat["model.embed_tokens.weight"].values, base["model.embed_tokens.weight"].values);
  EXPECT_EQ(pat["model.layers.3.input_layernorm.weight"].values,
            base["model.layers.3.input_layernorm.weight"].values);
  EXPECT_EQ(pat["lm_head.weight"].values, model["lm_head.weight"].values);
}

TEST_F(MergeTest, InterpolationSweepWritesOneCheckpointPerAlpha) {
  Model base = RandomModel(40, Dtype::kBF16), model = RandomModel(41, Dtype::kBF16);
  WriteModel(P("base"), base, TinyConfig());
  WriteModel(P("model"), model, TinyConfig(), 2);
  Result r = Run("interpolate", {{"base", P("base")},
                                 {"model", P("model")},
                                 {"alphas", {0, 0.25, 1}},
                                 {"layers", {"1:3"}},
                                 {"out_pattern", P("interp-{alpha}")}});
  ASSERT_EQ(r.code, 0) << r.err;
  // One output event per checkpoint, each under its own name (the worker keeps one artifact
  // per name) and with the sweep's operation.
  std::vector<std::string> names;
  for (const json& e : r.events) {
    if (e["event"] != "output") continue;
    names.push_back(e["name"]);
    EXPECT_EQ(e["operation"], "interpolate");
  }
  EXPECT_EQ(names,
            (std::vector<std::string>{"model_alpha_0", "model_alpha_0.25", "model_alpha_1"}));
  EXPECT_EQ(r.events[0]["layers"], json::array({"1:3"})) << r.events[0].dump();
  for (double alpha : {0.0, 0.25, 1.0}) {
    Model m = ReadModel(P(absl::StrCat("interp-", alpha)));
    ASSERT_EQ(m.size(), base.size()) << alpha;
    for (const auto& [name, t] : m) {
      const int layer = LayerOf(name);
      const double a = layer >= 1 && layer <= 2 ? alpha : 1.0;
      std::vector<double> ref(t.values.size());
      for (size_t i = 0; i < ref.size(); ++i) {
        ref[i] = base[name].values[i] +
                 a * (static_cast<double>(model[name].values[i]) - base[name].values[i]);
      }
      ExpectRounded(t, ref, absl::StrCat(name, " alpha ", alpha));
    }
  }
  // Per-range alphas in one checkpoint; tensors outside every range stay trained.
  ASSERT_EQ(
      Run("interpolate",
          {{"base", P("base")},
           {"model", P("model")},
           {"out", P("ranges")},
           {"ranges", {{{"layers", {"0"}}, {"alpha", 0.5}}, {{"layers", {"3"}}, {"alpha", 0}}}}})
          .code,
      0);
  Model ranges = ReadModel(P("ranges"));
  for (const auto& [name, t] : ranges) {
    const int layer = LayerOf(name);
    if (layer == 3) EXPECT_EQ(t.values, base[name].values) << name;
    if (layer == 1 || layer < 0) EXPECT_EQ(t.values, model[name].values) << name;
    if (layer == 0) {
      std::vector<double> ref(t.values.size());
      for (size_t i = 0; i < ref.size(); ++i)
        ref[i] = 0.5 * (static_cast<double>(base[name].values[i]) + model[name].values[i]);
      ExpectRounded(t, ref, name);
    }
  }
}

TEST_F(MergeTest, UpcycleCopiesEveryFfnIntoExpertsAndAddsRouters) {
  Model dense = RandomModel(50, Dtype::kBF16);
  WriteModel(P("dense"), dense, TinyConfig());
  dense = ReadModel(P("dense"));
  json spec = {{"model", P("dense")},
               {"out", P("moe")},
               {"experts", 4},
               {"top_k", 2},
               {"router_init", {{"std", 0.02}, {"seed", 3}}}};
  ASSERT_EQ(Run("upcycle", spec).code, 0);
  Model moe = ReadModel(P("moe"));
  json config = json::parse(ReadText(P("moe/config.json")));
  EXPECT_EQ(config["num_experts"], 4);
  EXPECT_EQ(config["num_experts_per_tok"], 2);
  EXPECT_EQ(config["norm_topk_prob"], true);
  EXPECT_EQ(config["hidden_size"], 16);
  for (int l = 0; l < 4; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".mlp.");
    EXPECT_EQ(moe.count(p + "gate_proj.weight"), 0u);
    for (int e = 0; e < 4; ++e) {
      for (const char* proj : {"gate_proj", "up_proj", "down_proj"}) {
        EXPECT_EQ(moe[absl::StrCat(p, "experts.", e, ".", proj, ".weight")].values,
                  dense[p + proj + ".weight"].values);
      }
    }
    const Tensor& router = moe[p + "gate.weight"];
    EXPECT_EQ(router.shape, (std::vector<int64_t>{4, 16}));
    double sum = 0, sq = 0;
    for (float v : router.values) sum += v, sq += v * v;
    const double n = router.values.size();
    EXPECT_LT(std::fabs(sum / n), 0.01);
    EXPECT_NEAR(std::sqrt(sq / n), 0.02, 0.006);
  }
  EXPECT_EQ(moe["model.embed_tokens.weight"].values, dense["model.embed_tokens.weight"].values);
  EXPECT_EQ(moe.size(), dense.size() - 12 + 4 * 12 + 4);
  // Same seed, same bytes; the router init is recorded.
  spec["out"] = P("moe2");
  ASSERT_EQ(Run("upcycle", spec).code, 0);
  EXPECT_EQ(ReadText(P("moe/model.safetensors")), ReadText(P("moe2/model.safetensors")));
  json manifest = json::parse(ReadText(P("moe/stemma.json")));
  EXPECT_EQ(manifest["producer"]["params"]["router_init"]["seed"], 3);
}

TEST_F(MergeTest, GraftAddsTheDenseDeltaToSharedTensorsAndEveryExpert) {
  Model base = RandomModel(60, Dtype::kBF16), instruct = RandomModel(61, Dtype::kBF16);
  WriteModel(P("base"), base, TinyConfig());
  WriteModel(P("instruct"), instruct, TinyConfig());
  // The target: an upcycled MoE whose vocabulary grew to 70 rows after the base.
  WriteModel(P("dense-grown"), RandomModel(62, Dtype::kF32, 4, 0.0f, 1.0f, 70), TinyConfig());
  ASSERT_EQ(
      Run("upcycle", {{"model", P("dense-grown")}, {"out", P("target")}, {"experts", 3}}).code, 0);
  Model target = ReadModel(P("target"));
  Result r = Run("graft", {{"base", P("base")},
                           {"instruct", P("instruct")},
                           {"target", P("target")},
                           {"out", P("grafted")},
                           {"scale", 1.0}});
  ASSERT_EQ(r.code, 0) << r.err;
  Model grafted = ReadModel(P("grafted"));
  ASSERT_EQ(grafted.size(), target.size());
  for (const auto& [name, t] : grafted) {
    EXPECT_EQ(t.dtype, Dtype::kF32) << name;
    if (name.find("mlp.gate.weight") != std::string::npos) {
      EXPECT_EQ(t.values, target[name].values) << "router keeps its value: " << name;
      continue;
    }
    std::string dense = name;
    const size_t e = dense.find("experts.");
    if (e != std::string::npos) dense.erase(e, dense.find('.', e + 8) - e + 1);
    ASSERT_TRUE(base.count(dense)) << dense;
    std::vector<double> ref(t.values.size());
    const size_t covered = base[dense].values.size();
    for (size_t i = 0; i < ref.size(); ++i) {
      ref[i] = target[name].values[i] +
               (i < covered ? static_cast<double>(instruct[dense].values[i]) - base[dense].values[i]
                            : 0.0);
    }
    ExpectRounded(t, ref, name);
  }
  // Dense tensors without a place in the target are refused, naming them.
  Model extra = base;
  extra["model.extra.weight"] = Tensor{Dtype::kF32, {2}, {1, 2}};
  Model extra_inst = instruct;
  extra_inst["model.extra.weight"] = Tensor{Dtype::kF32, {2}, {1, 3}};
  WriteModel(P("base-x"), extra, TinyConfig());
  WriteModel(P("inst-x"), extra_inst, TinyConfig());
  r = Run("graft", {{"base", P("base-x")},
                    {"instruct", P("inst-x")},
                    {"target", P("target")},
                    {"out", P("bad")}});
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("model.extra.weight"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(P("bad")));
}

TEST_F(MergeTest, AgreesWithMergekit) {
  // fp32 inputs: magnitude ties (where any top-k order is valid) are then vanishingly rare.
  const int layers = 2;
  json config = TinyConfig(layers);
  WriteModel(P("base"), RandomModel(100, Dtype::kF32, layers), config);
  WriteModel(P("a"), RandomModel(101, Dtype::kF32, layers, 0.0f, 1.0f), config);
  WriteModel(P("b"), RandomModel(102, Dtype::kF32, layers, 0.1f, 0.5f), config, 2);
  WriteModel(P("c"), RandomModel(103, Dtype::kF32, layers, -0.1f, 2.0f), config);
  json cases = json::array();
  struct M {
    std::string method;
    std::vector<double> weights, densities;
  };
  for (const M& m : std::vector<M>{{"linear", {1, 2, 0.5}, {}},
                                   {"task_arithmetic", {0.5, 0.3, 0.7}, {}},
                                   {"ties", {1.0, 0.6, 0.8}, {0.5, 0.3, 0.9}}}) {
    json ours = json::array(), theirs = json::array();
    const char* names[] = {"a", "b", "c"};
    for (int i = 0; i < 3; ++i) {
      json params = {{"weight", m.weights[i]}};
      json entry = {{"path", P(names[i])}, {"weight", m.weights[i]}};
      if (!m.densities.empty()) params["density"] = entry["density"] = m.densities[i];
      ours.push_back(entry);
      theirs.push_back({{"model", P(names[i])}, {"parameters", params}});
    }
    json spec = {{"method", m.method},
                 {"models", ours},
                 {"out", P("stemma-" + m.method)},
                 {"dtype", "bfloat16"}};
    json mk = {{"merge_method", m.method},
               {"models", theirs},
               {"dtype", "float32"},
               {"out_dtype", "bfloat16"}};
    if (m.method != "linear") spec["base"] = mk["base_model"] = P("base");
    Result r = Run("merge", spec);
    ASSERT_EQ(r.code, 0) << m.method << ": " << r.err;
    cases.push_back({{"name", m.method},
                     {"mergekit", mk},
                     {"stemma_out", P("stemma-" + m.method)},
                     {"mergekit_out", P("mergekit-" + m.method)}});
  }
  std::ofstream(P("cases.json")) << cases.dump(2);
  const std::string cmd = absl::StrCat("PYTHONPATH=", STEMMA_MERGEKIT_DIR, " ", STEMMA_PYTHON, " ",
                                       STEMMA_SOURCE_DIR, "/tests/engine/merge_mergekit.py ",
                                       P("cases.json"), " >", P("mk.out"), " 2>", P("mk.err"));
  const int status = std::system(cmd.c_str());
  const std::string report = ReadText(P("mk.out"));
  std::cerr << report;
  EXPECT_EQ(WIFEXITED(status) ? WEXITSTATUS(status) : -1, 0)
      << report << ReadText(P("mk.err")).substr(0, 4000);
  for (const char* method : {"linear", "task_arithmetic", "ties"}) {
    EXPECT_NE(report.find(absl::StrCat(method, ": ok")), std::string::npos) << report;
  }
}

}  // namespace
}  // namespace stemma::engine::merge
