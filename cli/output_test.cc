#include "cli/output.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <iostream>
#include <sstream>

#include "cli/metrics_view.h"

namespace stemma::cli {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr int64_t kNow = 1'700'000'100'000;

v1::Job RunningJob() {
  v1::Job job;
  job.set_id("j-7");
  job.set_state(v1::RUNNING);
  job.set_attempts(2);
  job.set_attempt_budget(3);
  job.set_reason("retrying after exit 3");
  job.set_created_ms(kNow - 125'000);
  job.set_queued_ms(kNow - 60'000);
  job.set_updated_ms(kNow - 1'000);
  v1::JobSpec* spec = job.mutable_spec();
  spec->set_name("train-slavic");
  spec->set_priority(5);
  spec->set_max_attempts(3);
  spec->set_experiment("family-experts");
  (*spec->mutable_labels())["family"] = "slavic";
  spec->add_depends_on("j-3");
  spec->mutable_resources()->set_gpus(2);
  spec->mutable_noop()->set_duration_ms(500);
  v1::Attempt* current = job.mutable_current();
  current->set_id("j-7.2");
  current->set_number(2);
  current->set_started_ms(kNow - 30'000);
  v1::AttemptPart* part = current->add_parts();
  part->set_worker_id("w0");
  part->add_gpu_ids(0);
  part->add_gpu_ids(1);
  job.mutable_progress()->set_fraction(0.25);
  job.mutable_progress()->set_step(100);
  (*job.mutable_outputs())["checkpoint"] = "/ckpt/j-7";
  return job;
}

TEST(JobToJsonTest, HasTheDocumentedShape) {
  nlohmann::json j = JobToJson(RunningJob());
  EXPECT_EQ(j["id"], "j-7");
  EXPECT_EQ(j["name"], "train-slavic");
  EXPECT_EQ(j["kind"], "noop");
  EXPECT_EQ(j["state"], "RUNNING");
  EXPECT_TRUE(j["attempts"].is_number_integer());
  EXPECT_EQ(j["attempts"], 2);
  EXPECT_EQ(j["max_attempts"], 3);
  EXPECT_EQ(j["priority"], 5);
  EXPECT_EQ(j["labels"]["family"], "slavic");
  EXPECT_EQ(j["experiment"], "family-experts");
  EXPECT_EQ(j["depends_on"], nlohmann::json::array({"j-3"}));
  EXPECT_EQ(j["reason"], "retrying after exit 3");
  EXPECT_EQ(j["exit_code"], 0);
  EXPECT_EQ(j["created_ms"], kNow - 125'000);
  EXPECT_EQ(j["queued_ms"], kNow - 60'000);
  EXPECT_EQ(j["started_ms"], kNow - 30'000);
  EXPECT_EQ(j["finished_ms"], 0);
  EXPECT_EQ(j["attempt_id"], "j-7.2");
  EXPECT_EQ(j["workers"], nlohmann::json::array({"w0"}));
  EXPECT_EQ(j["gpus"], nlohmann::json::array({0, 1}));
  EXPECT_DOUBLE_EQ(j["progress"]["fraction"].get<double>(), 0.25);
  EXPECT_EQ(j["progress"]["step"], 100);
  EXPECT_EQ(j["progress"]["message"], "");
  EXPECT_EQ(j["outputs"]["checkpoint"], "/ckpt/j-7");
  // The spec is protobuf JSON with the proto's field names.
  EXPECT_EQ(j["spec"]["name"], "train-slavic");
  EXPECT_EQ(j["spec"]["resources"]["gpus"], 2);
  EXPECT_EQ(j["spec"]["depends_on"], nlohmann::json::array({"j-3"}));
  EXPECT_TRUE(j["spec"].contains("noop"));
}

TEST(JobToJsonTest, EmptyJobHasEveryKey) {
  nlohmann::json j = JobToJson(v1::Job());
  for (const char* key :
       {"id",         "name",      "kind",       "state",       "attempts",   "max_attempts",
        "priority",   "labels",    "experiment", "depends_on",  "reason",     "exit_code",
        "created_ms", "queued_ms", "started_ms", "finished_ms", "attempt_id", "workers",
        "gpus",       "progress",  "outputs",    "spec",        "early_stop", "engine_build_id"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  EXPECT_EQ(j["started_ms"], 0);
  EXPECT_TRUE(j["workers"].is_array());
  EXPECT_TRUE(j["labels"].is_object());
}

TEST(JsonToYamlTest, SameTreeAndStringsStayStrings) {
  nlohmann::json j = JobToJson(RunningJob());
  j["labels"]["version"] = "3";
  j["labels"]["flag"] = "true";
  YAML::Node node = YAML::Load(JsonToYaml(j));
  EXPECT_EQ(node["state"].as<std::string>(), "RUNNING");
  EXPECT_EQ(node["attempts"].as<int>(), 2);
  EXPECT_EQ(node["started_ms"].as<int64_t>(), kNow - 30'000);
  EXPECT_EQ(node["gpus"][1].as<int>(), 1);
  EXPECT_EQ(node["labels"]["version"].Tag(), "!");  // quoted: stays a string
  EXPECT_EQ(node["labels"]["flag"].Tag(), "!");
  EXPECT_EQ(node["spec"]["resources"]["gpus"].as<int>(), 2);
}

TEST(RenderTableTest, PadsColumnsWithoutTrailingBlanks) {
  std::string out = RenderTable({"ID", "NAME"}, {{"j-1", "a"}, {"j-100", "longer"}});
  EXPECT_EQ(out,
            "ID      NAME\n"
            "j-1     a\n"
            "j-100   longer\n");
}

TEST(RenderJobsTableTest, ShowsTheColumns) {
  std::string out = RenderJobsTable({RunningJob()}, /*wide=*/false, kNow);
  EXPECT_THAT(out, HasSubstr("ID"));
  EXPECT_THAT(out, HasSubstr("ATTEMPTS"));
  EXPECT_THAT(out, HasSubstr("REASON"));
  EXPECT_THAT(out, ::testing::Not(HasSubstr("PRIORITY")));
  std::string row = out.substr(out.find('\n') + 1);
  EXPECT_THAT(row, HasSubstr("j-7"));
  EXPECT_THAT(row, HasSubstr("train-slavic"));
  EXPECT_THAT(row, HasSubstr("noop"));
  EXPECT_THAT(row, HasSubstr("RUNNING"));
  EXPECT_THAT(row, HasSubstr("2/3"));
  EXPECT_THAT(row, HasSubstr("2m"));  // created 125 s ago
  EXPECT_THAT(row, HasSubstr("retrying after exit 3"));

  std::string wide = RenderJobsTable({RunningJob()}, /*wide=*/true, kNow);
  EXPECT_THAT(wide, HasSubstr("PRIORITY   GPUS   WORKER(S)   EXIT   REASON"));
  EXPECT_THAT(wide, HasSubstr("0,1"));
  EXPECT_THAT(wide, HasSubstr("w0"));
}

TEST(RenderJobDetailsTest, KeyValueLines) {
  std::string out = RenderJobDetails(RunningJob(), kNow);
  EXPECT_THAT(out, HasSubstr("id:"));
  EXPECT_THAT(out, HasSubstr("state:"));
  EXPECT_THAT(out, HasSubstr("RUNNING\n"));
  EXPECT_THAT(out, HasSubstr("family=slavic"));
  EXPECT_THAT(out, HasSubstr("checkpoint=/ckpt/j-7"));
}

TEST(RenderWorkersTableTest, UsedOverTotal) {
  v1::WorkerInfo w;
  w.set_id("w0");
  w.set_host("node-1");
  w.set_state(v1::WORKER_DRAINING);
  w.add_gpus()->set_id(0);
  w.add_gpus()->set_id(1);
  w.add_gpus_in_use(1);
  w.set_cpus(8);
  w.set_cpus_in_use(1.5);
  w.set_memory_mb(64 * 1024);
  w.set_memory_in_use_mb(512);
  w.add_attempts("j-1.1");
  w.set_last_heartbeat_ms(2'000);  // the coordinator sends the age
  std::string out = RenderWorkersTable({w}, /*wide=*/false, kNow);
  EXPECT_THAT(out, HasSubstr("HEARTBEAT-AGE"));
  EXPECT_THAT(out, HasSubstr("DRAINING"));
  EXPECT_THAT(out, HasSubstr("1/2"));
  EXPECT_THAT(out, HasSubstr("1.5/8"));
  EXPECT_THAT(out, HasSubstr("512M/64G"));
  EXPECT_THAT(out, HasSubstr("2s"));
  w.set_last_heartbeat_ms(kNow - 3'000);  // a timestamp reads as one
  EXPECT_EQ(HeartbeatAgeMs(w, kNow), 3'000);
  w.set_last_heartbeat_ms(-1);  // disconnected
  EXPECT_THAT(RenderWorkersTable({w}, false, kNow), HasSubstr("   -\n"));
  nlohmann::json j = WorkerToJson(w);
  EXPECT_EQ(j["state"], "DRAINING");
  EXPECT_EQ(j["gpus"].size(), 2u);
}

TEST(ParseStatesTest, CaseInsensitiveRepeatedAndCommaLists) {
  auto states = ParseStates({"running", "Queued,FAILED", " succeeded "});
  ASSERT_TRUE(states.ok()) << states.status();
  EXPECT_EQ(*states,
            (std::vector<v1::JobState>{v1::RUNNING, v1::QUEUED, v1::FAILED, v1::SUCCEEDED}));
  auto none = ParseStates({});
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
}

TEST(ParseStatesTest, BadNameIsAUsageErrorNamingIt) {
  for (const char* bad : {"runing", "JOB_STATE_UNSPECIFIED", "running,,queued", "0"}) {
    auto states = ParseStates({bad});
    ASSERT_FALSE(states.ok()) << bad;
    EXPECT_TRUE(IsUsageError(states.status())) << bad;
    EXPECT_THAT(std::string(states.status().message()), HasSubstr("unknown state"));
    EXPECT_THAT(std::string(states.status().message()), HasSubstr("running"));
  }
  auto states = ParseStates({"runing"});
  EXPECT_THAT(std::string(states.status().message()), HasSubstr("'runing'"));
}

TEST(ParseLabelsTest, KeyValue) {
  auto labels = ParseLabels({"family=slavic", "expr=a=b"});
  ASSERT_TRUE(labels.ok());
  EXPECT_EQ(labels->at("family"), "slavic");
  EXPECT_EQ(labels->at("expr"), "a=b");
  EXPECT_FALSE(ParseLabels({"family"}).ok());
  EXPECT_FALSE(ParseLabels({"=x"}).ok());
}

TEST(ParseKindTest, KnownKinds) {
  EXPECT_EQ(*ParseKind("NOOP"), "noop");
  EXPECT_FALSE(ParseKind("train").ok());
}

TEST(ParseOutputFormatTest, Names) {
  EXPECT_EQ(*ParseOutputFormat("json"), OutputFormat::kJson);
  EXPECT_EQ(*ParseOutputFormat("wide"), OutputFormat::kWide);
  EXPECT_TRUE(IsUsageError(ParseOutputFormat("xml").status()));
}

TEST(HumanDurationTest, Units) {
  EXPECT_EQ(HumanDuration(0), "0s");
  EXPECT_EQ(HumanDuration(-5), "0s");
  EXPECT_EQ(HumanDuration(250), "250ms");
  EXPECT_EQ(HumanDuration(3'400), "3s");
  EXPECT_EQ(HumanDuration(4 * 60'000 + 5'000), "4m");
  EXPECT_EQ(HumanDuration(2 * 3'600'000LL), "2h");
  EXPECT_EQ(HumanDuration(3 * 86'400'000LL), "3d");
  EXPECT_EQ(HumanAge(0, kNow), "-");
}

TEST(RenderEventLineTest, PreviousArrowState) {
  v1::JobEvent event;
  *event.mutable_job() = RunningJob();
  event.set_previous(v1::ASSIGNED);
  std::string line = RenderEventLine(event, kNow);
  EXPECT_THAT(line, ::testing::MatchesRegex(
                        "[0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{3} j-7 train-slavic ASSIGNED -> "
                        "RUNNING retrying after exit 3"));
  event.clear_previous();
  EXPECT_THAT(RenderEventLine(event, kNow), HasSubstr(" - -> RUNNING"));
  nlohmann::json j = EventToJson(event, kNow);
  EXPECT_EQ(j["previous"], "-");
  EXPECT_EQ(j["state"], "RUNNING");
}

TEST(RenderEventLineTest, ProgressOfARunningJobIsNotATransition) {
  v1::JobEvent event;
  *event.mutable_job() = RunningJob();  // 25%, step 100
  event.mutable_job()->mutable_progress()->set_message("loss 2.5 lr 0.0003");
  event.set_previous(v1::RUNNING);
  EXPECT_THAT(RenderEventLine(event, kNow),
              HasSubstr(" j-7 train-slavic RUNNING 25% step 100 loss 2.5 lr 0.0003"));
  EXPECT_THAT(RenderEventLine(event, kNow), Not(HasSubstr("->")));
}

TEST(TerminalSafe, ControlCharactersBecomeVisibleEscapes) {
  EXPECT_EQ(TerminalSafe("ppl/uk"), "ppl/uk");
  EXPECT_EQ(TerminalSafe("a\x1b]0;pwned\x07"
                         "b"),
            "a\\u001b]0;pwned\\u0007b");
  EXPECT_EQ(TerminalSafe("x\nj-9  FORGED\r\t"), "x\\nj-9  FORGED\\r\\t");
  EXPECT_EQ(TerminalSafe("\xc2\x9b"
                         "31m"),
            "\\u009b31m");  // C1 CSI as UTF-8
  EXPECT_EQ(TerminalSafe("caf\xc3\xa9 \xe2\x80\xa6"), "caf\xc3\xa9 \xe2\x80\xa6");  // not C1
}

TEST(TerminalSafe, TableCellsCannotForgeRows) {
  v1::Job job = RunningJob();
  job.set_reason("bad\x1b[31m\nj-999   FORGED");
  const std::string table = RenderJobsTable({job}, false, kNow);
  EXPECT_EQ(std::count(table.begin(), table.end(), '\n'), 2);
  EXPECT_THAT(table, Not(HasSubstr("\x1b")));
  EXPECT_THAT(table, HasSubstr("bad\\u001b[31m\\nj-999"));
  EXPECT_THAT(RenderJobDetails(job, kNow), Not(HasSubstr("\x1b")));
}

TEST(TerminalSafe, TheGuardEscapesWhatEverIsPrintedButLineBreaks) {
  std::ostringstream sink;
  std::streambuf* saved = std::cout.rdbuf(sink.rdbuf());
  GuardStdout();
  std::cout << "ok\tline\n"
            << "\x1b]52;c;evil\x07"
            << "\xc2"
            << "\x9b"
            << "\xc2\xa9\n";
  std::cout.flush();
  UnguardStdout();
  std::cout.rdbuf(saved);
  EXPECT_EQ(sink.str(), "ok\tline\n\\u001b]52;c;evil\\u0007\\u009b\xc2\xa9\n");
}

TEST(JsonPath, KubectlsSubsetOverAListing) {
  const nlohmann::json list = {
      {"kind", "List"},
      {"items",
       {{{"id", "j-1"}, {"name", "ru"}, {"labels", {{"family", "slavic"}}}, {"gpus", {0, 1}}},
        {{"id", "j-2"}, {"name", "es"}, {"labels", {{"family", "romance"}}}, {"gpus", {2}}}}}};
  struct Case {
    std::string tmpl, out;
  };
  const Case cases[] = {
      {"{.items[*].id}", "j-1 j-2"},
      {"{.items[0].name}", "ru"},
      {"{.items[-1].name}", "es"},
      {"{.items[1].labels.family}", "romance"},
      {"{.items[0]['labels']['family']}", "slavic"},
      {"{.items[0].gpus}", "[0,1]"},
      {"{$.kind}", "List"},
      {"{range .items[*]}{.id}{\"\\t\"}{.name}{\"\\n\"}{end}", "j-1\tru\nj-2\tes\n"},
      {"ids: {.items[*].id}\\n", "ids: j-1 j-2\n"},
      {"{.items[*].missing}", ""},
      {"{range .items[*]}[{@.gpus[0]}]{end}", "[0][2]"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<std::string> out = ApplyJsonPath(list, c.tmpl);
    ASSERT_TRUE(out.ok()) << c.tmpl << ": " << out.status();
    EXPECT_EQ(*out, c.out) << c.tmpl;
  }
}

TEST(JsonPath, BadTemplatesAreUsageErrors) {
  for (const char* bad : {"{.items[", "{range .items[*]}{.id}", "{end}", "{..id}", "{id}",
                          "{.items[?(@.id)]}", "{.a"}) {
    absl::StatusOr<std::string> out = ApplyJsonPath(nlohmann::json::object(), bad);
    EXPECT_FALSE(out.ok()) << bad;
    EXPECT_TRUE(IsUsageError(out.status())) << bad;
  }
  std::string tmpl;
  auto format = ParseOutputFormat("jsonpath={.items[*].id}", &tmpl);
  ASSERT_TRUE(format.ok());
  EXPECT_EQ(*format, OutputFormat::kJsonPath);
  EXPECT_EQ(tmpl, "{.items[*].id}");
  EXPECT_EQ(*ParseOutputFormat("name"), OutputFormat::kName);
  EXPECT_FALSE(ParseOutputFormat("jsonpath=").ok());
  EXPECT_THAT(std::string(ParseOutputFormat("xml").status().message()), HasSubstr("jsonpath"));
}

TEST(Durations, SecondsOrUnits) {
  EXPECT_EQ(*ParseDurationSeconds("90", "--timeout"), 90);
  EXPECT_EQ(*ParseDurationSeconds("1.5", "--timeout"), 1.5);
  EXPECT_EQ(*ParseDurationSeconds("500ms", "--timeout"), 0.5);
  EXPECT_EQ(*ParseDurationSeconds("10m", "--since"), 600);
  EXPECT_EQ(*ParseDurationSeconds("1h30m", "--since"), 5400);
  EXPECT_EQ(*ParseDurationSeconds("30d", "--older-than"), 30 * 86400);
  for (const char* bad : {"", "ten", "10x", "-5", "5m3"}) {
    auto d = ParseDurationSeconds(bad, "--since");
    EXPECT_FALSE(d.ok()) << bad;
    if (!d.ok()) EXPECT_THAT(std::string(d.status().message()), HasSubstr("--since")) << bad;
  }
}

TEST(AttemptHistory, OneRowPerAttemptWithWhoPreemptedIt) {
  v1::Attempt first;
  first.set_id("j-7.1");
  first.set_number(1);
  first.add_parts()->set_worker_id("w1");
  first.set_started_ms(kNow - 60'000);
  first.set_finished_ms(kNow - 30'000);
  first.set_result("preempted");
  first.set_preempted_by("j-9");
  v1::Attempt second;
  second.set_id("j-7.2");
  second.set_number(2);
  second.add_parts()->set_worker_id("w2");
  second.set_started_ms(kNow - 10'000);
  const std::string table = RenderAttemptsTable({first, second});
  EXPECT_THAT(table, HasSubstr("PREEMPTED-BY"));
  EXPECT_THAT(table, HasSubstr("j-9"));
  EXPECT_THAT(table, HasSubstr("running"));
  nlohmann::json j = AttemptsToJson({first, second});
  ASSERT_EQ(j.size(), 2u);
  EXPECT_EQ(j[0]["preempted_by"], "j-9");
  EXPECT_EQ(j[1]["workers"], nlohmann::json::array({"w2"}));
}

}  // namespace
}  // namespace stemma::cli

namespace stemma::cli {
namespace {

// `ckpt show`: an artifact measured by two evals lists each eval's numbers on its own line,
// so an older eval's bpb/pl is not read beside a newer eval's bpb/all as one measurement.
TEST(MeasuredLinesTest, OneLinePerMeasuringJob) {
  v1::Artifact a;
  auto add = [&](const std::string& job, const std::string& name, const std::string& metric,
                 double value) {
    v1::MeasuredMetric* m = a.add_measured();
    m->set_job_id(job);
    m->set_job_name(name);
    m->set_name(metric);
    m->set_value(value);
  };
  add("j-7", "eval-old", "bpb/all", 3.1);
  add("j-7", "eval-old", "bpb/pl", 3.4);
  add("j-9", "eval-new", "bpb/all", 2.9);
  (*a.mutable_metrics())["bpb/all"] = 2.9;
  (*a.mutable_metrics())["bpb/pl"] = 3.4;
  EXPECT_EQ(MeasuredLines(a), (std::vector<std::string>{"j-7 eval-old: bpb/all=3.1 bpb/pl=3.4",
                                                        "j-9 eval-new: bpb/all=2.9"}));
  a.clear_measured();  // recorded before measurements were kept per job
  EXPECT_EQ(MeasuredLines(a),
            (std::vector<std::string>{"latest (no job recorded): bpb/all=2.9 bpb/pl=3.4"}));
}

}  // namespace
}  // namespace stemma::cli
