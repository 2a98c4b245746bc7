#include "common/auth.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <set>
#include <thread>

#include "common/rpc.h"
#include "stemma/v1/user_service.grpc.pb.h"
#include "stemma/v1/worker_service.grpc.pb.h"

namespace stemma {
namespace {

// Every method of every service has a row in the table, and every row names a real method:
// a new RPC without a policy fails here (and is refused at run time).
TEST(MethodRoles, EveryServiceMethodHasAnEntryAndNoEntryIsStale) {
  // Every service of every file that defines one (the user and worker APIs).
  const google::protobuf::FileDescriptor* files[] = {v1::SubmitRequest::descriptor()->file(),
                                                     v1::Register::descriptor()->file()};
  std::set<std::string> methods;
  int services = 0;
  for (const google::protobuf::FileDescriptor* file : files) {
    for (int s = 0; s < file->service_count(); ++s) {
      const google::protobuf::ServiceDescriptor* service = file->service(s);
      ++services;
      for (int i = 0; i < service->method_count(); ++i) {
        const std::string full = "/" + service->full_name() + "/" + service->method(i)->name();
        methods.insert(full);
        EXPECT_NE(AllowedRoles(full), 0) << full << " has no entry in MethodRoles()";
      }
    }
  }
  EXPECT_EQ(services, 2);
  EXPECT_GE(methods.size(), 10u);
  for (const auto& [name, roles] : MethodRoles()) {
    EXPECT_TRUE(methods.count(name)) << name << " is in MethodRoles() but is no method";
  }
}

TEST(MethodRoles, WorkersOnlyOnTheWorkerServiceAndReadOnlyChangesNothing) {
  for (const auto& [name, roles] : MethodRoles()) {
    const bool worker_service = name.rfind("/stemma.v1.WorkerService/", 0) == 0;
    EXPECT_EQ((roles & Roles(Role::kWorker)) != 0, worker_service) << name;
  }
  for (const char* m : {"Submit", "Cancel", "Retry", "Drain", "PinArtifact", "CollectGarbage"}) {
    EXPECT_EQ(AllowedRoles(std::string("/stemma.v1.UserService/") + m) & Roles(Role::kReadOnly), 0)
        << m;
  }
  EXPECT_EQ(AllowedRoles("/stemma.v1.UserService/Drain"), Roles(Role::kAdmin));
  EXPECT_EQ(AllowedRoles("/stemma.v1.UserService/NoSuchMethod"), 0);
}

TEST(Roles, ParseAndName) {
  for (Role r : {Role::kAdmin, Role::kUser, Role::kWorker, Role::kReadOnly}) {
    auto parsed = ParseRole(RoleName(r));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, r);
  }
  auto bad = ParseRole("root");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("role"), std::string::npos);
}

TEST(Tokens, NewTokensAreDistinctAndUrlSafe) {
  auto a = NewToken();
  auto b = NewToken();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(*a, *b);
  EXPECT_EQ(a->size(), 4u + 43u);
  EXPECT_EQ(
      a->find_first_not_of("stm_ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-"),
      std::string::npos);
}

TEST(Tokens, Sha256KnownAnswer) {
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(TokenStore, LooksUpByDigestAndNeverHoldsTheToken) {
  auto line = TokenFileLine("stm_secret", Role::kUser, "alice");
  ASSERT_TRUE(line.ok());
  EXPECT_EQ(line->find("stm_secret"), std::string::npos);
  auto store = TokenStore::FromText("# comment\n\n" + *line + "\n", "tokens");
  ASSERT_TRUE(store.ok()) << store.status();
  auto id = (*store)->Lookup("stm_secret");
  ASSERT_TRUE(id.ok());
  EXPECT_EQ(id->role, Role::kUser);
  EXPECT_EQ(id->subject, "alice");
  EXPECT_EQ((*store)->Lookup("stm_secreT").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ((*store)->Lookup("").status().code(), absl::StatusCode::kNotFound);
}

TEST(TokenStore, MalformedLinesNameFileAndLine) {
  struct Case {
    std::string text;
    std::string want;
  } cases[] = {
      {"stm_plaintext admin alice\n", "line 1: the digest must start with 'sha256:'"},
      {"# x\nsha256:abcd admin alice\n", "line 2: the digest must be 64 hex digits"},
      {"sha256:" + std::string(64, 'a') + " root alice\n", "line 1: role"},
      {"sha256:" + std::string(64, 'a') + " admin\n", "line 1: expected"},
      {"sha256:" + std::string(64, 'a') + " admin a\nsha256:" + std::string(64, 'a') + " user b\n",
       "line 2: the same token appears twice"},
  };
  for (const auto& c : cases) {
    auto store = TokenStore::FromText(c.text, "tokens.txt");
    ASSERT_FALSE(store.ok()) << c.text;
    EXPECT_EQ(store.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(store.status().message().find("tokens.txt: " + c.want), std::string::npos)
        << store.status();
  }
}

class TempDir : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/stemma-auth.XXXXXX";
    dir_ = ::mkdtemp(tmpl);
  }
  void TearDown() override { std::system(("rm -rf " + dir_).c_str()); }
  std::string dir_;
};

TEST_F(TempDir, CreateTokenInFileThenReloadAndRevoke) {
  const std::string path = dir_ + "/tokens";
  auto t1 = CreateTokenInFile(path, Role::kAdmin, "root-ops");
  ASSERT_TRUE(t1.ok()) << t1.status();
  struct stat st;
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  auto store = TokenStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ((*store)->Lookup(*t1)->subject, "root-ops");

  // A second token appears without a restart; revoking the first takes effect too.
  auto t2 = CreateTokenInFile(path, Role::kWorker, "w0");
  ASSERT_TRUE(t2.ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  ASSERT_TRUE((*store)->Lookup(*t2).ok());
  EXPECT_EQ((*store)->Lookup(*t2)->role, Role::kWorker);
  std::string kept = TokenFileLine(*t2, Role::kWorker, "w0").value();
  {
    std::ofstream out(path + ".new");
    out << kept << "\n";
  }
  ::chmod((path + ".new").c_str(), 0600);
  ASSERT_EQ(::rename((path + ".new").c_str(), path.c_str()), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  EXPECT_FALSE((*store)->Lookup(*t1).ok());
  EXPECT_TRUE((*store)->Lookup(*t2).ok());

  // A broken edit keeps the tokens that were loaded.
  {
    std::ofstream out(path, std::ios::app);
    out << "garbage\n";
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  EXPECT_TRUE((*store)->Lookup(*t2).ok());
}

// A reload with a malformed line applies the rest of the file (a revocation in it takes
// effect) and refuses the token on the malformed line; the observer gets the count.
TEST_F(TempDir, AMalformedLineDoesNotKeepARevocationFromTakingEffect) {
  const std::string path = dir_ + "/tokens";
  auto keep = CreateTokenInFile(path, Role::kAdmin, "ops");
  auto revoke = CreateTokenInFile(path, Role::kUser, "mallory");
  ASSERT_TRUE(keep.ok() && revoke.ok());
  auto store = TokenStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  int malformed = -2;
  (*store)->SetReloadObserver([&](int n) { malformed = n; });
  ASSERT_TRUE((*store)->Lookup(*revoke).ok());
  const std::string broken = TokenFileLine("stm_other", Role::kUser, "carol").value();
  {
    std::ofstream out(path + ".new");
    out << TokenFileLine(*keep, Role::kAdmin, "ops").value() << "\n"
        << broken.substr(0, broken.size() - 6) << "\n";  // "user carol" cut: malformed
  }
  ::chmod((path + ".new").c_str(), 0600);
  ASSERT_EQ(::rename((path + ".new").c_str(), path.c_str()), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  EXPECT_FALSE((*store)->Lookup(*revoke).ok());
  EXPECT_TRUE((*store)->Lookup(*keep).ok());
  EXPECT_FALSE((*store)->Lookup("stm_other").ok());
  EXPECT_EQ(malformed, 1);
}

TEST(LogRateLimiter, LetsAFewThroughAndCountsTheRest) {
  LogRateLimiter limiter(5);
  int allowed = 0;
  int64_t reported = 0;  // the suppressed counts the allowed lines carry
  for (int i = 0; i < 3000; ++i) {
    int64_t suppressed = 0;
    if (limiter.Allow(&suppressed)) {
      ++allowed;
      reported += suppressed;
    }
  }
  EXPECT_GE(allowed, 5);
  EXPECT_LE(allowed, 15);  // at most three one-second windows, even on a slow machine
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  int64_t suppressed = 0;
  ASSERT_TRUE(limiter.Allow(&suppressed));
  EXPECT_EQ(reported + suppressed + allowed, 3000);
}

TEST_F(TempDir, SecretFilesReadableByOthersAreRefused) {
  const std::string path = dir_ + "/token";
  std::ofstream(path) << "stm_abc\n";
  ::chmod(path.c_str(), 0644);
  auto r = ReadSecretFile(path);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(r.status().message().find(path), std::string::npos);
  EXPECT_NE(r.status().message().find("0644"), std::string::npos);
  EXPECT_FALSE(TokenStore::Open(path).ok());
  ::chmod(path.c_str(), 0600);
  ASSERT_TRUE(ReadSecretFile(path).ok());
  EXPECT_EQ(*ReadSecretFile(path), "stm_abc");
  EXPECT_EQ(ReadSecretFile(dir_ + "/missing").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(TempDir, ClientTokenComesFromEnvThenFileAndANamedUnreadableFileIsAnError) {
  ::setenv("HOME", dir_.c_str(), 1);
  ::unsetenv("STEMMA_TOKEN");
  ::unsetenv("STEMMA_TOKEN_FILE");
  EXPECT_EQ(FindClientToken().value(), "");
  std::system(("mkdir -p " + dir_ + "/.config/stemma").c_str());
  const std::string home_token = dir_ + "/.config/stemma/token";
  std::ofstream(home_token) << "stm_home\n";
  ::chmod(home_token.c_str(), 0640);
  auto r = FindClientToken();
  ASSERT_FALSE(r.ok());  // mode checked, no silent fallback
  EXPECT_NE(r.status().message().find(home_token), std::string::npos);
  ::chmod(home_token.c_str(), 0600);
  EXPECT_EQ(FindClientToken().value(), "stm_home");
  ::setenv("STEMMA_TOKEN_FILE", (dir_ + "/nope").c_str(), 1);
  EXPECT_FALSE(FindClientToken().ok());
  ::setenv("STEMMA_TOKEN", "stm_env", 1);
  EXPECT_EQ(FindClientToken().value(), "stm_env");
  ::unsetenv("STEMMA_TOKEN");
  ::unsetenv("STEMMA_TOKEN_FILE");
}

TEST(Loopback, Addresses) {
  for (const char* a :
       {"127.0.0.1:7070", "localhost:7070", "[::1]:7070", "127.1.2.3:1", "unix:/tmp/s"}) {
    EXPECT_TRUE(IsLoopbackAddress(a)) << a;
  }
  for (const char* a : {"0.0.0.0:7070", "[::]:7070", "10.0.0.1:7070", "example.com:7070",
                        "127.evil.com:7070", ":7070"}) {
    EXPECT_FALSE(IsLoopbackAddress(a)) << a;
  }
}

TEST(AllowAll, StillRefusesMethodsWithoutPolicy) {
  auto auth = MakeAllowAllAuthenticator();
  grpc::ServerContext ctx;
  Caller caller;
  EXPECT_TRUE(auth->Authenticate(ctx, "/stemma.v1.UserService/Submit", &caller).ok());
  EXPECT_EQ(caller.role, Role::kAdmin);
  EXPECT_EQ(auth->Authenticate(ctx, "/stemma.v1.UserService/Nope", &caller).code(),
            absl::StatusCode::kPermissionDenied);
}

}  // namespace
}  // namespace stemma
