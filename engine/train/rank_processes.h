// Test helpers for runs of several data-parallel ranks as real processes on loopback
// (distributed_test, sharded_train_test, eval_ranks_test): a free port for MASTER_PORT, and
// W shell commands started at once, waited for, with each one's peak anonymous RSS polled.
#pragma once

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace stemma::engine::train {

// A port nobody listens on right now (the kernel's pick for an ephemeral bind).
inline int FreePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof address;
  ::bind(fd, reinterpret_cast<sockaddr*>(&address), length);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  ::close(fd);
  return ntohs(address.sin_port);
}

struct RankProcess {
  int exit_code = -1;         // -1 when killed by a signal
  int64_t peak_anon_kib = 0;  // the largest RssAnon seen (polled every 5 ms)
};

// RssAnon of `pid` in KiB (0 when it cannot be read: the process is gone).
inline int64_t RssAnonKib(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("RssAnon:", 0) == 0) return std::stoll(line.substr(8));
  }
  return 0;
}

// Runs every command (`/bin/sh -c "exec COMMAND"`, so the measured process is the command
// itself) at once and waits for all of them, polling each one's RssAnon. Peak anonymous
// RSS, not VmHWM: LibTorch pages in ~100 MiB of code late in a run (DEVELOPERS.md).
inline std::vector<RankProcess> RunRankCommands(const std::vector<std::string>& commands) {
  std::vector<pid_t> pids;
  for (const std::string& command : commands) {
    const pid_t pid = fork();
    if (pid == 0) {
      execl("/bin/sh", "sh", "-c", ("exec " + command).c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    pids.push_back(pid);
  }
  std::vector<RankProcess> out(commands.size());
  size_t running = pids.size();
  while (running > 0) {
    for (size_t i = 0; i < pids.size(); ++i) {
      if (pids[i] <= 0) continue;
      out[i].peak_anon_kib = std::max(out[i].peak_anon_kib, RssAnonKib(pids[i]));
      int status = 0;
      if (waitpid(pids[i], &status, WNOHANG) == pids[i]) {
        out[i].exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        pids[i] = 0;
        --running;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return out;
}

}  // namespace stemma::engine::train
