// Job memoization (Bazel's action cache): an engine job whose cache key a SUCCEEDED job ran
// under, with that job's outputs still in place, is served from that job's outputs instead
// of running; one whose key a queued or running job already has waits for that job instead
// of running the same thing beside it into the same outputs.
//
// The key (CacheKey) is what can change the output and nothing else: the job's kind, its
// engine spec with defaults filled, output paths left out and input paths replaced by what
// they hold, and the engine build. JobTable computes it when it releases a job and makes the
// state changes; the Memoizer keeps the two indexes (key → the job that produced it, key →
// the job that runs under it) and decides.
//
// Not thread-safe: it belongs to the JobTable (the coordinator's mutex guards both).
#pragma once

#include <functional>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "google/protobuf/map.h"
#include "stemma/v1/job.pb.h"

namespace stemma::coordinator {

// The running twin a memoizable job waits for (Memoizer::FindTwin), kept in its spec so that a
// restarted coordinator knows it too.
inline constexpr char kWaitsForLabel[] = "stemma.waits_for";

// The memoization key of an engine job whose inputs are wired: sha256 of the kind, the spec as
// canonical JSON with its output paths left out, every input path replaced by the sha256 of
// its manifest (<dir>/stemma.json, a token dataset's index.json, a corpus's manifest.json, or
// the file itself) where this process can read it, a uniform soup's models sorted, and
// `engine_build`. An exec job with declared outputs has a key of its own (exec_cache_key.h).
// "" for jobs that are not memoized (noop, exec without outputs or with `cache: false`, a spec
// still holding tokens).
std::string CacheKey(const v1::JobSpec& spec, const std::string& engine_build);

// True when every output path still holds what was published: a directory whose manifest
// (stemma.json or a corpus's manifest.json) lists files that are all there with their
// recorded sizes, or that has a token dataset's index.json; or a file. (A hit whose outputs
// are gone is a miss.)
bool OutputsStillThere(const google::protobuf::Map<std::string, std::string>& outputs);

class Memoizer {
 public:
  // `find(id)`: the table's job with that id, or null. The memoizer stores ids only and
  // checks what they name on use (an entry may name a job that has ended or changed since).
  using FindJob = std::function<const v1::Job*(const std::string& id)>;
  explicit Memoizer(FindJob find) : find_(std::move(find)) {}

  // Asked last before `job` is served from `source`'s outputs: "" to serve, else why not (the
  // job then runs; the entry stays, it may serve others). The coordinator's is the checkpoint
  // registry's (ArtifactRegistry::CacheRefusal): the owners share, the artifacts are still
  // registered and their files unchanged or still hashing to their manifest.
  using Guard = std::function<std::string(const v1::Job& source, const v1::Job& job)>;
  void SetGuard(Guard guard) { guard_ = std::move(guard); }

  // Start-up: a SUCCEEDED job that ran (not one served from the cache) is the entry for its
  // key; a queued or running one is the job that runs under its key.
  void Load(const v1::Job& job);

  // Sets `job`'s cache key for `engine_build` ("" when it is not memoized: not an engine job,
  // `cache: false`, no key) and returns the SUCCEEDED job whose outputs stand for it, or null.
  // A hit whose outputs are gone is a miss, and its entry goes; a trial stopped early stands
  // for `job` only under the same early stopping.
  const v1::Job* FindHit(v1::Job* job, const std::string& engine_build);

  // The queued or running job with `job`'s cache key that `job` should wait for (its id is
  // then in `job`'s kWaitsForLabel label), or null: then `job` is the one that runs under its
  // key (and any stale kWaitsForLabel label is removed).
  const v1::Job* FindTwin(v1::Job* job);

  // What FindHit and FindTwin would answer for `job` (an engine job whose inputs are wired)
  // if it were released now, changing nothing: `stemma plan`'s prediction.
  struct Prediction {
    std::string key;                // "" when the job is not memoized or its key is unknown
    const v1::Job* hit = nullptr;   // the SUCCEEDED job it would be served from
    const v1::Job* twin = nullptr;  // else the queued or running job it would wait for
  };
  Prediction Predict(const v1::Job& job, const std::string& engine_build) const;

  // `job` no longer runs under its current key (it ended, or its key is about to change).
  void Leave(const v1::Job& job);

  // `job` succeeded after running: its key is recomputed with the engine build that produced
  // the outputs (the one it ran on, when known) and it becomes the entry for that key.
  void Succeeded(v1::Job* job);

 private:
  // The entry for `key` that may serve `job`, or null; `*gone` when the entry's outputs are
  // gone (the caller may drop it).
  const v1::Job* Lookup(const v1::Job& job, const std::string& key, bool* gone) const;

  FindJob find_;
  Guard guard_;
  // Cache key → the SUCCEEDED job that ran with it (not one served from cache).
  absl::flat_hash_map<std::string, std::string> memo_;
  // Cache key → the queued or running job that runs under it.
  absl::flat_hash_map<std::string, std::string> inflight_;
};

}  // namespace stemma::coordinator
