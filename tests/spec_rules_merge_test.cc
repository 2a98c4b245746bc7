// The rules of the merge-area engine specs (merge, revert, interpolate, graft, upcycle) as
// `stemma submit` applies them: a job file goes through ParseJobsYaml, ApplyDefaults and the
// spec's rules (stemma/v1/specs/merge.proto, common/spec_checks_merge.cc), and a bad spec is
// refused with one line naming the file, the line and the field. Torch-free.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/engine_spec.h"
#include "common/job_spec.h"
#include "gtest/gtest.h"
#include "stemma/v1/job.pb.h"
#include "stemma/v1/specs/merge.pb.h"

namespace stemma {
namespace {

// What submit does with a job file: parse (unknown fields, types), defaults, then every
// rule, the engine spec's with the line of each field. `layers`: the layer count of every
// input model, as the CLI learns it from a readable config.json (nullopt: unknown).
absl::Status Submit(const std::string& yaml, std::optional<int64_t> layers = std::nullopt,
                    std::vector<v1::JobSpec>* out = nullptr) {
  std::vector<JobSource> sources;
  absl::StatusOr<std::vector<v1::JobSpec>> jobs = ParseJobsYaml(yaml, "jobs.yaml", &sources);
  if (!jobs.ok()) return jobs.status();
  for (size_t i = 0; i < jobs->size(); ++i) {
    v1::JobSpec& job = (*jobs)[i];
    ApplyDefaults(&job);
    absl::Status plain = ValidateJobSpec(job);
    if (IsEngineJob(job)) {
      SpecContext context;
      context.where = sources[i].where;
      context.path = JobKind(job);
      context.lines = &sources[i].lines;
      if (layers.has_value()) {
        context.model_layers = [layers](const std::string&) -> std::optional<int64_t> {
          return layers;
        };
      }
      absl::Status lined = ValidateEngineSpec(*EngineSpecOf(job), context);
      // Without a model to look at, the coordinator's verdict (no lines) is the same.
      if (!layers.has_value()) EXPECT_EQ(plain.ok(), lined.ok()) << plain << " / " << lined;
      if (!lined.ok()) return lined;
    }
    if (!plain.ok()) return plain;
  }
  if (out != nullptr) *out = *jobs;
  return absl::OkStatus();
}

// The error names the file, the line and the field path.
void ExpectRefused(const std::string& yaml, int line, const std::string& field,
                   const std::string& what = "", std::optional<int64_t> layers = std::nullopt) {
  absl::Status s = Submit(yaml, layers);
  ASSERT_FALSE(s.ok()) << "accepted:\n" << yaml;
  const std::string m(s.message());
  EXPECT_TRUE(absl::StrContains(m, "jobs.yaml")) << m;
  EXPECT_TRUE(absl::StrContains(m, absl::StrCat("line ", line, ":")))
      << m << "\nwant line " << line;
  EXPECT_TRUE(absl::StrContains(m, field)) << m << "\nwant field " << field;
  if (!what.empty()) EXPECT_TRUE(absl::StrContains(m, what)) << m << "\nwant " << what;
}

// Complete jobs; `extra` lines are appended to the spec (indented by two), so the first
// extra line is line `kExtra`.
constexpr int kExtra = 7;

std::string MergeJob(const std::string& extra = "", const std::string& method = "ties") {
  return absl::StrCat(
      "name: soup\n"  // 1
      "merge:\n"      // 2
      "  method: ",
      method, "\n",                                                   // 3
      "  base: /ckpt/base\n"                                          // 4
      "  models: [{path: /ckpt/a, density: 0.5}, {path: /ckpt/b}]\n"  // 5
      "  out: /ckpt/merged\n",                                        // 6
      extra);
}

std::string RevertJob(const std::string& extra = "") {
  return absl::StrCat(
      "name: revert\n"            // 1
      "revert:\n"                 // 2
      "  base: /ckpt/base\n"      // 3
      "  model: /ckpt/trained\n"  // 4
      "  out: /ckpt/reverted\n"   // 5
      "  modules: [mlp]\n",       // 6
      extra);
}

std::string InterpolateJob(const std::string& extra = "") {
  return absl::StrCat(
      "name: interp\n"                          // 1
      "interpolate:\n"                          // 2
      "  base: /ckpt/base\n"                    // 3
      "  model: /ckpt/trained\n"                // 4
      "  alphas: [0, 0.5, 1]\n"                 // 5
      "  out_pattern: /ckpt/interp-{alpha}\n",  // 6
      extra);
}

std::string GraftJob(const std::string& extra = "") {
  return absl::StrCat(
      "name: graft\n"                 // 1
      "graft:\n"                      // 2
      "  base: /ckpt/dense\n"         // 3
      "  instruct: /ckpt/dense-it\n"  // 4
      "  target: /ckpt/moe-cpt\n"     // 5
      "  out: /ckpt/moe-cpt-it\n",    // 6
      extra);
}

std::string UpcycleJob(const std::string& extra = "") {
  return absl::StrCat(
      "name: upcycle\n"         // 1
      "upcycle:\n"              // 2
      "  model: /ckpt/dense\n"  // 3
      "  experts: 4\n"          // 4
      "  top_k: 2\n"            // 5
      "  out: /ckpt/moe\n",     // 6
      extra);
}

TEST(SpecRulesMerge, CompleteJobsAreAcceptedWithTheirDefaults) {
  for (const std::string& job :
       {MergeJob(), RevertJob(), InterpolateJob(), GraftJob(), UpcycleJob()}) {
    EXPECT_TRUE(Submit(job).ok()) << Submit(job) << "\n" << job;
  }
  // The soup: linear, no base, equal weights.
  const std::string soup =
      "name: soup\nmerge:\n  models: [{path: /ckpt/a}, {path: /ckpt/b}]\n  out: /ckpt/soup\n";
  std::vector<v1::JobSpec> jobs;
  ASSERT_TRUE(Submit(soup, std::nullopt, &jobs).ok()) << Submit(soup);
  const v1::MergeSpec& m = jobs[0].merge();
  v1::MergeSpec filled = m;
  FillSpecDefaults(&filled);
  EXPECT_EQ(filled.method(), "linear");
  EXPECT_EQ(filled.models(1).weight(), 1);
  EXPECT_EQ(filled.shard_size(), "5GB");
  EXPECT_FALSE(filled.overwrite());
  // revert's middle, interpolate's ranges and upcycle's router init in their typed forms.
  EXPECT_TRUE(Submit(RevertJob("  layers: [\"middle\", \"0:2\"]\n"), 8).ok());
  EXPECT_TRUE(Submit("name: i\ninterpolate:\n  base: /b\n  model: /m\n  out: /o\n"
                     "  ranges: [{layers: [\"0:9\"], alpha: 1}, {layers: [\"9:28\"], alpha: 0.5}, "
                     "{modules: [embeddings], alpha: 0}]\n",
                     34)
                  .ok());
  EXPECT_TRUE(Submit(UpcycleJob("  router_init: {method: zeros}\n")).ok());
}

TEST(SpecRulesMerge, Merge) {
  ExpectRefused(MergeJob("  lamda: 0.5\n"), kExtra, "merge.lamda", "unknown field");
  ExpectRefused(MergeJob("  lambda: half\n"), kExtra, "merge.lambda", "must be a number");
  ExpectRefused(MergeJob("", "soup"), 3, "merge.method", "'soup' is not one of linear");
  ExpectRefused(
      "name: m\nmerge:\n  method: ties\n  base: /b\n  models: [{path: /a, density: 1.5}]\n  out: "
      "/o\n",
      5, "merge.models[0].density", "1.5 must be <= 1");
  ExpectRefused("name: m\nmerge:\n  method: ties\n  models: [{path: /a}]\n  out: /o\n", 2,
                "merge.base", "is required by method ties");
  ExpectRefused("name: m\nmerge:\n  models: [{path: /a}]\n", 2, "merge.out", "is required");
  ExpectRefused("name: m\nmerge:\n  models: [{weight: 2}]\n  out: /o\n", 3, "merge.models[0].path",
                "is required");
  // A bare path is no longer a model: the one form is the mapping.
  ExpectRefused("name: m\nmerge:\n  models: [/ckpt/a]\n  out: /o\n", 3, "merge.models[0]",
                "must be a mapping");
  // Cross-field rules.
  ExpectRefused("name: m\nmerge:\n  base: /b\n  models: [{path: /a}]\n  out: /o\n", 3, "merge.base",
                "linear does not use a base");
  ExpectRefused("name: m\nmerge:\n  models: [{path: /a, density: 0.5}]\n  out: /o\n", 3,
                "merge.models[0].density", "does not sparsify");
  ExpectRefused(
      "name: m\nmerge:\n  models: [{path: /a, weight: 1}, {path: /b, weight: -1}]\n  out: /o\n", 3,
      "merge.models", "weights sum to 0");
  ExpectRefused(MergeJob("  shard_size: 5XB\n"), kExtra, "merge.shard_size", "not a byte count");
  ExpectRefused(MergeJob("  dtype: int8\n"), kExtra, "merge.dtype",
                "is not one of source, bfloat16");
}

TEST(SpecRulesMerge, Revert) {
  ExpectRefused(RevertJob("  layer: [\"2:6\"]\n"), kExtra, "revert.layer", "unknown field");
  ExpectRefused(RevertJob("  overwrite: sometimes\n"), kExtra, "revert.overwrite",
                "must be true or false");
  ExpectRefused(
      "name: r\nrevert:\n  base: /b\n  model: /m\n  out: /o\n  modules: [attention, ffn]\n", 6,
      "revert.modules[1]", "'ffn' is not one of attention, mlp, norms, embeddings");
  ExpectRefused("name: r\nrevert:\n  base: /b\n  out: /o\n", 2, "revert.model", "is required");
  // The one layer-range convention (issue 16): half-open strings; inclusive integer pairs
  // as revert took them before are refused with the new form in the message.
  ExpectRefused(RevertJob("  layers: [[2, 5]]\n"), kExtra, "revert.layers[0]",
                "must be a single value");
  ExpectRefused(RevertJob("  layers: [5]\n"), kExtra, "revert.layers[0]",
                "write layer ranges as strings");
  ExpectRefused(RevertJob("  layers: [\"6:2\"]\n"), kExtra, "revert.layers[0]",
                "is not a layer range");
  ExpectRefused(RevertJob("  layers: [\"2:9\"]\n"), kExtra, "revert.layers[0]",
                "reach past the model's 8 layers",
                /*layers=*/8);
  ExpectRefused(RevertJob("  pattern: 'q_proj|(k'\n"), kExtra, "revert.pattern",
                "not a valid regular expression");
}

TEST(SpecRulesMerge, Interpolate) {
  ExpectRefused(InterpolateJob("  alpah: 0.5\n"), kExtra, "interpolate.alpah", "unknown field");
  ExpectRefused(InterpolateJob("  tensor_hashes: 2\n"), kExtra, "interpolate.tensor_hashes",
                "must be true or false");
  ExpectRefused(InterpolateJob("  shard_size: 0\n"), kExtra, "interpolate.shard_size",
                "not a byte count");
  ExpectRefused("name: i\ninterpolate:\n  model: /m\n  alpha: 0.5\n  out: /o\n", 2,
                "interpolate.base", "is required");
  ExpectRefused(InterpolateJob("  layers: [\"middle\", \"x:3\"]\n"), kExtra,
                "interpolate.layers[1]", "is not a layer range");
  ExpectRefused(
      "name: i\ninterpolate:\n  base: /b\n  model: /m\n  out: /o\n"
      "  ranges:\n    - {layers: [\"0:9\"], alpha: 1}\n    - {layers: [\"30:40\"], alpha: 0.5}\n",
      8, "interpolate.ranges[1].layers[0]", "reach past the model's 34 layers", /*layers=*/34);
  ExpectRefused(
      "name: i\ninterpolate:\n  base: /b\n  model: /m\n  out: /o\n  ranges: [{layers: "
      "[\"0:2\"]}]\n",
      6, "interpolate.ranges[0].alpha", "is required");
  // Exactly one form.
  ExpectRefused(InterpolateJob("  alpha: 0.5\n"), kExtra, "interpolate.alpha",
                "give exactly one of alpha");
  ExpectRefused(
      "name: i\ninterpolate:\n  base: /b\n  model: /m\n  alphas: [0.5]\n  out_pattern: /o\n", 6,
      "interpolate.out_pattern", "must contain {alpha}");
  ExpectRefused(InterpolateJob("  out: /o\n"), kExtra, "interpolate.out", "use out_pattern");
}

TEST(SpecRulesMerge, Graft) {
  ExpectRefused(GraftJob("  scael: 0.5\n"), kExtra, "graft.scael", "unknown field");
  ExpectRefused(GraftJob("  scale: [1]\n"), kExtra, "graft.scale", "must be a single value");
  ExpectRefused(GraftJob("  dtype: fp8\n"), kExtra, "graft.dtype", "is not one of");
  ExpectRefused("name: g\ngraft:\n  base: /b\n  instruct: /i\n  out: /o\n", 2, "graft.target",
                "is required");
  // graft has no layer range: a range-looking field is an unknown one.
  ExpectRefused(GraftJob("  layers: [\"middle\"]\n"), kExtra, "graft.layers", "unknown field");
}

TEST(SpecRulesMerge, Upcycle) {
  ExpectRefused(UpcycleJob("  expert: 8\n"), kExtra, "upcycle.expert", "unknown field");
  ExpectRefused(UpcycleJob("  norm_topk_prob: maybe\n"), kExtra, "upcycle.norm_topk_prob",
                "must be true or false");
  ExpectRefused("name: u\nupcycle:\n  model: /d\n  experts: 0\n  out: /o\n", 4, "upcycle.experts",
                "0 must be >= 1");
  ExpectRefused("name: u\nupcycle:\n  model: /d\n  out: /o\n", 2, "upcycle.experts", "is required");
  ExpectRefused("name: u\nupcycle:\n  model: /d\n  experts: 2\n  top_k: 3\n  out: /o\n", 5,
                "upcycle.top_k", "3 is more than experts (2)");
  ExpectRefused(UpcycleJob("  router_init: {method: uniform}\n"), kExtra,
                "upcycle.router_init.method", "'uniform' is not one of normal, zeros");
  ExpectRefused(UpcycleJob("  router_init: {std: -1}\n"), kExtra, "upcycle.router_init.std",
                "-1 must be >= 0");
  // upcycle has no layer range either: `layers` is unknown.
  ExpectRefused(UpcycleJob("  layers: [\"0:2\"]\n"), kExtra, "upcycle.layers", "unknown field");
}

}  // namespace
}  // namespace stemma
