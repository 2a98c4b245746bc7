#include "coordinator/tenancy.h"

#include <gtest/gtest.h>

namespace stemma::coordinator {
namespace {

Tenancy Projects() {
  auto t = Tenancy::Parse(
      "# project  members\n"
      "vision   bob carol  # the vision group\n"
      "\n"
      "speech   carol dave\n",
      "projects.txt");
  EXPECT_TRUE(t.ok()) << t.status();
  return *t;
}

TEST(Tenancy, ProjectsAndNamespaces) {
  Tenancy t = Projects();
  EXPECT_EQ(t.ProjectsOf("carol"), (std::vector<std::string>{"vision", "speech"}));
  EXPECT_TRUE(t.ProjectsOf("erin").empty());
  EXPECT_EQ(t.Namespace("bob"), "projects/vision");
  EXPECT_EQ(t.Namespace("carol"), "projects/vision");  // the first project in the file
  EXPECT_EQ(t.Namespace("erin"), "erin");
  EXPECT_EQ(t.Namespace(""), "");
  EXPECT_TRUE(t.Shares("bob", "carol"));
  EXPECT_TRUE(t.Shares("dave", "carol"));
  EXPECT_FALSE(t.Shares("bob", "dave"));
  EXPECT_FALSE(t.Shares("erin", "bob"));
  EXPECT_TRUE(t.Shares("erin", "erin"));
  EXPECT_TRUE(t.Shares("erin", ""));  // made without authentication: everyone's
}

TEST(Tenancy, BadFilesNameTheLine) {
  struct Case {
    const char* text;
    const char* error;
  };
  for (const Case& c : std::vector<Case>{
           {"vision\n", "projects.txt: line 1: project vision has no members"},
           {"a bob\nb bob\na carol\n", "projects.txt: line 3: project a listed twice"},
           {"../x bob\n", "project '../x' is not a plain name"},
           {"x bob/y\n", "member 'bob/y' is not a plain name"},
       }) {
    auto t = Tenancy::Parse(c.text, "projects.txt");
    ASSERT_FALSE(t.ok()) << c.text;
    EXPECT_NE(t.status().message().find(c.error), absl::string_view::npos) << t.status();
  }
}

TEST(Tenancy, WritesStayBelowTheOwnersPrefixes) {
  Tenancy t = Projects();
  EXPECT_TRUE(t.CheckWritable("init.out", "bob/s5", "bob").ok());
  EXPECT_TRUE(t.CheckWritable("init.out", "projects/vision/s5", "bob").ok());
  EXPECT_TRUE(t.CheckWritable("init.out", "anything/at/all", "").ok());
  for (const char* path : {"carol/s5", "bob", "bob/../carol/x", "projects/speech/x", "bobby/x",
                           "experiments/e/s/${{ self.id }}", "projects/vision"}) {
    absl::Status st = t.CheckWritable("init.out", path, "bob");
    EXPECT_EQ(st.code(), absl::StatusCode::kPermissionDenied) << path;
    EXPECT_NE(st.message().find("init.out: "), absl::string_view::npos) << st;
    EXPECT_NE(st.message().find("'bob/'"), absl::string_view::npos) << st;
  }
  // A matrix value with '..' that climbs out of the default prefix.
  EXPECT_FALSE(
      t.CheckWritable("init.out", "bob/experiments/e/s/y=x/../../../../../carol/x", "bob").ok());
}

TEST(Tenancy, JobOutputsAreChecked) {
  Tenancy t = Projects();
  v1::JobSpec spec;
  spec.set_name("x");
  spec.mutable_tokenize()->set_out("carol/base");
  absl::Status st = t.CheckJobOutputs(spec, "erin");
  EXPECT_EQ(st.code(), absl::StatusCode::kPermissionDenied) << st;
  EXPECT_NE(st.message().find("tokenize.out: carol/base"), absl::string_view::npos) << st;
  EXPECT_TRUE(t.CheckJobOutputs(spec, "carol").ok());
  EXPECT_TRUE(t.CheckJobOutputs(spec, "").ok());
  v1::JobSpec absolute;
  absolute.mutable_init()->set_out("/srv/stemma/erin/m");
  EXPECT_EQ(t.CheckJobOutputs(absolute, "erin").code(), absl::StatusCode::kPermissionDenied);
}

}  // namespace
}  // namespace stemma::coordinator
