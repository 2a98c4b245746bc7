#include "common/label_selector.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace stemma {
namespace {

using ::testing::HasSubstr;

bool Select(const std::string& selector, const std::map<std::string, std::string>& labels) {
  absl::StatusOr<LabelSelector> s = LabelSelector::Parse(selector);
  EXPECT_TRUE(s.ok()) << selector << ": " << s.status();
  return s.ok() && s->Matches(labels);
}

TEST(LabelSelector, EachOperatorSelectsAsKubectlDoes) {
  const std::map<std::string, std::string> slavic = {{"family", "slavic"}, {"size", "small"}};
  const std::map<std::string, std::string> romance = {{"family", "romance"}, {"size", "big"}};
  const std::map<std::string, std::string> none;
  struct Case {
    std::string selector;
    bool slavic, romance, none;
  };
  const Case cases[] = {
      {"", true, true, true},
      {"family=slavic", true, false, false},
      {"family==slavic", true, false, false},
      {"family!=slavic", false, true, true},  // absent counts as "not equal"
      {"family=slavic,size!=big", true, false, false},
      {"family in (slavic, romance)", true, true, false},
      {"family notin (slavic)", false, true, true},
      {"size", true, true, false},
      {"!size", false, false, true},
      {" family = slavic , size in (small) ", true, false, false},
      {"stemma.owner/x=", false, false, false},  // an empty value matches only an empty value
  };
  for (const Case& c : cases) {
    EXPECT_EQ(Select(c.selector, slavic), c.slavic) << c.selector;
    EXPECT_EQ(Select(c.selector, romance), c.romance) << c.selector;
    EXPECT_EQ(Select(c.selector, none), c.none) << c.selector;
  }
}

TEST(LabelSelector, MatchesProtobufMaps) {
  google::protobuf::Map<std::string, std::string> labels;
  labels["family"] = "slavic";
  auto s = LabelSelector::Parse("family in (slavic,baltic),!frozen");
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(s->Matches(labels));
  labels["frozen"] = "yes";
  EXPECT_FALSE(s->Matches(labels));
}

TEST(LabelSelector, BadSelectorsNameTheRequirementAndTheProblem) {
  struct Case {
    std::string selector, message;
  };
  const Case cases[] = {
      {"family=slavic,,size=big", "empty requirement"},
      {"family in (slavic", "( without its )"},
      {"family in slavic)", ") without its ("},
      {"family within (a)", "expected 'KEY in (VALUES)'"},
      {"family in (a,,b)", "empty value"},
      {"fam ily=x", "not a label key"},
      {"family=sla vic", "not a label value"},
      {"=x", "no label key"},
      {"family in (a) x", "after the closing )"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<LabelSelector> s = LabelSelector::Parse(c.selector);
    ASSERT_FALSE(s.ok()) << c.selector;
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(s.status().message()), HasSubstr(c.message)) << c.selector;
  }
}

}  // namespace
}  // namespace stemma
