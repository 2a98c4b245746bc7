#include "cli/process.h"

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/status.h"

namespace stemma::cli {

absl::StatusOr<std::unique_ptr<ChildProcess>> ChildProcess::Start(
    const std::string& name, const std::string& path, const std::vector<std::string>& args,
    const std::string& log_path, const sigset_t& signal_mask) {
  int log_fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0) return ErrnoStatus(absl::StrCat("open ", log_path), errno);
  int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (null_fd < 0) {
    int err = errno;
    close(log_fd);
    return ErrnoStatus("open /dev/null", err);
  }
  // Everything the child needs is built before fork: after it, only async-signal-safe
  // calls until exec.
  std::vector<std::string> argv_storage;
  argv_storage.push_back(path);
  argv_storage.insert(argv_storage.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_storage) argv.push_back(a.data());
  argv.push_back(nullptr);
  const std::string exec_failed = absl::StrCat("stemma up: cannot execute ", path, "\n");
  const pid_t parent = getpid();

  pid_t pid = fork();
  if (pid < 0) {
    int err = errno;
    close(log_fd);
    close(null_fd);
    return ErrnoStatus(absl::StrCat("fork for ", name), err);
  }
  if (pid == 0) {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(1);  // the supervisor died before prctl
    dup2(null_fd, STDIN_FILENO);
    dup2(log_fd, STDOUT_FILENO);
    dup2(log_fd, STDERR_FILENO);
    sigprocmask(SIG_SETMASK, &signal_mask, nullptr);
    execv(path.c_str(), argv.data());
    (void)!write(STDERR_FILENO, exec_failed.data(), exec_failed.size());
    _exit(127);
  }
  close(log_fd);
  close(null_fd);
  return std::unique_ptr<ChildProcess>(new ChildProcess(name, log_path, pid));
}

bool ChildProcess::Poll() {
  if (exited_) return true;
  int status = 0;
  pid_t r = waitpid(pid_, &status, WNOHANG);
  if (r == pid_) {
    exited_ = true;
    wait_status_ = status;
  } else if (r < 0 && errno == ECHILD) {
    exited_ = true;  // reaped elsewhere; nothing more to learn
  }
  return exited_;
}

std::string ChildProcess::ExitDescription() const {
  if (!exited_) return "";
  if (WIFEXITED(wait_status_))
    return absl::StrCat("exited with status ", WEXITSTATUS(wait_status_));
  if (WIFSIGNALED(wait_status_)) {
    return absl::StrCat("was killed by signal ", WTERMSIG(wait_status_), " (",
                        strsignal(WTERMSIG(wait_status_)), ")");
  }
  return "exited";
}

void ChildProcess::Signal(int signal) {
  if (!Poll()) kill(pid_, signal);
}

void ChildProcess::Stop(absl::Duration grace) { StopAll({this}, grace); }

void StopAll(const std::vector<ChildProcess*>& children, absl::Duration grace) {
  for (ChildProcess* child : children) child->Signal(SIGTERM);
  const absl::Time kill_at = absl::Now() + grace;
  bool killed = false;
  while (true) {
    bool all_done = true;
    for (ChildProcess* child : children) all_done = child->Poll() && all_done;
    if (all_done) return;
    if (!killed && absl::Now() >= kill_at) {
      for (ChildProcess* child : children) child->Signal(SIGKILL);
      killed = true;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
}

absl::StatusOr<std::string> FindSiblingBinary(const std::string& name) {
  std::error_code ec;
  std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  std::string self_dir = ec ? "" : self.parent_path().string();
  if (!self_dir.empty()) {
    std::string candidate = (std::filesystem::path(self_dir) / name).string();
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  const char* path_env = std::getenv("PATH");
  if (path_env != nullptr) {
    for (absl::string_view dir : absl::StrSplit(path_env, ':', absl::SkipEmpty())) {
      std::string candidate = (std::filesystem::path(std::string(dir)) / name).string();
      struct stat st;
      if (stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
          access(candidate.c_str(), X_OK) == 0) {
        return candidate;
      }
    }
  }
  return absl::NotFoundError(absl::StrCat("cannot find ", name, " in ",
                                          self_dir.empty() ? "this binary's directory" : self_dir,
                                          " or on PATH"));
}

std::string LastLogLine(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  in.seekg(0, std::ios::end);
  std::streamoff size = in.tellg();
  const std::streamoff kTail = 4096;
  in.seekg(size > kTail ? size - kTail : 0);
  std::string tail((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::string last;
  for (absl::string_view line : absl::StrSplit(tail, '\n')) {
    absl::string_view stripped = absl::StripAsciiWhitespace(line);
    if (!stripped.empty()) last = std::string(stripped);
  }
  if (last.size() > 300) last = last.substr(0, 300) + "...";
  return last;
}

}  // namespace stemma::cli
