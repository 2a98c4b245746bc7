// Several researchers on one cluster (issue 25, docs/tenancy.md): a coordinator with TLS,
// tokens and a projects file, a worker that runs a stand-in engine and exec jobs, and users
// bob, carol, dave (bob's project) and rita (read-only) who try to read, overwrite, take
// over or delete each other's work through the CLI.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "tests/integration/cluster.h"

namespace stemma::testing {
namespace {

namespace fs = std::filesystem;

// A stand-in for stemma-engine: publishes `out` (a directory with a stemma.json that names
// the command and the spec's seed) after FAKE_SLEEP seconds and reports it.
constexpr const char* kFakeEngine = R"SH(#!/bin/bash
cmd=$1; spec=$3
out=$(grep -o '"out": *"[^"]*"' "$spec" | head -1 | sed 's/.*: *"\(.*\)"/\1/')
case "$out" in /*) ;; *) out="$STEMMA_STORAGE_ROOT/$out" ;; esac
seed=$(grep -o '"seed": *"*[0-9]*' "$spec" | head -1 | sed 's/[^0-9]//g')
mkdir -p "$out"
echo "{\"producer\": {\"command\": \"$cmd\", \"seed\": \"$seed\"}}" > "$out/stemma.json"
echo "{\"event\":\"output\",\"name\":\"model\",\"path\":\"$out\",\"type\":\"checkpoint\"}"
exit 0
)SH";

// A tokenize job that replaces `out` (the stand-in engine writes it whatever the inputs).
std::string Tokenize(const std::string& out) {
  return "tokenize: {tokenizer: t, input: [x.txt], format: text, language: en, out: " + out +
         ", overwrite: true}\n";
}

std::string FirstWord(const std::string& out) { return out.substr(0, out.find_first_of(" \n")); }

class Tenancy : public ::testing::Test {
 protected:
  void SetUp() override {
    c_.EnableTls();
    c_.EnableTokens();
    const std::string projects =
        c_.WriteFile("projects.txt", "# project members\nvision bob dave\n");
    c_.StartCoordinator({"--projects", projects});
    bob_ = c_.CreateToken("user", "bob");
    carol_ = c_.CreateToken("user", "carol");
    dave_ = c_.CreateToken("user", "dave");
    rita_ = c_.CreateToken("read-only", "rita");
    root_ = c_.dir() + "/store";
    fs::create_directories(root_);
    const std::string engine = c_.WriteFile("fake-engine", kFakeEngine);
    ::chmod(engine.c_str(), 0755);
    Cluster::WorkerOptions w;
    w.cpus = 4;
    w.extra = {"--storage-root", root_, "--engine", engine};
    c_.StartWorker("w1", w);
    c_.WaitForWorkers(1);
    std::this_thread::sleep_for(std::chrono::milliseconds(1100));  // token file reload
  }

  // Submits `yaml` as the holder of `token`; the first job's id ("" and a failure if refused).
  std::string SubmitAs(const std::string& token, const std::string& yaml) {
    CliResult r = c_.CliAs(token, {"submit", "-f", c_.WriteFile("job.yaml", yaml)});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return r.exit_code == 0 ? FirstWord(r.out) : "";
  }
  nlohmann::json GetAs(const std::string& token, const std::string& id) {
    CliResult r = c_.CliAs(token, {"get", id, "-o", "json"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return r.Json();
  }
  // The artifact a succeeded job registered (its first).
  nlohmann::json ArtifactOf(const std::string& job) {
    CliResult r = c_.Cli({"ckpt", "ls", "--job", job, "-o", "json"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    nlohmann::json list = r.Json();
    EXPECT_FALSE(list.empty()) << "job " << job << " registered nothing";
    return list.empty() ? nlohmann::json::object() : list[0];
  }

  Cluster c_;
  std::string bob_, carol_, dave_, rita_, root_;
};

// Every job and artifact records who submitted it; `get` and `ckpt show` say so, also after a
// restart of the coordinator.
TEST_F(Tenancy, OwnersAreRecordedShownAndDurable) {
  const std::string job = SubmitAs(bob_, "name: base\ninit: {out: bob/base}\n");
  ASSERT_EQ(c_.WaitFor(job, {"SUCCEEDED", "FAILED"}), "SUCCEEDED") << c_.Get(job).dump();
  EXPECT_EQ(GetAs(bob_, job).value("owner", ""), "bob");
  const std::string artifact = ArtifactOf(job).value("id", "");
  CliResult show = c_.CliAs(carol_, {"ckpt", "show", artifact});
  ASSERT_EQ(show.exit_code, 0) << show.err;
  EXPECT_NE(show.out.find("owner:"), std::string::npos) << show.out;
  EXPECT_NE(show.out.find("bob"), std::string::npos) << show.out;
  c_.KillCoordinator(SIGKILL);
  const std::string projects = c_.dir() + "/projects.txt";
  c_.StartCoordinator({"--projects", projects});
  EXPECT_EQ(GetAs(carol_, job).value("owner", ""), "bob");
  EXPECT_EQ(ArtifactOf(job).value("owner", ""), "bob");
  CliResult text = c_.CliAs(bob_, {"get", job});
  EXPECT_NE(text.out.find("bob"), std::string::npos) << text.out;
}

// High #4: carol's `out: bob/base, overwrite: true` is refused at submit; bob's model stays.
// Within a project (dave is in bob's project vision) the project prefix is shared.
TEST_F(Tenancy, NobodyWritesBelowAnotherUsersPrefix) {
  const std::string job = SubmitAs(bob_, "name: base\ninit: {out: bob/base, seed: 1}\n");
  ASSERT_EQ(c_.WaitFor(job, {"SUCCEEDED", "FAILED"}), "SUCCEEDED");
  const std::string before = Cluster::ReadFile(root_ + "/bob/base/stemma.json");
  CliResult r = c_.CliAs(
      carol_, {"submit", "-f", c_.WriteFile("evil.yaml", "name: evil\n" + Tokenize("bob/base"))});
  EXPECT_NE(r.exit_code, 0) << r.out;
  EXPECT_NE(r.err.find("tokenize.out: bob/base is not below carol's storage"), std::string::npos)
      << r.err;
  // The same with '..' from carol's own prefix.
  r = c_.CliAs(carol_,
               {"submit", "-f",
                c_.WriteFile("evil2.yaml", "name: evil2\ninit: {out: carol/../bob/base2}\n")});
  EXPECT_NE(r.exit_code, 0) << r.out;
  EXPECT_EQ(Cluster::ReadFile(root_ + "/bob/base/stemma.json"), before);
  // dave shares bob's project prefix, not bob's own.
  const std::string shared = SubmitAs(dave_, "name: shared\ninit: {out: projects/vision/shared}\n");
  EXPECT_EQ(c_.WaitFor(shared, {"SUCCEEDED", "FAILED"}), "SUCCEEDED");
  r = c_.CliAs(dave_, {"submit", "-f", c_.WriteFile("d.yaml", "name: d\ninit: {out: bob/d}\n")});
  EXPECT_NE(r.exit_code, 0);
}

constexpr const char* kBobStudy = R"(name: bob-study
stages:
  long:
    noop: {duration_ms: 60000}
  base:
    init: {seed: 5}
)";

// High #6 and the plan oracle: carol's sweep of a file named bob-study is carol's own
// experiment (revision 1); bob's running job is not superseded, and carol's plan says nothing
// about bob's cells.
TEST_F(Tenancy, ExperimentNamesArePerNamespace) {
  CliResult bob =
      c_.CliAs(bob_, {"sweep", "-f", c_.WriteFile("bob.yaml", kBobStudy), "-o", "json"});
  ASSERT_EQ(bob.exit_code, 0) << bob.err;
  std::string long_job;
  const nlohmann::json swept = bob.Json();
  for (const auto& cell : swept["cells"]) {
    if (cell.value("job_name", "") == "long") long_job = cell.value("job_id", "");
  }
  ASSERT_FALSE(long_job.empty()) << bob.out;
  ASSERT_EQ(c_.WaitFor(long_job, {"RUNNING"}), "RUNNING");
  // The plan of the very same file from carol: a new experiment, nothing cached.
  CliResult plan = c_.CliAs(carol_, {"plan", "-f", c_.WriteFile("carol.yaml", kBobStudy)});
  ASSERT_EQ(plan.exit_code, 0) << plan.err;
  EXPECT_EQ(plan.out.find("cached"), std::string::npos) << plan.out;
  CliResult carol =
      c_.CliAs(carol_, {"sweep", "-f", c_.WriteFile("carol.yaml", kBobStudy), "-o", "json"});
  ASSERT_EQ(carol.exit_code, 0) << carol.err;
  EXPECT_EQ(carol.Json()["experiment"].value("revision", 0), 1) << carol.out;
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_EQ(c_.State(long_job), "RUNNING") << c_.Get(long_job).dump();
  // Each sees its own under the name; default outputs live under each owner's prefix.
  CliResult show = c_.CliAs(bob_, {"exp", "get", "bob-study", "-o", "json"});
  ASSERT_EQ(show.exit_code, 0) << show.err;
  EXPECT_EQ(show.Json()["experiment"].value("revision", 0), 1);
  // Another namespace, named: carol reads bob's (his project's) experiment with -n.
  CliResult across =
      c_.CliAs(carol_, {"exp", "get", "bob-study", "-n", "projects/vision", "-o", "json"});
  ASSERT_EQ(across.exit_code, 0) << across.err;
  const nlohmann::json across_json = across.Json();
  bool bobs = false;
  for (const auto& cell : across_json["cells"]) bobs |= cell.value("job_id", "") == long_job;
  EXPECT_TRUE(bobs) << across.out;
  for (const auto& [who, token] : {std::pair{"bob", bob_}, std::pair{"carol", carol_}}) {
    const nlohmann::json cells =
        c_.CliAs(token, {"exp", "get", "bob-study", "-o", "json"}).Json()["cells"];
    for (const auto& cell : cells) {
      if (cell.value("job_name", "") != "base") continue;
      const std::string id = cell.value("job_id", "");
      ASSERT_EQ(c_.WaitFor(id, {"SUCCEEDED", "FAILED"}), "SUCCEEDED") << c_.Get(id).dump();
      const std::string out = c_.Get(id)["outputs"].value("model", "");
      EXPECT_EQ(out.rfind(root_ + "/" + who + "/experiments/bob-study/", 0), 0u) << out;
    }
  }
}

// A matrix value with '..' cannot steer carol's default outputs into bob's directory.
TEST_F(Tenancy, MatrixValuesCannotSteerDefaultOutputsAcrossUsers) {
  CliResult r = c_.CliAs(
      carol_, {"sweep", "-f",
               c_.WriteFile("m.yaml",
                            "name: m\nstages:\n  s:\n    matrix: {y: ['y/../../../../bob/x']}\n"
                            "    init: {seed: 1}\n"),
               "-o", "json"});
  if (r.exit_code == 0) {
    const std::string id = r.Json()["cells"][0].value("job_id", "");
    ASSERT_EQ(c_.WaitFor(id, {"SUCCEEDED", "FAILED"}), "SUCCEEDED");
    const std::string out = c_.Get(id)["outputs"].value("model", "");
    EXPECT_EQ(fs::path(out).lexically_normal().string().rfind(root_ + "/carol/", 0), 0u) << out;
  }
  EXPECT_FALSE(fs::exists(root_ + "/bob/x")) << r.out << r.err;
}

// High #2: `ckpt show` (GetArtifact) shows the producing exec job's env to its owner and
// admins only.
TEST_F(Tenancy, ArtifactReadersSeeTheProducersEnvRedacted) {
  const std::string dir = root_ + "/bob/exec-out";
  const std::string job = SubmitAs(
      bob_, "name: secret\nexec:\n  argv: [/bin/sh, -c, 'mkdir -p " + dir + " && echo {} > " + dir +
                "/stemma.json && echo \"{\\\"event\\\":\\\"output\\\","
                "\\\"name\\\":\\\"model\\\",\\\"path\\\":\\\"" +
                dir +
                "\\\",\\\"type\\\":\\\"checkpoint\\\"}\"']\n  env: {HF_TOKEN: hf_secret_1}\n");
  ASSERT_EQ(c_.WaitFor(job, {"SUCCEEDED", "FAILED"}), "SUCCEEDED") << c_.Get(job).dump();
  const std::string artifact = ArtifactOf(job).value("id", "");
  ASSERT_FALSE(artifact.empty());
  for (const std::string& token : {rita_, carol_}) {
    CliResult r = c_.CliAs(token, {"ckpt", "show", artifact, "-o", "json"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out.find("hf_secret_1"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("<redacted>"), std::string::npos) << r.out;
  }
  for (const std::string& token : {bob_, c_.admin_token()}) {
    CliResult r = c_.CliAs(token, {"ckpt", "show", artifact, "-o", "json"});
    EXPECT_NE(r.out.find("hf_secret_1"), std::string::npos) << r.out;
  }
}

// High #3: an exec job that reports an output outside the storage root does not register it
// and fails; an admin's gc then has nothing of it to delete.
TEST_F(Tenancy, OutputsOutsideTheRootAreRefusedAndNeverCollected) {
  const std::string outside = c_.dir() + "/outside";
  fs::create_directories(outside);
  std::ofstream(outside + "/precious") << "keep me\n";
  const std::string job =
      SubmitAs(bob_,
               "name: escape\nexec:\n  argv: [/bin/sh, -c, 'echo \"{\\\"event\\\":\\\"output\\\","
               "\\\"name\\\":\\\"model\\\",\\\"path\\\":\\\"" +
                   outside + "\\\",\\\"type\\\":\\\"checkpoint\\\"}\"']\n");
  EXPECT_EQ(c_.WaitFor(job, {"SUCCEEDED", "FAILED"}), "FAILED");
  EXPECT_NE(c_.Get(job).value("reason", "").find("outside the storage root"), std::string::npos)
      << c_.Get(job).dump();
  // Inside the root but in carol's prefix: refused too.
  fs::create_directories(root_ + "/carol/m");
  const std::string across =
      SubmitAs(bob_,
               "name: across\nexec:\n  argv: [/bin/sh, -c, 'echo \"{\\\"event\\\":\\\"output\\\","
               "\\\"name\\\":\\\"model\\\",\\\"path\\\":\\\"" +
                   root_ + "/carol/m\\\",\\\"type\\\":\\\"checkpoint\\\"}\"']\n");
  EXPECT_EQ(c_.WaitFor(across, {"SUCCEEDED", "FAILED"}), "FAILED");
  CliResult gc = c_.Cli({"ckpt", "gc", "--keep-latest", "1", "--apply"});
  EXPECT_EQ(gc.exit_code, 0) << gc.err;
  EXPECT_TRUE(fs::exists(outside + "/precious"));
  EXPECT_TRUE(fs::exists(root_ + "/carol/m"));
}

// Low: pin and unpin are the owner's (and the owner's project's and admins').
TEST_F(Tenancy, OnlyTheOwnerSidePinsAndUnpins) {
  const std::string job = SubmitAs(bob_, "name: base\ninit: {out: bob/base}\n");
  ASSERT_EQ(c_.WaitFor(job, {"SUCCEEDED", "FAILED"}), "SUCCEEDED");
  const std::string artifact = ArtifactOf(job).value("id", "");
  ASSERT_EQ(c_.CliAs(bob_, {"ckpt", "pin", artifact}).exit_code, 0);
  CliResult r = c_.CliAs(carol_, {"ckpt", "unpin", artifact});
  EXPECT_NE(r.exit_code, 0) << r.out;
  EXPECT_NE(r.err.find("belongs to bob"), std::string::npos) << r.err;
  EXPECT_TRUE(ArtifactOf(job).value("pinned", false));
  EXPECT_EQ(c_.CliAs(dave_, {"ckpt", "unpin", artifact}).exit_code, 0);  // bob's project
  EXPECT_EQ(c_.Cli({"ckpt", "pin", artifact}).exit_code, 0);             // an admin
}

// Medium #7: a job that has not ended and reads a checkpoint by a path relative to the
// storage root (and through '..') keeps it from an admin's gc.
TEST_F(Tenancy, GcKeepsWhatALiveJobReadsByAnySpelling) {
  const std::string m1 = SubmitAs(bob_, "name: m1\ninit: {out: bob/m1}\n");
  ASSERT_EQ(c_.WaitFor(m1, {"SUCCEEDED", "FAILED"}), "SUCCEEDED");
  const std::string m2 = SubmitAs(bob_, "name: m2\ninit: {out: bob/m2}\n");
  ASSERT_EQ(c_.WaitFor(m2, {"SUCCEEDED", "FAILED"}), "SUCCEEDED");
  // A merge that waits for a long job reads bob/m1 relatively (and through '..').
  const std::string wait = SubmitAs(bob_, "name: hold\nnoop: {duration_ms: 60000}\n");
  SubmitAs(bob_, "name: reader\ndepends_on: [" + wait +
                     "]\nmerge: {method: linear, models: [{path: bob/x/../m1}, {path: bob/m2}], "
                     "out: bob/soup}\n");
  CliResult gc = c_.Cli({"ckpt", "gc", "--keep-latest", "1", "--apply"});
  EXPECT_EQ(gc.exit_code, 0) << gc.err;
  EXPECT_TRUE(fs::exists(root_ + "/bob/m1")) << gc.out;
}

// High #5: the cache serves content the requester may read, not names. bob's init is not
// served from carol's identical one; carol's own is served while the files are as registered,
// and not once they were replaced (overwrite) or changed in place.
TEST_F(Tenancy, TheCacheServesOnlyUnchangedContentOfTheSameOwner) {
  auto run = [&](const std::string& token, const std::string& yaml) {
    const std::string id = SubmitAs(token, yaml);
    EXPECT_EQ(c_.WaitFor(id, {"SUCCEEDED", "FAILED"}), "SUCCEEDED") << c_.Get(id).dump();
    return c_.Get(id).value("reason", "");
  };
  EXPECT_EQ(run(carol_, "name: s5\ninit: {seed: 5, out: carol/s5}\n"), "");
  EXPECT_NE(run(carol_, "name: s5b\ninit: {seed: 5, out: carol/s5b}\n").find("memoized"),
            std::string::npos);
  run(carol_, "name: over\n" + Tokenize("carol/s5"));
  EXPECT_EQ(run(carol_, "name: s5c\ninit: {seed: 5, out: carol/s5c}\n"), "")
      << "served from a replaced checkpoint";
  EXPECT_EQ(run(bob_, "name: s5\ninit: {seed: 5, out: bob/s5}\n"), "") << "served across users";
  // Changed in place by a job that does not register it.
  EXPECT_EQ(run(carol_, "name: s7\ninit: {seed: 7, out: carol/s7}\n"), "");
  run(carol_, "name: poison\nexec: {argv: [/bin/sh, -c, 'echo poisoned >> " + root_ +
                  "/carol/s7/stemma.json']}\n");
  EXPECT_EQ(run(carol_, "name: s7b\ninit: {seed: 7, out: carol/s7b}\n"), "")
      << "served from files changed since registration";
}

// A user's gc plans and deletes only what the user may manage: carol's `ckpt gc` removes her
// own older checkpoint and none of bob's; dave (bob's project) collects bob's; a pinned one
// stays. (Before, gc was an admin's only: PERMISSION_DENIED.)
TEST_F(Tenancy, UsersCollectTheirOwnAndTheirProjectsGarbageOnly) {
  auto run = [&](const std::string& token, const std::string& yaml) {
    const std::string id = SubmitAs(token, yaml);
    EXPECT_EQ(c_.WaitFor(id, {"SUCCEEDED", "FAILED"}), "SUCCEEDED") << c_.Get(id).dump();
    return id;
  };
  run(bob_, "name: m1\ninit: {seed: 21, out: bob/m1}\n");
  const std::string pinned = run(bob_, "name: m2\ninit: {seed: 22, out: bob/m2}\n");
  run(bob_, "name: m3\ninit: {seed: 23, out: bob/m3}\n");
  run(carol_, "name: c1\ninit: {seed: 31, out: carol/c1}\n");
  run(carol_, "name: c2\ninit: {seed: 32, out: carol/c2}\n");
  ASSERT_EQ(c_.CliAs(bob_, {"ckpt", "pin", ArtifactOf(pinned).value("id", "")}).exit_code, 0);

  CliResult mine = c_.CliAs(carol_, {"ckpt", "gc", "--keep-latest", "1", "--apply"});
  ASSERT_EQ(mine.exit_code, 0) << mine.err;
  EXPECT_FALSE(fs::exists(root_ + "/carol/c1")) << mine.out;
  EXPECT_TRUE(fs::exists(root_ + "/carol/c2")) << mine.out;
  for (const char* m : {"m1", "m2", "m3"}) {
    EXPECT_TRUE(fs::exists(root_ + "/bob/" + m)) << m << ": " << mine.out;
  }
  EXPECT_EQ(mine.out.find("bob/"), std::string::npos) << "carol's plan lists bob's: " << mine.out;

  CliResult project = c_.CliAs(dave_, {"ckpt", "gc", "--keep-latest", "1", "--apply"});
  ASSERT_EQ(project.exit_code, 0) << project.err;
  EXPECT_FALSE(fs::exists(root_ + "/bob/m1")) << project.out;
  EXPECT_TRUE(fs::exists(root_ + "/bob/m2")) << "pinned: " << project.out;
  EXPECT_TRUE(fs::exists(root_ + "/bob/m3")) << project.out;
  EXPECT_TRUE(fs::exists(root_ + "/carol/c2")) << project.out;
  CliResult readonly = c_.CliAs(rita_, {"ckpt", "gc", "--keep-latest", "1"});
  EXPECT_NE(readonly.exit_code, 0) << readonly.out;
}

// A symbolic link that bob plants inside his own prefix (with an exec job) and that points
// into carol's: his engine job's output through it is refused before the engine runs, and
// nothing is written into carol/. An exec job's own writes go below bob/ only: into carol/
// (directly or through the link) the kernel refuses them (Landlock).
TEST_F(Tenancy, WritesStayBelowTheOwnersPrefixWhateverLinksAndExecJobsTry) {
  fs::create_directories(root_ + "/carol");
  const std::string plant =
      SubmitAs(bob_, "name: plant\nexec: {argv: [/bin/sh, -c, 'mkdir -p " + root_ +
                         "/bob && ln -s ../carol " + root_ + "/bob/link']}\n");
  ASSERT_EQ(c_.WaitFor(plant, {"SUCCEEDED", "FAILED"}), "SUCCEEDED") << c_.Get(plant).dump();
  ASSERT_TRUE(fs::is_symlink(root_ + "/bob/link"));
  const std::string through =
      SubmitAs(bob_, "name: through\ninit: {seed: 41, out: bob/link/base}\n");
  EXPECT_EQ(c_.WaitFor(through, {"SUCCEEDED", "FAILED"}), "FAILED");
  EXPECT_NE(c_.Get(through).value("reason", "").find("through a symbolic link"), std::string::npos)
      << c_.Get(through).dump();
  EXPECT_FALSE(fs::exists(root_ + "/carol/base"));
  const std::string writes =
      SubmitAs(bob_, "name: writes\nexec: {argv: [/bin/sh, -c, 'echo mine > " + root_ +
                         "/bob/own; echo evil > " + root_ + "/carol/evil; echo evil > " + root_ +
                         "/bob/link/evil2; true']}\n");
  ASSERT_EQ(c_.WaitFor(writes, {"SUCCEEDED", "FAILED"}), "SUCCEEDED") << c_.Get(writes).dump();
  EXPECT_TRUE(fs::exists(root_ + "/bob/own"));
  EXPECT_FALSE(fs::exists(root_ + "/carol/evil"));
  EXPECT_FALSE(fs::exists(root_ + "/carol/evil2"));
}

// Low: a newer job of another user with the same name does not take over `stemma wait NAME`.
TEST_F(Tenancy, WaitByNameIsTheCallersJob) {
  const std::string mine = SubmitAs(bob_, "name: train\nnoop: {duration_ms: 1500}\n");
  const std::string theirs =
      SubmitAs(carol_, "name: train\nnoop: {exit_code: 1}\nmax_attempts: 1\n");
  ASSERT_FALSE(mine.empty());
  ASSERT_FALSE(theirs.empty());
  CliResult r = c_.CliAs(bob_, {"wait", "train", "--timeout-s", "60"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(c_.State(mine), "SUCCEEDED");
  EXPECT_EQ(GetAs(bob_, "train").value("id", ""), mine);
}

// Low: a job whose `out` lies outside the storage root is never served from the cache as
// SUCCEEDED (without authentication too: there the worker refuses it when it runs).
TEST(TenancyOpen, AMemoizedJobWithItsOutOutsideTheRootIsNotServed) {
  Cluster c;
  c.StartCoordinator();
  const std::string root = c.dir() + "/store";
  fs::create_directories(root);
  const std::string engine = c.WriteFile("fake-engine", kFakeEngine);
  ::chmod(engine.c_str(), 0755);
  Cluster::WorkerOptions w;
  w.extra = {"--storage-root", root, "--engine", engine};
  c.StartWorker("w1", w);
  c.WaitForWorkers(1);
  const std::string first = c.Submit("name: m1\ninit: {seed: 3, out: m1}\n")[0];
  ASSERT_EQ(c.WaitFor(first, {"SUCCEEDED", "FAILED"}), "SUCCEEDED");
  const std::string outside = c.dir() + "/outside/m";
  const std::string second = c.Submit("name: m2\ninit: {seed: 3, out: " + outside + "}\n")[0];
  EXPECT_EQ(c.WaitFor(second, {"SUCCEEDED", "FAILED"}), "FAILED") << c.Get(second).dump();
  const std::string third = c.Submit("name: m3\ninit: {seed: 3, out: m3}\n")[0];
  EXPECT_EQ(c.WaitFor(third, {"SUCCEEDED", "FAILED"}), "SUCCEEDED");
  EXPECT_NE(c.Get(third).value("reason", "").find("memoized from " + first), std::string::npos)
      << c.Get(third).dump();
}

}  // namespace
}  // namespace stemma::testing
