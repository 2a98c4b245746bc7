#include "worker/spawn_child.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <mutex>

namespace stemma::worker {
namespace {

// errno -> its text, filled by PrepareErrnoTexts before any fork; read-only afterwards.
constexpr int kErrnoTexts = 256;
const char* errno_texts[kErrnoTexts];

size_t Length(const char* s) {
  size_t n = 0;
  while (s[n] != '\0') ++n;
  return n;
}

void WriteAll(int fd, const char* data, size_t n) {
  while (n > 0) {
    const ssize_t w = write(fd, data, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    data += w;
    n -= static_cast<size_t>(w);
  }
}

// "errno N" for a value without a text, formatted into `buf` without allocation.
size_t FormatErrno(int err, char* buf, size_t size) {
  const char prefix[] = "errno ";
  size_t n = 0;
  for (; prefix[n] != '\0' && n < size; ++n) buf[n] = prefix[n];
  char digits[16];
  size_t d = 0;
  unsigned v = err < 0 ? 0u : static_cast<unsigned>(err);
  do {
    digits[d++] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v > 0 && d < sizeof digits);
  while (d > 0 && n < size) buf[n++] = digits[--d];
  return n;
}

}  // namespace

void PrepareErrnoTexts() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (int e = 0; e < kErrnoTexts; ++e) errno_texts[e] = strerrordesc_np(e);
  });
}

[[noreturn]] void RunChild(const ChildPlan& p) {
  // The worker blocks SIGINT/SIGTERM and gRPC ignores SIGPIPE; both would be inherited.
  struct sigaction dfl;
  memset(&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;
  if (p.noop) {
    for (int sig = 1; sig < NSIG; ++sig) sigaction(sig, &dfl, nullptr);  // some fail; fine
  } else {
    // execve resets handlers itself; only ignored signals would stay ignored.
    for (size_t i = 0; i < p.reset_signal_count; ++i) sigaction(p.reset_signals[i], &dfl, nullptr);
  }
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);

  setpgid(0, 0);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != p.parent) _exit(137);  // the worker died before prctl took effect

  if (p.stdin_fd > 0) {
    dup2(p.stdin_fd, 0);
  } else if (p.stdin_fd == 0) {
    fcntl(0, F_SETFD, 0);  // dup2 would be a no-op that leaves FD_CLOEXEC set
  }
  dup2(p.out_fd, 1);
  dup2(p.out_fd, 2);
  // Before the rule set's descriptor is closed; no_new_privs is what lets an unprivileged
  // process restrict itself.
  const bool confine = p.ruleset_fd >= 0 || p.write_ruleset_fd >= 0;
  if ((confine && prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) ||
      (p.ruleset_fd >= 0 && syscall(SYS_landlock_restrict_self, p.ruleset_fd, 0) != 0) ||
      (p.write_ruleset_fd >= 0 &&
       syscall(SYS_landlock_restrict_self, p.write_ruleset_fd, 0) != 0)) {
    WriteAll(2, p.confine_error, p.confine_error_len);
    _exit(126);
  }
  close_range(3, ~0U, 0);

  if (chdir(p.workdir) != 0) {
    WriteAll(2, p.chdir_error, p.chdir_error_len);
    _exit(126);
  }
  if (p.noop) {
    struct timespec ts;
    ts.tv_sec = p.noop_ms / 1000;
    ts.tv_nsec = (p.noop_ms % 1000) * 1000000;
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
    _exit(p.noop_exit & 0xff);
  }
  execve(p.path, p.argv, p.envp);
  const int err = errno;
  WriteAll(2, p.exec_error, p.exec_error_len);
  const char* text = err >= 0 && err < kErrnoTexts ? errno_texts[err] : nullptr;
  if (text != nullptr) {
    WriteAll(2, text, Length(text));
  } else {
    char buf[32];
    WriteAll(2, buf, FormatErrno(err, buf, sizeof buf));
  }
  WriteAll(2, "\n", 1);
  _exit(127);
}

}  // namespace stemma::worker
