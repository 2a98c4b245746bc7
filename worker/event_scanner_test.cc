// The worker's fast scanner against the schema's reader: fed the same lines, it either
// declines a line or gives exactly the message ParseEngineEvent gives.
#include "worker/event_scanner.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/engine_events.h"
#include "google/protobuf/util/message_differencer.h"

namespace stemma::worker {
namespace {

// Lines the engine (and exec jobs) print, and the variants a JSON writer may produce.
const std::vector<std::string> kTakenLines = {
    // train's step events, compact and as Python's json.dumps writes them
    R"({"event":"step","step":3,"total_steps":10,"loss":2.3415,"lr":0.0003,"grad_norm":1.5,)"
    R"("tokens":4096,"tokens_per_s":1234.5})",
    R"({"event": "step", "step": 1, "total_steps": 50, "loss": 3.0, "tokens_per_s": 5001.0})",
    R"({"step":7,"loss":1e-7,"event":"step","l2sp":-0.5,"load_balancing":12345678901234})",
    // metric events with and without a step, and eval's suite fields beside them
    R"({"event":"metric","name":"heldout_loss/en","value":2.25,"step":100})",
    R"({"event":"metric","name":"ppl/all","value":17.5})",
    R"({"event":"metric","name":"acc/x","value":0.5,"suite":"belebele","suite_version":2,)"
    R"("corpus_content_hash":null,"cached":false})",
    // progress, checkpoint, a flat output, start and done with details
    R"({"event":"progress","step":4,"total_steps":8,"fraction":0.5,"message":"eval en"})",
    R"({"fraction":0.25,"message":"legacy STEMMA_PROGRESS","step":12})",
    R"({"event":"checkpoint","step":200,"path":"/ckpt/run/step-200"})",
    R"({"event":"output","name":"model","path":"/ckpt/a","type":"checkpoint",)"
    R"("manifest_sha256":"ab12","bytes":20755822,"operation":"cpt"})",
    R"({"event":"start","command":"train","spec":"s.yaml","total_steps":10,"threads":4,)"
    R"("resumed_from_step":0})",
    R"({"event":"done","command":"tokenize","documents":12,"tokens":34567,"hint":"x"})",
    R"({})",
    R"(  { "event" : "step" , "step" : 2 }  )",
};

// Lines the scanner leaves to the reader (which may still take them, or refuse them).
const std::vector<std::string> kDeclinedLines = {
    R"({"event":"metric","name":"acc/x","value":0.5,"labels":{"task":"x","language":"de"}})",
    R"({"event":"output","name":"results","path":"/r.json","type":"file","parents":["/m"]})",
    R"({"event":"start","command":"train","layer_ranges":[{"field":"freeze","layers":"2:7"}]})",
    R"({"event":"progress","message":"tab\there"})",
    R"({"event":"progress","message":"Größe"})",
    R"({"event":"step","step":"3","loss":1})",         // a count as a string: the mapping's
    R"({"event":"metric","name":"x","value":"NaN"})",  // non-finite: a string in proto JSON
    R"({"event":"step","step":3,"step":4})",           // duplicate keys
    R"({"event":"step","loss":1,"loss":2})",
    R"({"event":"step","step":null,"loss":1})",
    R"({"event":"step","step":1e999})",
    R"({"event":"step","step":"abc"})",  // refused by the reader too
    R"({"event":5})",
    R"({"event":"step","message":true})",
    R"({"event":"step",)",
    R"([1,2])",
};

bool Same(const v1::EngineEvent& a, const v1::EngineEvent& b) {
  return google::protobuf::util::MessageDifferencer::Equals(a, b);
}

TEST(EventScanner, TakesTheFlatLinesAndAgreesWithTheSchemasReader) {
  for (const std::string& line : kTakenLines) {
    v1::EngineEvent scanned;
    ASSERT_TRUE(ScanEngineEvent(line, &scanned)) << line;
    absl::StatusOr<v1::EngineEvent> parsed = ParseEngineEvent(line);
    ASSERT_TRUE(parsed.ok()) << line << ": " << parsed.status();
    EXPECT_TRUE(Same(scanned, *parsed)) << line << "\nscanned: " << scanned.ShortDebugString()
                                        << "\nparsed:  " << parsed->ShortDebugString();
  }
}

TEST(EventScanner, DeclinesWhatItDoesNotTakeAndNeverDisagrees) {
  for (const std::string& line : kDeclinedLines) {
    v1::EngineEvent scanned;
    EXPECT_FALSE(ScanEngineEvent(line, &scanned)) << line;
  }
}

TEST(EventScanner, StepNumbersAreSeriesSortedByNameAndOtherNumbersDetails) {
  v1::EngineEvent e;
  ASSERT_TRUE(ScanEngineEvent(kTakenLines[0], &e));
  EXPECT_EQ(e.event(), "step");
  EXPECT_EQ(e.step(), 3);
  EXPECT_EQ(e.total_steps(), 10);
  std::vector<std::string> names;
  for (const auto& s : e.series()) names.push_back(s.name());
  EXPECT_EQ(names, (std::vector<std::string>{"grad_norm", "loss", "lr", "tokens", "tokens_per_s"}));
  ASSERT_TRUE(ScanEngineEvent(kTakenLines[5], &e));
  EXPECT_EQ(e.series_size(), 0);
  EXPECT_EQ(e.details().fields().at("suite_version").number_value(), 2);
  EXPECT_EQ(e.details().fields().at("suite").string_value(), "belebele");
  EXPECT_FALSE(e.details().fields().at("cached").bool_value());
}

// The lines the reader takes but the scanner declines read as the schema says.
TEST(EventScanner, TheReaderTakesNestedAndLenientLines) {
  absl::StatusOr<v1::EngineEvent> e = ParseEngineEvent(kDeclinedLines[0]);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->labels().at("language"), "de");
  e = ParseEngineEvent(kDeclinedLines[1]);
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_EQ(e->parents_size(), 1);
  EXPECT_EQ(e->parents(0), "/m");
  e = ParseEngineEvent(R"({"event":"step","step":"3","loss":1})");
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->step(), 3);
  for (const char* bad :
       {R"({"event":"step","step":"abc"})", R"({"event":5})", "[1,2]", R"({"event":"step",)"}) {
    EXPECT_FALSE(ParseEngineEvent(bad).ok()) << bad;
  }
}

}  // namespace
}  // namespace stemma::worker
