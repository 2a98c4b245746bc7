// The CLI as a kubectl user meets it (issue 24), against a real coordinator and workers:
// config contexts, exit codes, output formats and label selectors, bulk cancel and retry,
// attempt history, `gc jobs`, and `logs --tail/--since/--timestamps`.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "tests/integration/cluster.h"

namespace stemma::testing {
namespace {

std::string Sh(const std::string& name, const std::string& script, const std::string& extra = "") {
  std::string quoted;
  for (char ch : script) {
    if (ch == '"' || ch == '\\') quoted += '\\';
    quoted += ch;
  }
  return "name: " + name + "\nexec: {argv: [/bin/sh, -c, \"" + quoted + "\"]}\n" + extra;
}

std::vector<std::string> Lines(const std::string& text) {
  return absl::StrSplit(text, '\n', absl::SkipEmpty());
}

std::set<std::string> LineSet(const std::string& text) {
  auto lines = Lines(text);
  return std::set<std::string>(lines.begin(), lines.end());
}

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

TEST(CliContexts, AContextChoosesTheCoordinatorAndFlagsAndTheEnvironmentWin) {
  Cluster c;
  c.StartCoordinator();
  const std::string config = c.dir() + "/stemma-config.yaml";
  const std::vector<std::string> env = {"STEMMA_CONFIG=" + config};
  const std::string dead = "127.0.0.1:1";  // nothing listens there

  // Nothing configured: the default address, where nothing runs.
  EXPECT_EQ(c.CliBare({"ls"}, env).exit_code, 4);
  auto set = c.CliBare({"config", "set-context", "lab", "--server", c.address()}, env);
  ASSERT_EQ(set.exit_code, 0) << set.err;
  EXPECT_TRUE(std::filesystem::exists(config));
  EXPECT_EQ(c.CliBare({"config", "current-context"}, env).out, "lab\n");  // the first is current
  auto ls = c.CliBare({"ls"}, env);
  EXPECT_EQ(ls.exit_code, 0) << ls.err;

  ASSERT_EQ(c.CliBare({"config", "set-context", "away", "--server", dead}, env).exit_code, 0);
  ASSERT_EQ(c.CliBare({"config", "use-context", "away"}, env).exit_code, 0);
  EXPECT_EQ(c.CliBare({"ls"}, env).exit_code, 4);
  EXPECT_EQ(c.CliBare({"--context", "lab", "ls"}, env).exit_code, 0);
  EXPECT_EQ(c.CliBare({"--coordinator", c.address(), "ls"}, env).exit_code, 0);
  // The environment beats the current context, an explicit --context beats the environment.
  std::vector<std::string> with_env = env;
  with_env.push_back("STEMMA_COORDINATOR=" + c.address());
  EXPECT_EQ(c.CliBare({"ls"}, with_env).exit_code, 0);
  EXPECT_EQ(c.CliBare({"--context", "away", "ls"}, with_env).exit_code, 4);

  auto contexts = c.CliBare({"config", "get-contexts", "-o", "json"}, env);
  ASSERT_EQ(contexts.exit_code, 0) << contexts.err;
  auto list = contexts.Json();
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(list[0]["name"], "lab");
  EXPECT_EQ(list[0]["server"], c.address());
  EXPECT_EQ(list[1]["current"], true);
  EXPECT_EQ(c.CliBare({"config", "get-contexts", "-o", "name"}, env).out, "lab\naway\n");
  auto table = c.CliBare({"config", "get-contexts"}, env).out;
  EXPECT_NE(table.find("CURRENT"), std::string::npos) << table;

  ASSERT_EQ(c.CliBare({"config", "delete-context", "away"}, env).exit_code, 0);
  auto none = c.CliBare({"config", "current-context"}, env);
  EXPECT_EQ(none.exit_code, 2);
  EXPECT_NE(none.err.find("no current context"), std::string::npos) << none.err;
  auto unknown = c.CliBare({"--context", "nowhere", "ls"}, env);
  EXPECT_EQ(unknown.exit_code, 2);
  EXPECT_NE(unknown.err.find("no context 'nowhere'"), std::string::npos) << unknown.err;
  // The default file is ~/.config/stemma/config.yaml.
  ASSERT_EQ(c.CliBare({"config", "set-context", "home", "--server", c.address()}).exit_code, 0);
  EXPECT_TRUE(std::filesystem::exists(c.dir() + "/.config/stemma/config.yaml"));
  EXPECT_EQ(c.CliBare({"ls"}).exit_code, 0);
}

TEST(CliBasics, VersionCompletionAndHelp) {
  Cluster c;  // no coordinator: none of these reaches one
  auto version = c.CliBare({"--version"});
  EXPECT_EQ(version.exit_code, 0);
  EXPECT_EQ(version.out.rfind("stemma ", 0), 0u) << version.out;
  for (const char* shell : {"bash", "zsh", "fish"}) {
    auto script = c.CliBare({"completion", shell});
    EXPECT_EQ(script.exit_code, 0) << shell << script.err;
    // Generated from the command tree: nested commands and their flags are there.
    for (const char* word : {"cancel", "use-context", "older-than", "timestamps"}) {
      EXPECT_NE(script.out.find(word), std::string::npos) << shell << " lacks " << word;
    }
  }
  EXPECT_EQ(c.CliBare({"completion", "tcsh"}).exit_code, 2);
  auto bash = c.CliBare({"completion", "bash"}).out;
  // The script completes in a real bash.
  const std::string file = c.WriteFile("completion.bash", bash);
  const std::string words = RunShell(
      "bash -c 'source " + file +
      "; COMP_WORDS=(stemma exp w); COMP_CWORD=2; _stemma; echo \"${COMPREPLY[@]}\"' 2>&1");
  EXPECT_EQ(words, "wait watch\n");
  EXPECT_NE(c.CliBare({"--help"}).out.find("csv"), std::string::npos);
}

class CliJobsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    c_.StartCoordinator();
    c_.StartWorker("w0");
    c_.WaitForWorkers(1);
  }
  Cluster c_;
};

TEST_F(CliJobsTest, ExitCodesTellFailureRefusalUnreachableAndTimeoutApart) {
  EXPECT_EQ(c_.Cli({"ls", "--bogus"}).exit_code, 2);
  EXPECT_EQ(c_.Cli({"submit", "-f", c_.dir() + "/missing.yaml"}).exit_code, 2);
  EXPECT_EQ(c_.Cli({"ls", "-o", "jsonpath={.items["}).exit_code, 2);
  EXPECT_EQ(c_.Cli({"ls", "-l", "family in (a"}).exit_code, 2);
  EXPECT_EQ(c_.CliBare({"--coordinator", "127.0.0.1:1", "ls"}).exit_code, 4);
  auto missing = c_.Cli({"get", "j-999"});
  EXPECT_EQ(missing.exit_code, 3) << missing.err;

  auto failing = c_.Submit(Sh("failing", "exit 7", "max_attempts: 1\n"));
  auto wait = c_.Cli({"wait", failing[0]});
  EXPECT_EQ(wait.exit_code, 1) << wait.err;

  auto sleeper = c_.Submit(Sh("sleeper", "sleep 300"));
  EXPECT_EQ(c_.Cli({"wait", sleeper[0], "--timeout", "1s"}).exit_code, 5);
  EXPECT_EQ(c_.Cli({"--timeout", "1", "wait", sleeper[0]}).exit_code, 5);
  auto old = c_.Cli({"wait", sleeper[0], "--timeout-s", "1"});
  EXPECT_EQ(old.exit_code, 5);
  EXPECT_NE(old.err.find("--timeout-s is deprecated"), std::string::npos) << old.err;
  // The old global --timeout before another command: the request timeout, with a warning.
  auto legacy = c_.Cli({"--timeout", "5", "ls"});
  EXPECT_EQ(legacy.exit_code, 0);
  EXPECT_NE(legacy.err.find("use --request-timeout"), std::string::npos) << legacy.err;
  EXPECT_EQ(c_.Cli({"--request-timeout", "5s", "ls"}).exit_code, 0);
  EXPECT_EQ(c_.Cli({"cancel", sleeper[0]}).exit_code, 0);
  // Cancelling it again is refused by the coordinator.
  EXPECT_EQ(c_.Cli({"cancel", sleeper[0]}).exit_code, 3);
}

TEST_F(CliJobsTest, SelectorsOutputFormatsAndBulkActions) {
  // GPU jobs on a CPU-only worker stay QUEUED: unfinished jobs to select.
  auto ids = c_.Submit(
      "name: ru\nnoop: {}\nresources: {gpus: 8}\nlabels: {family: slavic, size: big}\n---\n"
      "name: pl\nnoop: {}\nresources: {gpus: 8}\nlabels: {family: slavic, size: small}\n---\n"
      "name: lt\nnoop: {}\nresources: {gpus: 8}\nlabels: {family: baltic, size: small}\n---\n"
      "name: es\nnoop: {}\nresources: {gpus: 8}\nlabels: {family: romance}\n");
  ASSERT_EQ(ids.size(), 4u);
  EXPECT_EQ(c_.Cli({"ls", "-l", "family=slavic", "-o", "name"}).out, ids[0] + "\n" + ids[1] + "\n");
  EXPECT_EQ(c_.Cli({"ls", "-l", "family in (slavic,baltic),size!=big", "-o", "name"}).out,
            ids[1] + "\n" + ids[2] + "\n");
  EXPECT_EQ(c_.Cli({"ls", "-l", "!size", "-o", "jsonpath={.items[*].name}"}).out, "es\n");
  EXPECT_EQ(c_.Cli({"ls", "-l", "family=baltic", "-o",
                    "jsonpath={range .items[*]}{.name}={.labels.size}{\"\\n\"}{end}"})
                .out,
            "lt=small\n\n");
  EXPECT_EQ(c_.Cli({"get", ids[3], "-o", "jsonpath={.state}"}).out, "QUEUED\n");
  auto plain = c_.Cli({"ls"}).out;
  auto headless = c_.Cli({"ls", "--no-headers"}).out;
  EXPECT_EQ(Lines(plain).size(), 5u) << plain;
  EXPECT_EQ(Lines(headless).size(), 4u) << headless;
  EXPECT_EQ(Lines(plain)[0].rfind("ID", 0), 0u);
  EXPECT_NE(headless.find(ids[0]), std::string::npos);

  // Bulk cancel: stdin is not a terminal here, so --yes is required.
  auto refused = c_.Cli({"cancel", "-l", "family=slavic"});
  EXPECT_EQ(refused.exit_code, 2);
  EXPECT_NE(refused.err.find("refusing to cancel 2 jobs without --yes"), std::string::npos)
      << refused.err;
  EXPECT_EQ(c_.State(ids[0]), "QUEUED");
  auto cancel = c_.Cli({"cancel", "-l", "family=slavic", "--yes"});
  EXPECT_EQ(cancel.exit_code, 0) << cancel.err;
  EXPECT_EQ(LineSet(cancel.out),
            (std::set<std::string>{ids[0] + " CANCELLED", ids[1] + " CANCELLED"}));
  EXPECT_EQ(c_.State(ids[2]), "QUEUED");
  auto retry = c_.Cli({"retry", "-l", "size=big", "--yes", "-o", "name"});
  EXPECT_EQ(retry.exit_code, 0) << retry.err;
  EXPECT_EQ(retry.out, ids[0] + "\n");
  EXPECT_EQ(c_.State(ids[0]), "QUEUED");
  EXPECT_EQ(c_.Cli({"cancel", "--all", "--yes"}).exit_code, 0);
  for (const auto& id : ids) EXPECT_EQ(c_.State(id), "CANCELLED");
  auto nothing = c_.Cli({"cancel", "--all", "--yes"});
  EXPECT_EQ(nothing.exit_code, 0);
  EXPECT_NE(nothing.err.find("nothing to cancel"), std::string::npos) << nothing.err;
  EXPECT_EQ(c_.Cli({"cancel"}).exit_code, 2);  // neither ids nor a selection
}

TEST_F(CliJobsTest, GetShowsEveryAttempt) {
  auto ids = c_.Submit(
      Sh("flaky", "exit 4", "max_attempts: 2\nbackoff: {initial_ms: 100, multiplier: 1}\n"));
  ASSERT_EQ(c_.WaitFor(ids[0], {"FAILED"}), "FAILED");
  auto job = c_.Get(ids[0]);
  ASSERT_EQ(job["history"].size(), 2u) << job.dump();
  for (int i = 0; i < 2; ++i) {
    const auto& a = job["history"][i];
    EXPECT_EQ(a["number"], i + 1);
    EXPECT_EQ(a["id"], ids[0] + "." + std::to_string(i + 1));
    EXPECT_EQ(a["workers"], nlohmann::json::array({"w0"}));
    EXPECT_GT(a["finished_ms"].get<int64_t>(), 0);
    EXPECT_NE(a["result"].get<std::string>().find("4"), std::string::npos) << a.dump();
  }
  // Kept across a restart of the coordinator, and shown as a table.
  c_.KillCoordinator(SIGTERM);
  c_.StartCoordinator();
  EXPECT_EQ(c_.Get(ids[0])["history"].size(), 2u);
  auto text = c_.Cli({"get", ids[0]}).out;
  EXPECT_NE(text.find("ATTEMPT"), std::string::npos) << text;
  EXPECT_NE(text.find("PREEMPTED-BY"), std::string::npos) << text;
}

TEST_F(CliJobsTest, GcJobsArchivesAndForgetsOnlyWhatMayGo) {
  auto ids = c_.Submit(
      "name: up\nnoop: {}\n---\n"
      "name: down\nnoop: {}\nresources: {gpus: 8}\ndepends_on: [up]\n---\n"  // stays QUEUED
      "name: lone\nnoop: {}\n---\n"
      "name: broken\nnoop: {exit_code: 3}\nmax_attempts: 1\n");
  ASSERT_EQ(ids.size(), 4u);
  const std::string& up = ids[0];
  const std::string& down = ids[1];
  const std::string& lone = ids[2];
  const std::string& broken = ids[3];
  ASSERT_EQ(c_.WaitFor(up, {"SUCCEEDED"}), "SUCCEEDED");
  ASSERT_EQ(c_.WaitFor(lone, {"SUCCEEDED"}), "SUCCEEDED");
  ASSERT_EQ(c_.WaitFor(broken, {"FAILED"}), "FAILED");
  ASSERT_EQ(c_.WaitFor(down, {"QUEUED"}), "QUEUED");
  std::this_thread::sleep_for(std::chrono::milliseconds(50));

  // A dry run: `up` stays (the queued `down` depends on it), `down` is not finished.
  auto dry = c_.Cli({"gc", "jobs", "--older-than", "1ms", "-o", "name"});
  ASSERT_EQ(dry.exit_code, 0) << dry.err;
  EXPECT_EQ(dry.out, lone + "\n" + broken + "\n");
  EXPECT_EQ(c_.Cli({"gc", "jobs", "--older-than", "1ms", "--state", "failed", "-o", "name"}).out,
            broken + "\n");
  EXPECT_EQ(c_.Cli({"gc", "jobs", "--older-than", "30d", "-o", "name"}).out, "");
  EXPECT_EQ(c_.Cli({"gc", "jobs", "--older-than", "1ms", "--state", "running"}).exit_code, 2);
  EXPECT_EQ(Lines(c_.Cli({"ls", "--no-headers"}).out).size(), 4u);

  auto apply = c_.Cli({"gc", "jobs", "--older-than", "1ms", "--apply"});
  ASSERT_EQ(apply.exit_code, 0) << apply.err;
  EXPECT_NE(apply.out.find("archived 2 jobs"), std::string::npos) << apply.out;
  EXPECT_EQ(LineSet(c_.Cli({"ls", "-o", "name"}).out), (std::set<std::string>{up, down}));
  EXPECT_EQ(LineSet(c_.Cli({"ls", "--archived", "-o", "name"}).out),
            (std::set<std::string>{up, down, lone, broken}));
  EXPECT_EQ(c_.Get(lone)["archived"], true);

  // Forgetting: `lone` and `broken` go, `up` still stays for `down`; ids are never reused.
  auto forget = c_.Cli({"gc", "jobs", "--older-than", "1ms", "--delete", "--apply", "-o", "name"});
  ASSERT_EQ(forget.exit_code, 0) << forget.err;
  EXPECT_EQ(forget.out, lone + "\n" + broken + "\n");
  EXPECT_EQ(c_.Cli({"get", lone}).exit_code, 3);
  c_.KillCoordinator(SIGTERM);
  c_.StartCoordinator();
  EXPECT_EQ(c_.Cli({"get", broken}).exit_code, 3);
  EXPECT_EQ(c_.State(up), "SUCCEEDED");
  auto next = c_.Submit("noop: {}\n");
  EXPECT_GT(std::stoi(next[0].substr(2)), std::stoi(broken.substr(2)));
}

TEST(CliGcOwnership, AUsersGcJobsSeesOnlyItsOwnJobs) {
  Cluster c;
  c.EnableTokens();
  c.StartCoordinator();
  c.StartWorker("w0");
  c.WaitForWorkers(1);
  const std::string alice = c.CreateToken("user", "alice");
  const std::string bob = c.CreateToken("user", "bob");
  ASSERT_TRUE(c.WaitUntil([&] { return c.CliAs(bob, {"ls"}).exit_code == 0; }, 20));  // reloaded
  const std::string file = c.WriteFile("quick.yaml", "noop: {}\n");
  auto a = c.CliAs(alice, {"submit", "-f", file, "-o", "json"});
  auto b = c.CliAs(bob, {"submit", "-f", file, "-o", "json"});
  ASSERT_EQ(a.exit_code, 0) << a.err;
  ASSERT_EQ(b.exit_code, 0) << b.err;
  const std::string alices = a.Json()["job_ids"][0];
  const std::string bobs = b.Json()["job_ids"][0];
  ASSERT_EQ(c.WaitFor(alices, {"SUCCEEDED"}), "SUCCEEDED");
  ASSERT_EQ(c.WaitFor(bobs, {"SUCCEEDED"}), "SUCCEEDED");
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(c.CliAs(bob, {"gc", "jobs", "--older-than", "1ms", "-o", "name"}).out, bobs + "\n");
  EXPECT_EQ(c.CliAs(bob, {"ls", "--owner", "alice", "-o", "name"}).out, alices + "\n");
  auto applied = c.CliAs(bob, {"gc", "jobs", "--older-than", "1ms", "--apply", "-o", "name"});
  EXPECT_EQ(applied.out, bobs + "\n") << applied.err;
  EXPECT_EQ(c.Get(alices)["archived"], false);
  // An admin's sees everyone's.
  EXPECT_EQ(c.Cli({"gc", "jobs", "--older-than", "1ms", "-o", "name"}).out, alices + "\n");
}

TEST_F(CliJobsTest, LogsTailSinceAndTimestamps) {
  auto ids = c_.Submit(
      Sh("talker", "for i in 1 2 3 4 5; do echo line$i; done; sleep 4; echo late; echo last"));
  ASSERT_EQ(c_.WaitFor(ids[0], {"SUCCEEDED"}), "SUCCEEDED");
  ASSERT_TRUE(c_.WaitUntil(
      [&] {
        return c_.Cli({"logs", ids[0]}).out.find("last") != std::string::npos;
      },
      20));
  EXPECT_EQ(c_.Cli({"logs", ids[0], "--tail", "3"}).out, "line5\nlate\nlast\n");
  EXPECT_EQ(c_.Cli({"logs", ids[0], "--tail", "100"}).out,
            "line1\nline2\nline3\nline4\nline5\nlate\nlast\n");
  auto stamped = c_.Cli({"logs", ids[0], "--timestamps"});
  ASSERT_EQ(stamped.exit_code, 0) << stamped.err;
  const std::regex line(R"((\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z) (\S+))");
  std::map<std::string, std::string> when;  // text -> its time
  for (const std::string& l : Lines(stamped.out)) {
    std::smatch m;
    ASSERT_TRUE(std::regex_match(l, m, line)) << l;
    when[m[2]] = m[1];
  }
  ASSERT_EQ(when.size(), 7u) << stamped.out;
  // --since: what arrived after the 4 s pause only.
  auto to_ms = [](const std::string& stamp) {
    std::tm tm{};
    std::istringstream in(stamp.substr(0, 19));
    in >> std::get_time(&tm, "%Y-%m-%dT%H:%M:%S");
    return static_cast<int64_t>(timegm(&tm)) * 1000 + std::stoi(stamp.substr(20, 3));
  };
  const int64_t late = to_ms(when["late"]);
  ASSERT_GE(late - to_ms(when["line5"]), 3000) << stamped.out;
  const int64_t since_ms = NowMs() - late + 2000;  // reaches back to 2 s before "late"
  auto since = c_.Cli({"logs", ids[0], "--since", std::to_string(since_ms) + "ms"});
  EXPECT_EQ(since.out, "late\nlast\n") << since.err;
  EXPECT_EQ(c_.Cli({"logs", ids[0], "--since", "1h", "--tail", "1"}).out, "last\n");
  EXPECT_EQ(c_.Cli({"logs", ids[0], "--tail", "-3"}).exit_code, 2);
}

// `stemma watch` for people (issue 22 item 10): one line per state change; progress into a file
// or pipe at most once per job per --progress-every (every progress event with 0), and on a
// terminal rewritten in place on one line. Three watches of one job that reports progress
// thirty times, started before it runs (it waits for a gate), see the same state changes.
TEST(CliWatch, ALinePerStateChangeWithProgressThrottledOrInPlace) {
  if (RunShell("command -v script").empty()) GTEST_SKIP() << "no script(1) for a terminal";
  Cluster c;
  c.StartCoordinator();
  c.StartWorker("w0");
  c.WaitForWorkers(1);
  const std::string go = c.dir() + "/go";
  auto ids = c.Submit(
      Sh("gate", "while [ ! -e " + go + " ]; do sleep 0.05; done") + "---\n" +
      Sh("ticker",
         R"(i=1; while [ $i -le 30 ]; do echo "STEMMA_PROGRESS {\"step\": $i, \"message\": \"tick\"}"; sleep 0.1; i=$((i+1)); done)",
         "depends_on: [gate]\n"));
  ASSERT_EQ(ids.size(), 2u);
  const std::string& id = ids[1];
  const std::string watch = c.CliCommand() + " watch " + id + " --timeout 120";
  const std::string pipe = c.dir() + "/pipe.out", every = c.dir() + "/every.out",
                    tty = c.dir() + "/tty.out";
  // In the background, holding no end of RunShell's pipe.
  RunShell("(" + watch + " > " + pipe + " 2>&1; echo $? > " + pipe + ".rc) > /dev/null 2>&1 & (" +
           watch + " --progress-every 0 > " + every + " 2>&1; echo $? > " + every +
           ".rc) > /dev/null 2>&1 & (script -qfec '" + watch + "' /dev/null > " + tty +
           " 2>&1; echo $? > " + tty + ".rc) > /dev/null 2>&1 < /dev/null &");
  // Each has its first line (the job as it is now) before the job may start.
  ASSERT_TRUE(c.WaitUntil(
      [&] {
        return !Cluster::ReadFile(pipe).empty() && !Cluster::ReadFile(every).empty() &&
               Cluster::ReadFile(tty).find('\n') != std::string::npos;
      },
      30));
  c.WriteFile("go", "");
  for (const std::string& f : {pipe, every, tty}) {
    ASSERT_TRUE(c.WaitUntil([&] { return std::filesystem::exists(f + ".rc"); }, 90)) << f;
    EXPECT_EQ(Cluster::ReadFile(f + ".rc"), "0\n") << Cluster::ReadFile(f);
  }
  // Lines of a file or pipe: state changes ("A -> B") and progress lines.
  auto split = [&](const std::string& text, std::vector<std::string>* changes, int* progress) {
    *progress = 0;
    for (const std::string& line : Lines(text)) {
      EXPECT_NE(line.find(" " + id + " ticker "), std::string::npos) << line;
      const size_t arrow = line.find(" -> ");
      if (arrow == std::string::npos) {
        EXPECT_NE(line.find(" RUNNING "), std::string::npos) << line;
        ++*progress;
        continue;
      }
      const size_t from = line.rfind(' ', arrow - 1);
      changes->push_back(line.substr(from + 1));  // "RUNNING -> SUCCEEDED"
    }
  };
  std::vector<std::string> pipe_changes, every_changes;
  int pipe_progress = 0, every_progress = 0;
  const std::string pipe_text = Cluster::ReadFile(pipe), every_text = Cluster::ReadFile(every);
  split(pipe_text, &pipe_changes, &pipe_progress);
  split(every_text, &every_changes, &every_progress);
  ASSERT_GE(pipe_changes.size(), 3u) << pipe_text;  // as it was, RUNNING, SUCCEEDED at least
  EXPECT_TRUE(absl::StartsWith(pipe_changes.back(), "RUNNING -> SUCCEEDED")) << pipe_text;
  EXPECT_EQ(every_changes, pipe_changes) << every_text;
  EXPECT_GE(every_progress, 2) << "progress events reached the watch\n" << every_text;
  EXPECT_EQ(pipe_progress, 1) << "the first progress line, then none within 30 s\n" << pipe_text;
  EXPECT_EQ(Lines(pipe_text).size(), pipe_changes.size() + 1) << pipe_text;

  // On a terminal: a line (\r\n through the pty) per state change, progress rewritten in place
  // (a carriage return without a newline) and cleared before the next state change.
  const std::string screen = Cluster::ReadFile(tty);
  EXPECT_EQ(std::count(screen.begin(), screen.end(), '\n'),
            static_cast<std::ptrdiff_t>(pipe_changes.size()))
      << screen;
  int in_place = 0;
  for (size_t i = 0; i + 1 < screen.size(); ++i) {
    if (screen[i] == '\r' && screen[i + 1] != '\n') ++in_place;
  }
  EXPECT_GE(in_place, 2) << screen;
  EXPECT_NE(screen.find("step "), std::string::npos) << screen;
}

}  // namespace
}  // namespace stemma::testing
