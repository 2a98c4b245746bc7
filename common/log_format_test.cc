#include "common/log_format.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace stemma {
namespace {

TEST(JsonLogLine, IsOneObjectWithTheMessagesFieldsLifted) {
  // 2026-12-02T09:30:00.123Z
  const std::string line =
      JsonLogLine("worker", "info", 1796203800123,
                  "attempt started job=j-12 attempt=j-12.1 worker=w0, pid=4711 \"quoted\"");
  EXPECT_EQ(line.find('\n'), std::string::npos);
  const nlohmann::json j = nlohmann::json::parse(line);
  EXPECT_EQ(j["time"], "2026-12-02T09:30:00.123Z");
  EXPECT_EQ(j["level"], "info");
  EXPECT_EQ(j["process"], "worker");
  EXPECT_EQ(j["msg"], "attempt started job=j-12 attempt=j-12.1 worker=w0, pid=4711 \"quoted\"");
  EXPECT_EQ(j["job"], "j-12");
  EXPECT_EQ(j["attempt"], "j-12.1");
  EXPECT_EQ(j["worker"], "w0");
  EXPECT_FALSE(j.contains("pid"));  // only the well-known fields
  // The fields a reader scans first come first.
  EXPECT_EQ(line.rfind("{\"time\":", 0), 0u) << line;
}

TEST(JsonLogLine, SurvivesBytesThatAreNotUtf8) {
  const nlohmann::json j =
      nlohmann::json::parse(JsonLogLine("coordinator", "warn", 0, "path /tmp/\xff\xfe x"));
  EXPECT_EQ(j["time"], "1970-01-01T00:00:00.000Z");
  EXPECT_NE(j["msg"].get<std::string>().find("/tmp/"), std::string::npos);
}

TEST(SetLogFormat, KnowsTextAndJsonOnly) {
  EXPECT_TRUE(SetLogFormat("text"));
  EXPECT_FALSE(SetLogFormat("xml"));
}

}  // namespace
}  // namespace stemma
