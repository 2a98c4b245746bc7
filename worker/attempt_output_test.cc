#include "worker/attempt_output.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

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
      "{\"event\":\"step\",\"step\":3,\"total_steps\":4,\"loss\":2.5}\n" +
      std::string(5000, 'x') +
      "\n"
      "STEMMA_PROGRESS {\"fraction\":0.9,\"message\":\"almost\"}\n"
      "{\"event\":\"output\",\"name\":\"model\",\"path\":\"/"
      "m\",\"type\":\"checkpoint\",\"parents\":[\"/b\"]}\n"
      "stemma-engine: error: spec.json: line 2: steps: -1 must be >= 0\n";
  for (size_t piece : {1, 3, 7, 64, 100000}) {
    AttemptOutput out;
    FeedAll(out, text, piece);
    EXPECT_EQ(out.progress_version, 2u) << piece;
    EXPECT_DOUBLE_EQ(out.progress().fraction(), 0.9) << piece;
    EXPECT_EQ(out.progress().message(), "almost");
    ASSERT_EQ(out.metrics.size(), 1u) << piece;
    EXPECT_EQ(out.metrics.At(0).name, "loss");
    EXPECT_EQ(out.metrics.At(0).step, 3);
    EXPECT_EQ(out.metrics.At(0).time_ms, 1000);
    EXPECT_EQ(out.outputs.at("model"), "/m");
    ASSERT_EQ(out.artifacts.size(), 1u);
    EXPECT_EQ(out.artifacts[0].parents(0), "/b");
    EXPECT_EQ(out.engine_error, "spec.json: line 2: steps: -1 must be >= 0");
  }
}

// A saved checkpoint becomes a point of the checkpoint_step series (its step as value and
// step): the coordinator's preemption reads when each attempt last saved one.
TEST(AttemptOutput, CheckpointEventsArePointsOfTheCheckpointStepSeries) {
  AttemptOutput out;
  FeedAll(out,
          "{\"event\":\"step\",\"step\":4,\"total_steps\":8,\"loss\":2.5}\n"
          "{\"event\":\"checkpoint\",\"step\":4,\"path\":\"/c/step-00000004\"}\n"
          "{\"event\":\"checkpoint\",\"path\":\"/c/no-step\"}\n",
          9);
  ASSERT_EQ(out.metrics.size(), 2u);
  EXPECT_EQ(out.metrics.At(1).name, "checkpoint_step");
  EXPECT_EQ(out.metrics.At(1).value, 4);
  EXPECT_EQ(out.metrics.At(1).step, 4);
  EXPECT_EQ(out.progress().step(), 4) << "a checkpoint is not progress";
}

TEST(AttemptOutput, BrokenJsonAndUntypedOutputsAreNotArtifacts) {
  AttemptOutput out;
  FeedAll(out,
          "{\"event\":\"step\",\"loss\":\n{\"event\":\"output\",\"name\":\"results\",\"path\":\"/"
          "r.json\"}\n",
          5);
  EXPECT_EQ(out.progress_version, 0u);
  EXPECT_TRUE(out.metrics.empty());
  EXPECT_EQ(out.outputs.at("results"), "/r.json");
  EXPECT_TRUE(out.artifacts.empty()) << "an output event without a type is not registered";
}

// Step and metric lines are read by a scanner for flat objects; anything else (escapes,
// nesting, odd spacing) by a full JSON parser. Both say the same: written both ways, the
// same events give the same points, progress and outputs.
TEST(AttemptOutput, FlatAndNestedSpellingsOfAnEventSayTheSame) {
  struct Case {
    std::string flat, other;
  };
  const std::vector<Case> cases = {
      {"{\"event\":\"step\",\"step\":7,\"total_steps\":10,\"loss\":2.5e-1,\"lr\":-3E-4,\"tokens_"
       "per_s\":12000}",
       "{\"tokens_per_s\" : 12000.0 , \"lr\":-0.0003, \"loss\":0.25,\"total_steps\":10,\"step\":7,"
       "\"event\":\"step\",\"extra\":{\"nested\":[1,2]}}"},
      {"{\"event\":\"metric\",\"name\":\"heldout_loss/uk\",\"value\":3.5,\"step\":40}",
       "{\"event\":\"metric\",\"name\":\"heldout_loss\\/"
       "uk\",\"value\":3.5,\"step\":40,\"labels\":{}}"},
      {"{\"event\":\"step\",\"step\":2,\"loss\":1,\"done\":true,\"note\":null,\"message\":\"warm "
       "up\"}",
       "{\"event\":\"step\",\"step\":2,\"loss\":1,\"done\":true,\"note\":null,\"message\":"
       "\"warm\\u0020up\"}"},
  };
  for (const Case& c : cases) {
    AttemptOutput a, b;
    FeedAll(a, c.flat + "\n", 1000);
    FeedAll(b, c.other + "\n", 1000);
    ASSERT_EQ(a.metrics.size(), b.metrics.size()) << c.flat;
    ASSERT_GT(a.metrics.size(), 0u) << c.flat;
    for (size_t i = 0; i < a.metrics.size(); ++i) {
      EXPECT_EQ(a.metrics.At(i).name, b.metrics.At(i).name) << c.flat;
      EXPECT_DOUBLE_EQ(a.metrics.At(i).value, b.metrics.At(i).value) << c.flat;
      EXPECT_EQ(a.metrics.At(i).step, b.metrics.At(i).step) << c.flat;
    }
    EXPECT_EQ(a.progress_version, b.progress_version) << c.flat;
    EXPECT_EQ(a.progress().message(), b.progress().message()) << c.flat;
    EXPECT_DOUBLE_EQ(a.progress().fraction(), b.progress().fraction()) << c.flat;
    EXPECT_EQ(a.progress().step(), b.progress().step()) << c.flat;
  }
  AttemptOutput step;
  FeedAll(step, cases[0].flat + "\n", 1000);
  ASSERT_EQ(step.metrics.size(), 3u);  // every number but the step counters, by name
  EXPECT_EQ(step.metrics.At(0).name, "loss");
  EXPECT_DOUBLE_EQ(step.metrics.At(0).value, 0.25);
  EXPECT_EQ(step.metrics.At(1).name, "lr");
  EXPECT_DOUBLE_EQ(step.metrics.At(1).value, -3e-4);
  EXPECT_EQ(step.metrics.At(2).name, "tokens_per_s");
  EXPECT_EQ(step.metrics.At(2).step, 7);
  EXPECT_DOUBLE_EQ(step.progress().fraction(), 0.7);
  EXPECT_EQ(step.progress().message(), "loss 0.25 lr -0.0003 tokens_per_s 1.2e+04");
  // Not numbers, not objects: nothing is taken from them.
  AttemptOutput bad;
  FeedAll(bad,
          "{\"event\":\"step\",\"step\":1,\"loss\":1.2.3}\n{\"event\":\"step\",\"step\":1,\"loss\":"
          "\"2\"}\n"
          "{\"event\":\"metric\",\"name\":\"x\",\"value\":1} trailing\n",
          1000);
  EXPECT_TRUE(bad.metrics.empty()) << bad.metrics.At(0).name;
}

// Points leave in batches that name each series once and carry labels only where a point
// has them; expanding a batch gives back the points in order.
TEST(AttemptOutput, MetricPointsLeaveAsPackedBatches) {
  AttemptOutput out;
  FeedAll(out,
          "{\"event\":\"step\",\"step\":1,\"loss\":2.5,\"lr\":0.1}\n"
          "{\"event\":\"metric\",\"name\":\"heldout_loss/uk\",\"value\":3,\"step\":1,"
          "\"labels\":{\"language\":\"uk\"}}\n"
          "{\"event\":\"step\",\"step\":2,\"loss\":2.25,\"lr\":0.1}\n",
          1000);
  ASSERT_EQ(out.metrics.size(), 5u);
  EXPECT_EQ(out.metrics.At(2).labels.at("language"), "uk");
  EXPECT_TRUE(out.metrics.At(3).labels.empty());

  v1::AttemptEvent::MetricBatch all;
  ASSERT_EQ(out.metrics.Batch(0, 100, &all), 5u);
  EXPECT_EQ(all.names_size(), 3);  // loss, lr, heldout_loss/uk: once each
  ASSERT_EQ(all.name_index_size(), 5);
  ASSERT_EQ(all.steps_size(), 5);
  ASSERT_EQ(all.values_size(), 5);
  ASSERT_EQ(all.times_ms_size(), 5);
  ASSERT_EQ(all.label_index_size(), 5);
  ASSERT_EQ(all.label_sets_size(), 1);
  const std::vector<std::string> names = {"loss", "lr", "heldout_loss/uk", "loss", "lr"};
  const std::vector<double> values = {2.5, 0.1, 3, 2.25, 0.1};
  const std::vector<int64_t> steps = {1, 1, 1, 2, 2};
  for (int i = 0; i < 5; ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(all.names(static_cast<int>(all.name_index(i))), names[i]);
    EXPECT_DOUBLE_EQ(all.values(i), values[i]);
    EXPECT_EQ(all.steps(i), steps[i]);
    EXPECT_EQ(all.times_ms(i), 1000);
    EXPECT_EQ(all.label_index(i), i == 2 ? 1u : 0u);
  }
  EXPECT_EQ(all.label_sets(0).labels().at("language"), "uk");

  // A later batch starts where the last one ended, with its own names; no labels, no column.
  v1::AttemptEvent::MetricBatch rest;
  ASSERT_EQ(out.metrics.Batch(3, 100, &rest), 2u);
  EXPECT_EQ(rest.names_size(), 2);
  EXPECT_EQ(rest.names(static_cast<int>(rest.name_index(0))), "loss");
  EXPECT_DOUBLE_EQ(rest.values(0), 2.25);
  EXPECT_EQ(rest.label_index_size(), 0);
  EXPECT_EQ(rest.label_sets_size(), 0);
  v1::AttemptEvent::MetricBatch none;
  EXPECT_EQ(out.metrics.Batch(5, 100, &none), 0u);
  v1::AttemptEvent::MetricBatch two;
  EXPECT_EQ(out.metrics.Batch(1, 2, &two), 2u);
  EXPECT_EQ(two.label_index_size(), 2);
}

}  // namespace
}  // namespace stemma::worker
