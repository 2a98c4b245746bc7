// The worker daemon's one typed configuration, built from flags in main and passed to the
// constructors of the executor, the session and the metrics. A plain value; not shared
// mutable state.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "stemma/v1/user_service.pb.h"

namespace stemma::worker {

struct WorkerConfig {
  std::string coordinator = "localhost:7070";  // host:port of the coordinator
  std::string data_dir = "./stemma-data/worker";
  std::string worker_id;           // --name, the persisted id, or the hostname
  std::string host = "127.0.0.1";  // advertised for gang rendezvous
  std::vector<v1::Gpu> gpus;       // declared or discovered
  double cpus = 1;
  int64_t memory_mb = 0;
  std::map<std::string, std::string> labels;
  std::string metrics_listen;  // empty: no /metrics endpoint
  bool allow_exec = false;
  int64_t kill_grace_ms = 5000;  // SIGTERM -> SIGKILL delay
  std::string log_level = "info";
  // Where to find stemma-engine; empty: next to the worker binary, then PATH.
  std::string engine_path;
  // Relative paths in engine specs resolve against this absolute directory
  // (STEMMA_STORAGE_ROOT for the engine); --storage-root, default the directory the worker
  // was started in.
  std::string storage_root;
  // Absolute directories engine jobs may read besides the storage root (--read-root,
  // repeatable): a corpus, a shared model cache. Outputs stay inside the storage root
  // (common/path_confinement.h).
  std::vector<std::string> read_roots;
  // The engine's build id, sent in the registration: --engine-build-id, else
  // "sha256:<16 hex>" of the engine binary (EngineBuildId in main.cc); "" without an engine.
  std::string engine_build_id;
  // The Landlock rule set every exec and engine child restricts itself to
  // (job_confinement.h), made in main; -1: none (a kernel without Landlock).
  int job_ruleset_fd = -1;
};

}  // namespace stemma::worker
