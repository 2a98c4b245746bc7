// Limits at submit (issue 13): every numeric field in range without overflow, sizes that keep
// an accepted job under every later send limit, exec environments that cannot hijack a
// worker's programs. Each refusal names its field.
#include <gtest/gtest.h>

#include <string>

#include "common/job_spec.h"

namespace stemma {
namespace {

v1::JobSpec Parse(const std::string& yaml) {
  auto jobs = ParseJobsYaml(yaml, "job.yaml");
  EXPECT_TRUE(jobs.ok()) << jobs.status();
  if (!jobs.ok() || jobs->empty()) return {};
  v1::JobSpec spec = (*jobs)[0];
  ApplyDefaults(&spec);
  return spec;
}

TEST(JobLimits, BadInputIsRefusedNamingTheField) {
  const std::string big(300 * 1024, 'x');
  struct Case {
    std::string yaml;
    std::string field;
  } cases[] = {
      {"backoff: {initial_ms: 9223372036854775807}\nnoop: {}\n", "backoff.initial_ms"},
      {"backoff: {max_ms: 100000000000}\nnoop: {}\n", "backoff.max_ms"},
      {"backoff: {multiplier: 1000}\nnoop: {}\n", "backoff.multiplier"},
      {"backoff: {multiplier: 0.5}\nnoop: {}\n", "backoff.multiplier"},
      {"backoff: {multiplier: -2}\nnoop: {}\n", "backoff.multiplier"},
      {"nodes: -1\nnoop: {}\n", "nodes"},
      {"max_attempts: 101\nnoop: {}\n", "max_attempts"},
      {"resources: {gpus: 65}\nnoop: {}\n", "resources.gpus"},
      {"noop: {exit_code: 256}\n", "noop.exit_code"},
      {"timeout_ms: 9223372036854775807\nnoop: {}\n", "timeout_ms"},
      {"noop: {duration_ms: 9223372036854775807}\n", "noop.duration_ms"},
      {"experiment: " + std::string(4096, 'e') + "\nnoop: {}\n", "experiment"},
      {"exec: {argv: [/bin/true], env: {LD_PRELOAD: /tmp/evil.so}}\n", "exec.env.LD_PRELOAD"},
      {"exec: {argv: [/bin/true], env: {LD_LIBRARY_PATH: /tmp}}\n", "exec.env.LD_LIBRARY_PATH"},
      {"exec: {argv: [true], env: {PATH: /tmp/evil}}\n", "exec.env.PATH"},
      {"exec: {argv: [/bin/true], env: {STEMMA_JOB_ID: j-1}}\n", "exec.env.STEMMA_JOB_ID"},
      {"exec: {argv: [/bin/true], env: {CUDA_VISIBLE_DEVICES: '0,1,2,3'}}\n",
       "exec.env.CUDA_VISIBLE_DEVICES"},
      {"exec: {argv: [/bin/true, '" + std::string(200 * 1024, 'a') + "']}\n", "exec.argv[1]"},
      {"labels: {a: \"x\\ny\"}\nnoop: {}\n", "labels.a"},
      {"name: big\nexec: {argv: [/bin/true], env: {A: '" + big + "'}}\n", "spec"},
  };
  for (const auto& c : cases) {
    v1::JobSpec spec = Parse(c.yaml);
    absl::Status st = ValidateJobSpec(spec);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_EQ(std::string(st.message()).rfind(c.field, 0), 0u) << st.message();
  }
}

TEST(JobLimits, EnvValuesWithNulAreRefused) {
  v1::JobSpec spec = Parse("exec: {argv: [/bin/true]}\n");
  (*spec.mutable_exec()->mutable_env())["A"] = std::string("x\0y", 3);
  absl::Status st = ValidateJobSpec(spec);
  EXPECT_NE(st.message().find("exec.env.A: contains a NUL byte"), std::string::npos) << st;
}

TEST(JobLimits, OrdinaryJobsPass) {
  EXPECT_TRUE(ValidateJobSpec(Parse("exec: {argv: [/usr/bin/env], env: {HF_TOKEN: x, "
                                    "PYTHONPATH: /opt}}\n"))
                  .ok());
  EXPECT_TRUE(ValidateJobSpec(Parse("backoff: {initial_ms: 86400000, max_ms: 86400000}\n"
                                    "timeout_ms: 3600000\nnoop: {duration_ms: 10}\n"))
                  .ok());
}

// The case: the largest delay no longer wraps into "no backoff at all".
TEST(JobLimits, BackoffNeverOverflowsAndHonoursItsCap) {
  v1::JobSpec spec;
  ApplyDefaults(&spec);
  spec.mutable_backoff()->set_initial_ms(INT64_MAX);
  spec.mutable_backoff()->set_max_ms(0);
  spec.mutable_backoff()->set_multiplier(100);
  for (int attempt : {2, 3, 10, 100}) {
    EXPECT_EQ(BackoffMs(spec, attempt), 24LL * 3600 * 1000) << attempt;
  }
  spec.mutable_backoff()->set_initial_ms(1000);
  spec.mutable_backoff()->set_max_ms(300000);
  spec.mutable_backoff()->set_multiplier(2);
  EXPECT_EQ(BackoffMs(spec, 2), 1000);
  EXPECT_EQ(BackoffMs(spec, 3), 2000);
  EXPECT_EQ(BackoffMs(spec, 5), 8000);
  EXPECT_EQ(BackoffMs(spec, 100), 300000);
  spec.mutable_backoff()->set_multiplier(1e300);  // refused at submit; still no overflow here
  EXPECT_EQ(BackoffMs(spec, 50), 300000);
}

// The job's defaults and ranges are job.proto's rules; the messages are those of the limits.
TEST(JobLimits, DefaultsComeFromTheSchemaAndZeroMeansUnset) {
  v1::JobSpec spec = Parse("noop: {}\n");
  EXPECT_EQ(spec.max_attempts(), 3);
  EXPECT_EQ(spec.nodes(), 1);
  EXPECT_EQ(spec.resources().cpus(), 1);
  EXPECT_EQ(spec.resources().gpus(), 0);
  EXPECT_EQ(spec.backoff().initial_ms(), 1000);
  EXPECT_EQ(spec.backoff().max_ms(), 300000);
  EXPECT_EQ(spec.backoff().multiplier(), 2);
  spec = Parse(
      "max_attempts: 7\nnodes: 2\nresources: {cpus: 0.5}\nbackoff: {multiplier: 1.5}\n"
      "noop: {}\n");
  EXPECT_EQ(spec.max_attempts(), 7);
  EXPECT_EQ(spec.nodes(), 2);
  EXPECT_EQ(spec.resources().cpus(), 0.5);
  EXPECT_EQ(spec.backoff().multiplier(), 1.5);
  EXPECT_EQ(spec.backoff().initial_ms(), 1000);
  EXPECT_TRUE(ValidateJobSpec(spec).ok());
  // The engine spec inside is left as submitted (its defaults are the engine's to fill).
  spec = Parse("train: {model: m, out: o}\n");
  EXPECT_FALSE(spec.train().has_batch_size());
}

TEST(JobLimits, RangeMessagesNameTheFieldAndItsBounds) {
  v1::JobSpec spec = Parse(
      "backoff: {initial_ms: 9223372036854775807, multiplier: 0.5}\n"
      "noop: {}\n");
  EXPECT_EQ(ValidateJobSpec(spec).message(),
            "backoff.initial_ms: 9223372036854775807 is outside 0..86400000");
  spec.mutable_backoff()->set_initial_ms(10);
  EXPECT_EQ(ValidateJobSpec(spec).message(), "backoff.multiplier: 0.5 is outside 1..100");
  spec = Parse("resources: {memory_mb: -1}\nnoop: {}\n");
  EXPECT_EQ(ValidateJobSpec(spec).message(), "resources.memory_mb: -1 is outside 0..16777216");
  spec = Parse("nodes: 2000\nnoop: {}\n");
  EXPECT_EQ(ValidateJobSpec(spec).message(), "nodes: 2000 is outside 1..1024");
  // Without defaults a 0 that means "not given" is not a value out of range.
  v1::JobSpec bare;
  bare.mutable_noop();
  EXPECT_TRUE(ValidateJobSpec(bare).ok());
}

}  // namespace
}  // namespace stemma
