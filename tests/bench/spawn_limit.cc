// spawn_limit: the physical limit for the orchestration benchmark.
//
// Spawns (posix_spawn + exec) and reaps /bin/true N times with at most C children alive at
// once, and reports how many per second this machine manages. No orchestration at all: this
// is the ceiling any job orchestrator on this machine can approach.
//
//   spawn_limit [--jobs N] [--concurrency C] [--program PATH] [--json]
//
// Prints "spawn_limit: N jobs, C at once, T s, R jobs/s", or with --json one JSON object
// {"jobs":N,"concurrency":C,"seconds":T,"jobs_per_s":R}.
#include <spawn.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

extern char** environ;

namespace {

[[noreturn]] void Usage(const char* argv0) {
  std::fprintf(stderr, "usage: %s [--jobs N] [--concurrency C] [--program PATH] [--json]\n", argv0);
  std::exit(2);
}

long ParsePositive(const char* s, const char* argv0) {
  char* end = nullptr;
  errno = 0;
  long v = std::strtol(s, &end, 10);
  if (errno != 0 || end == s || *end != '\0' || v <= 0) Usage(argv0);
  return v;
}

// Reaps one child; returns false (and prints why) if it failed.
bool ReapOne() {
  int status = 0;
  pid_t pid;
  do {
    pid = waitpid(-1, &status, 0);
  } while (pid < 0 && errno == EINTR);
  if (pid < 0) {
    std::fprintf(stderr, "spawn_limit: waitpid: %s\n", std::strerror(errno));
    return false;
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "spawn_limit: child %d did not exit 0 (status %d)\n", pid, status);
    return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  long jobs = 1000;
  long concurrency = 8;
  std::string program = "/bin/true";
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--jobs" && i + 1 < argc) {
      jobs = ParsePositive(argv[++i], argv[0]);
    } else if (a == "--concurrency" && i + 1 < argc) {
      concurrency = ParsePositive(argv[++i], argv[0]);
    } else if (a == "--program" && i + 1 < argc) {
      program = argv[++i];
    } else if (a == "--json") {
      json = true;
    } else {
      Usage(argv[0]);
    }
  }

  char* child_argv[] = {program.data(), nullptr};
  long started = 0;
  long running = 0;
  long failed = 0;
  const auto t0 = std::chrono::steady_clock::now();
  while (started < jobs || running > 0) {
    if (started < jobs && running < concurrency) {
      pid_t pid;
      int rc = posix_spawn(&pid, program.c_str(), nullptr, nullptr, child_argv, environ);
      if (rc != 0) {
        std::fprintf(stderr, "spawn_limit: posix_spawn %s: %s\n", program.c_str(),
                     std::strerror(rc));
        return 1;
      }
      ++started;
      ++running;
      continue;
    }
    if (!ReapOne()) ++failed;
    --running;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double rate = seconds > 0 ? static_cast<double>(jobs) / seconds : 0.0;
  if (json) {
    std::printf("{\"jobs\":%ld,\"concurrency\":%ld,\"seconds\":%.6f,\"jobs_per_s\":%.1f}\n", jobs,
                concurrency, seconds, rate);
  } else {
    std::printf("spawn_limit: %ld jobs, %ld at once, %.3f s, %.1f jobs/s\n", jobs, concurrency,
                seconds, rate);
  }
  if (failed > 0) {
    std::fprintf(stderr, "spawn_limit: %ld children failed\n", failed);
    return 1;
  }
  return 0;
}
