#include "worker/attempt_output.h"

#include <gtest/gtest.h>

#include <string>

namespace stemma::worker {
namespace {

void FeedAll(AttemptOutput& out, const std::string& text, size_t piece) {
  for (size_t i = 0; i < text.size(); i += piece) {
    out.Feed(text.data() + i, std::min(piece, text.size() - i), 1000);
  }
}

// The same output, whatever pieces the pipe delivers it in, says the same things.
TEST(AttemptOutput, LinesSplitAcrossReadsParseTheSame) {
  const std::string text =
      "plain log line\n"
      "{\"event\":\"step\",\"step\":3,\"total_steps\":4,\"loss\":2.5}\n"
      + std::string(5000, 'x') + "\n"
      "STEMMA_PROGRESS {\"fraction\":0.9,\"message\":\"almost\"}\n"
      "{\"event\":\"output\",\"name\":\"model\",\"path\":\"/m\",\"type\":\"checkpoint\",\"parents\":[\"/b\"]}\n"
      "stemma-engine: error: spec.json: line 2: steps: -1 must be >= 0\n";
  for (size_t piece : {1, 3, 7, 64, 100000}) {
    AttemptOutput out;
    FeedAll(out, text, piece);
    EXPECT_EQ(out.progress_version, 2u) << piece;
    EXPECT_DOUBLE_EQ(out.progress.fraction(), 0.9) << piece;
    EXPECT_EQ(out.progress.message(), "almost");
    ASSERT_EQ(out.metrics.size(), 1u) << piece;
    EXPECT_EQ(out.metrics[0].name(), "loss");
    EXPECT_EQ(out.metrics[0].step(), 3);
    EXPECT_EQ(out.metrics[0].time_ms(), 1000);
    EXPECT_EQ(out.outputs.at("model"), "/m");
    ASSERT_EQ(out.artifacts.size(), 1u);
    EXPECT_EQ(out.artifacts[0].parents(0), "/b");
    EXPECT_EQ(out.engine_error, "spec.json: line 2: steps: -1 must be >= 0");
  }
}

TEST(AttemptOutput, BrokenJsonAndUntypedOutputsAreNotArtifacts) {
  AttemptOutput out;
  FeedAll(out, "{\"event\":\"step\",\"loss\":\n{\"event\":\"output\",\"name\":\"results\",\"path\":\"/r.json\"}\n", 5);
  EXPECT_EQ(out.progress_version, 0u);
  EXPECT_TRUE(out.metrics.empty());
  EXPECT_EQ(out.outputs.at("results"), "/r.json");
  EXPECT_TRUE(out.artifacts.empty()) << "an output event without a type is not registered";
}

}  // namespace
}  // namespace stemma::worker
