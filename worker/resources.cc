#include "worker/resources.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/status.h"

extern char** environ;

namespace stemma::worker {
namespace {

// Runs argv (PATH lookup, no shell) and returns its stdout. NOT_FOUND when the program
// does not exist.
absl::StatusOr<std::string> RunCapture(const std::vector<std::string>& argv) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return ErrnoStatus("pipe", errno);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
  posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid;
  int rc = posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  if (rc != 0) {
    close(fds[0]);
    return ErrnoStatus(absl::StrCat("spawn ", argv[0]), rc);
  }
  std::string out;
  char buf[4096];
  for (;;) {
    ssize_t n = read(fds[0], buf, sizeof buf);
    if (n > 0) {
      out.append(buf, n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      break;
    }
  }
  close(fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status)) return absl::InternalError(absl::StrCat(argv[0], " was killed"));
  if (WEXITSTATUS(status) == 127) return absl::NotFoundError(absl::StrCat(argv[0], " not found"));
  if (WEXITSTATUS(status) != 0) {
    return absl::InternalError(absl::StrCat(argv[0], " exited with ", WEXITSTATUS(status)));
  }
  return out;
}

}  // namespace

std::vector<v1::Gpu> FakeGpus(int count) {
  std::vector<v1::Gpu> gpus;
  for (int i = 0; i < count; ++i) {
    v1::Gpu gpu;
    gpu.set_id(i);
    gpu.set_model("fake");
    gpu.set_memory_mb(81920);
    gpus.push_back(gpu);
  }
  return gpus;
}

absl::StatusOr<std::vector<v1::Gpu>> ParseNvidiaSmiCsv(absl::string_view csv) {
  std::vector<v1::Gpu> gpus;
  for (absl::string_view line : absl::StrSplit(csv, '\n', absl::SkipWhitespace())) {
    std::vector<absl::string_view> fields = absl::StrSplit(line, ',');
    v1::Gpu gpu;
    int id = 0;
    int64_t memory = 0;
    if (fields.size() != 3 || !absl::SimpleAtoi(absl::StripAsciiWhitespace(fields[0]), &id) ||
        !absl::SimpleAtoi(absl::StripAsciiWhitespace(fields[2]), &memory)) {
      return absl::InvalidArgumentError(absl::StrCat("nvidia-smi: cannot parse line '", line, "'"));
    }
    gpu.set_id(id);
    gpu.set_model(std::string(absl::StripAsciiWhitespace(fields[1])));
    gpu.set_memory_mb(memory);
    gpus.push_back(gpu);
  }
  return gpus;
}

absl::StatusOr<std::vector<v1::Gpu>> DiscoverGpus() {
  absl::StatusOr<std::string> out = RunCapture(
      {"nvidia-smi", "--query-gpu=index,name,memory.total", "--format=csv,noheader,nounits"});
  if (absl::IsNotFound(out.status())) return std::vector<v1::Gpu>{};
  if (!out.ok()) return out.status();
  return ParseNvidiaSmiCsv(*out);
}

absl::StatusOr<int64_t> TotalMemoryMb() {
  std::ifstream in("/proc/meminfo");
  if (!in) return absl::UnavailableError("cannot read /proc/meminfo");
  std::string key;
  int64_t value = 0;
  std::string unit;
  while (in >> key >> value) {
    std::getline(in, unit);
    if (key == "MemTotal:") return value / 1024;
  }
  return absl::UnavailableError("/proc/meminfo has no MemTotal");
}

std::string Hostname() {
  char name[256] = {0};
  if (gethostname(name, sizeof name - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

absl::StatusOr<std::string> ResolveWorkerId(const std::string& flag, const std::string& data_dir) {
  const std::string path = data_dir + "/worker.id";
  std::string persisted;
  {
    std::ifstream in(path);
    if (in) std::getline(in, persisted);
  }
  persisted = std::string(absl::StripAsciiWhitespace(persisted));
  std::string id = !flag.empty() ? flag : !persisted.empty() ? persisted : Hostname();
  if (persisted.empty()) {
    const std::string tmp = path + ".tmp";
    std::ofstream out(tmp, std::ios::trunc);
    out << id << "\n";
    out.close();
    if (!out) return absl::InternalError(absl::StrCat("cannot write ", tmp));
    if (rename(tmp.c_str(), path.c_str()) != 0) return ErrnoStatus("rename " + path, errno);
  }
  return id;
}

absl::StatusOr<std::map<std::string, std::string>> ParseLabels(absl::string_view text) {
  std::map<std::string, std::string> labels;
  for (absl::string_view pair : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(pair, absl::MaxSplits('=', 1));
    absl::string_view key = absl::StripAsciiWhitespace(kv.first);
    if (key.empty() || pair.find('=') == absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("--labels: expected key=value, got '", pair, "'"));
    }
    labels[std::string(key)] = std::string(absl::StripAsciiWhitespace(kv.second));
  }
  return labels;
}

}  // namespace stemma::worker
