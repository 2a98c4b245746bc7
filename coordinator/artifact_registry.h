// The checkpoint registry: every checkpoint, dataset and result file a job published,
// registered when the job succeeds, with its manifest hash, size, producing job and
// experiment, parents (by path, resolved to artifact ids; an unknown parent path becomes
// an external artifact), operation and the metrics measured on it. Lineage, verification,
// pins and garbage collection (gc_policy.h) work on it.
//
// The registry is part of the in-memory working set (the artifacts table is loaded at
// start); lookups by id, path, manifest hash and producing job are hash lookups.
//
// Thread-safety: methods marked as requiring the core mutex run inside a locked step of
// the coordinator; the user operations take it themselves, and do file work (verify, gc
// --apply) outside it.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/node_hash_map.h"
#include "coordinator/artifact_files.h"
#include "coordinator/core.h"
#include "coordinator/metric_series.h"
#include "coordinator/tenancy.h"
#include "stemma/v1/worker_service.pb.h"

namespace stemma::coordinator {

class ArtifactRegistry {
 public:
  ArtifactRegistry(CoordinatorCore* core, MetricSeries* series) : core_(core), series_(series) {}
  // The core mutex is held. Every part shares the core's one mutex; the thread-safety
  // analysis cannot see that through two parts' pointers, so callers in other parts say so.
  void AssertHeld() const ABSL_ASSERT_EXCLUSIVE_LOCK(core_->mu) { core_->mu.AssertHeld(); }

  void Load(const StoreSnapshot& snapshot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_->mu);

  // Confinement of what a part that exited 0 reported (docs/tenancy.md): every artifact and
  // output path must resolve strictly below the storage root of the worker that reported it
  // (`root`) and, for an owned job, below one of the owner's prefixes. "" when it does, else
  // why (the attempt then fails and nothing is registered). A worker that reports no root
  // (one from before it did) gets only the lexical check, and its owned outputs are
  // refused. Reads the file system (symlinks are resolved): call without the core mutex.
  static std::string ConfineOutputs(const v1::AttemptEvent::Finished& finished,
                                    const std::string& root, const std::string& owner,
                                    const Tenancy& tenancy);

  // What a part of `attempt_id` that exited 0 reported, with the manifest check of each
  // artifact (empty: not checked). Held until the job succeeds or the attempt ends.
  void Stage(const std::string& attempt_id,
             const google::protobuf::RepeatedPtrField<v1::OutputArtifact>& artifacts,
             std::vector<ManifestCheck> checks) ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_->mu);
  // The job succeeded: registers what its current attempt staged, with the job's last
  // metric values. A job that made no checkpoint (an eval) credits its values to the
  // checkpoints its spec reads.
  void JobSucceeded(const v1::Job& job, Changes* changes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_->mu);
  // Drops what an attempt that ended without success staged.
  void OnTransition(const v1::Job& job, v1::JobState from, v1::JobState to)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_->mu);

  // Lookups for the other domains. Find takes an id ("a-12") or the path of a present one.
  const v1::Artifact* Find(const std::string& id_or_path) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_->mu);
  std::vector<const v1::Artifact*> FindByManifest(const std::string& sha256) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_->mu);
  std::vector<const v1::Artifact*> FindByJob(const std::string& job_id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_->mu);
  // Ids of the artifacts a spec refers to: `ckpt:ID`, a present artifact's path, or a
  // path inside one, however spelled: absolute paths normalised lexically, a relative one
  // (below a worker's storage root) under every root the workers reported.
  std::vector<std::string> ReferencedBy(const v1::JobSpec& spec) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_->mu);
  // The storage roots the registered workers reported.
  std::vector<std::string> StorageRoots() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_->mu);
  size_t size() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_->mu) { return by_id_.size(); }
  // Why `job` must not be served from the outputs of the succeeded `source` (memoization), or
  // "" when it may: the two owners share (tenancy.h), every artifact `source` registered is
  // still PRESENT (not deleted, not replaced by another at its path), and its files are as
  // they were at registration (size, mtime, ctime, inode) or, where any changed, still hash to
  // its manifest (a full check). Also refused: a job whose own absolute output lies outside
  // every storage root (it would never have been allowed to run). Reads the file system.
  std::string CacheRefusal(const v1::Job& source, const v1::Job& job) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_->mu);

  // The file checks of CacheRefusal, made before a submit takes the lock for good
  // (UserOperations::Submit): HitArtifacts copies, under the lock, the artifacts that the
  // jobs of these cache keys would be served from; CheckFiles reads their files without the
  // lock; InstallVerdicts (under the lock, just before the submit; ClearVerdicts after)
  // lets CacheRefusal take a verdict instead of reading the files again, for an artifact
  // whose record is still as it was checked (VerdictHolds): re-validated under the lock, so a
  // record replaced, deleted or re-stamped in between is read again there.
  struct FileVerdict {
    v1::Artifact checked;  // the record as it was when its files were read
    std::string problem;   // "" when the files were as registered or hash to the manifest
  };
  std::vector<v1::Artifact> HitArtifacts(const std::vector<std::string>& cache_keys) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_->mu);
  static std::vector<FileVerdict> CheckFiles(std::vector<v1::Artifact> artifacts);
  static bool VerdictHolds(const v1::Artifact& now, const v1::Artifact& checked);
  void InstallVerdicts(std::vector<FileVerdict> verdicts) ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_->mu);
  void ClearVerdicts() ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_->mu) { verdicts_.clear(); }

  // User operations. NOT_FOUND for an unknown id; INVALID_ARGUMENT naming the field.
  absl::StatusOr<v1::ListArtifactsResponse> List(const v1::ListArtifactsRequest& request);
  absl::StatusOr<v1::ArtifactDetails> Get(const std::string& id);
  absl::StatusOr<v1::LineageResponse> Lineage(const v1::LineageRequest& request);
  // Reads the files (outside the lock) and records the result.
  absl::StatusOr<v1::VerifyArtifactResponse> Verify(const std::string& id);
  // `key`: an idempotency key (UserHandler::PinArtifact).
  absl::StatusOr<v1::Artifact> Pin(const std::string& id, bool unpin, const std::string& key = "");
  // Plans with gc_policy.h; with apply, removes the files (outside the lock) and records
  // each deleted artifact as DELETED with the rule that deleted it.
  absl::StatusOr<v1::GcResponse> CollectGarbage(const v1::GcRequest& request);

 private:
  struct Staged {
    v1::OutputArtifact output;
    ManifestCheck check;
  };
  // Adds or replaces a record, keeping the indexes, and queues it for the next commit.
  v1::Artifact* Put(v1::Artifact artifact, Changes* changes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_->mu);
  // `inserted`: the record is new (else only its state or hash may have changed).
  void Index(const v1::Artifact& artifact, bool inserted) ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_->mu);
  std::vector<std::string> ReferencedBy(const v1::JobSpec& spec,
                                        const std::vector<std::string>& roots) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_->mu);
  // The registered artifacts the spec's input-model and input-path fields name (the path, or
  // the artifact a path lies in), or an exec job's declared inputs name: the parents
  // JobSucceeded gives the job's outputs.
  std::vector<std::string> InputsOf(const v1::JobSpec& spec) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_->mu);
  // Ids of the artifacts these strings name (ReferencedBy's rules).
  std::vector<std::string> IdsAt(const std::vector<std::string>& strings,
                                 const std::vector<std::string>& roots) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_->mu);
  // What `job` reads or will read: ReferencedBy its spec, and, by id, every artifact its
  // dependencies (and the twin it waits for) registered, whatever the spec spells yet (a
  // cell still waiting for another upstream holds a wiring token, not the path).
  std::vector<std::string> ReadBy(const v1::Job& job, const std::vector<std::string>& roots) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_->mu);
  // The id of the present artifact at `path`, registering an external one if none.
  std::string ResolveParent(const std::string& path, Changes* changes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_->mu);

  CoordinatorCore* const core_;
  MetricSeries* const series_;
  absl::node_hash_map<std::string, v1::Artifact> by_id_ ABSL_GUARDED_BY(core_->mu);
  // Cache key -> the job that last SUCCEEDED running under it (the memoizer's entry, as far as
  // the registry can tell: a mismatch only costs a check under the lock).
  absl::flat_hash_map<std::string, std::string> by_cache_key_ ABSL_GUARDED_BY(core_->mu);
  // Artifact id -> its file check made before the lock (InstallVerdicts .. ClearVerdicts).
  absl::flat_hash_map<std::string, FileVerdict> verdicts_ ABSL_GUARDED_BY(core_->mu);
  std::vector<std::string> order_ ABSL_GUARDED_BY(core_->mu);  // ids by seq
  absl::flat_hash_map<std::string, std::string> by_path_ ABSL_GUARDED_BY(core_->mu);
  absl::flat_hash_map<std::string, std::vector<std::string>> by_manifest_
      ABSL_GUARDED_BY(core_->mu);
  absl::flat_hash_map<std::string, std::vector<std::string>> by_job_ ABSL_GUARDED_BY(core_->mu);
  absl::flat_hash_map<std::string, std::vector<std::string>> children_ ABSL_GUARDED_BY(core_->mu);
  absl::flat_hash_map<std::string, std::vector<Staged>> staged_ ABSL_GUARDED_BY(core_->mu);
  uint64_t next_seq_ ABSL_GUARDED_BY(core_->mu) = 1;
};

}  // namespace stemma::coordinator
