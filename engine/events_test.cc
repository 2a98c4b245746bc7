// engine/events.h: lines start with "event" and read back as the same v1::EngineEvent
// through the schema's reader; the output event carries what the registry needs (type,
// manifest sha256, bytes, parents, operation) read from the published result.
#include "engine/events.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>

#include "common/engine_events.h"
#include "engine/io/fs.h"
#include "engine/io/manifest.h"
#include "engine/io/sha256.h"

namespace stemma::engine {
namespace {

namespace fs = std::filesystem;

std::string Capture(const std::function<void(const EventWriter&)>& body) {
  std::FILE* f = std::tmpfile();
  body(EventWriter(true, f));
  std::fflush(f);
  std::rewind(f);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) out.append(buf, n);
  std::fclose(f);
  return out;
}

TEST(EventWriterTest, EventIsTheFirstKeyOfEveryLine) {
  v1::EngineEvent metric = MetricEvent("ppl/sw", 2.5, 7, {{"language", "sw"}});
  AddDetails({{"alpha", 1}}, &metric);
  const std::string out = Capture([&](const EventWriter& w) {
    v1::EngineEvent progress = NewEvent("progress");
    progress.set_step(3);
    progress.set_fraction(0.5);
    w.Emit(progress);
    w.Emit(metric);
    EventWriter(false).Emit(NewEvent("start"));  // disabled: nothing
  });
  EXPECT_EQ(out,
            "{\"event\":\"progress\",\"step\":3,\"fraction\":0.5}\n"
            "{\"event\":\"metric\",\"step\":7,\"name\":\"ppl/sw\",\"value\":2.5,"
            "\"labels\":{\"language\":\"sw\"},\"alpha\":1}\n");
  // The worker's reader gives back the message written.
  auto back =
      ParseEngineEvent(out.substr(out.find('\n') + 1, out.rfind('\n') - out.find('\n') - 1));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->DebugString(), metric.DebugString());
}

TEST(EventWriterTest, CommandEventsKeepTheirDetails) {
  const std::string out = Capture([](const EventWriter& w) {
    w.Emit(CommandEvent("done", "tokenize", {{"tokens", 4096}, {"out", "/d"}, {"ok", true}}));
  });
  EXPECT_EQ(out,
            "{\"event\":\"done\",\"command\":\"tokenize\",\"ok\":true,\"out\":\"/d\","
            "\"tokens\":4096}\n");
}

std::vector<std::string> Parents(const v1::EngineEvent& e) {
  return {e.parents().begin(), e.parents().end()};
}

TEST(OutputEventTest, DirectoryFromItsManifestAndFileFromItsBytes) {
  const std::string dir =
      (fs::temp_directory_path() / ("stemma-events-" + std::to_string(::getpid()))).string();
  fs::remove_all(dir);
  fs::create_directories(dir + "/ckpt");
  io::Manifest m;
  m.files["model.safetensors"] = {"aa", 1000, {}};
  m.files["config.json"] = {"bb", 24, {}};
  m.parents.push_back({"/ckpt/base", ""});
  m.parents.push_back({"/ckpt/expert", "cc"});
  const std::string text = io::ManifestToJson(m).dump(2) + "\n";
  ASSERT_TRUE(io::WriteFileSynced(dir + "/ckpt/stemma.json", text).ok());
  ASSERT_TRUE(io::WriteFileSynced(dir + "/ckpt/model.safetensors", "x").ok());

  auto e = OutputEvent("model", dir + "/ckpt/", "soup");
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(EngineEventLine(*e).rfind("{\"event\":\"output\",", 0), 0u);
  EXPECT_EQ(e->event(), "output");
  EXPECT_EQ(e->path(), dir + "/ckpt");
  EXPECT_EQ(e->type(), "checkpoint");
  EXPECT_EQ(e->manifest_sha256(), io::Sha256Hex(text));
  EXPECT_EQ(e->bytes(), 1024);
  EXPECT_EQ(Parents(*e), (std::vector<std::string>{"/ckpt/base", "/ckpt/expert"}));
  EXPECT_EQ(e->operation(), "soup");

  ASSERT_TRUE(io::WriteFileSynced(dir + "/results.json", "{\"ppl\": 3}").ok());
  auto f = OutputEvent("results", dir + "/results.json", "eval", {"/ckpt/soup"});
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->type(), "file");
  EXPECT_EQ(f->bytes(), 10);
  EXPECT_EQ(f->manifest_sha256(), io::Sha256Hex("{\"ppl\": 3}"));
  EXPECT_EQ(Parents(*f), (std::vector<std::string>{"/ckpt/soup"}));

  // A token dataset whose manifest is its index.json (docs/data-format.md).
  fs::create_directories(dir + "/tokens");
  const std::string index = "{\"format\": \"stemma-tokens-v1\"}";
  ASSERT_TRUE(io::WriteFileSynced(dir + "/tokens/index.json", index).ok());
  ASSERT_TRUE(io::WriteFileSynced(dir + "/tokens/shard-00000.bin", "12345678").ok());
  auto d = OutputEvent("dataset", dir + "/tokens", "tokenize");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->type(), "dataset");
  EXPECT_EQ(d->manifest_sha256(), io::Sha256Hex(index));
  EXPECT_EQ(d->bytes(), index.size() + 8);
  EXPECT_EQ(d->operation(), "tokenize");

  EXPECT_EQ(OutputEvent("x", dir + "/missing", "eval").status().code(),
            absl::StatusCode::kNotFound);
  fs::create_directories(dir + "/bare");
  EXPECT_FALSE(OutputEvent("x", dir + "/bare", "eval").ok());
  fs::remove_all(dir);
}

}  // namespace
}  // namespace stemma::engine
