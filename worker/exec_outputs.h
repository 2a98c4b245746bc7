// The declared outputs of an exec job (issue 23; ExecSpec.outputs): once its program has
// exited 0, each declared output must exist, and the worker computes its manifest and reports
// it as an OutputArtifact, as the engine's `output` events do for engine jobs, so that the
// coordinator registers it (lineage, `ckpt show`, gc, `stemma report`).
//
//   checkpoint  a Hugging Face directory (config.json and model.safetensors or its index).
//               Without a stemma.json the worker writes one (common/manifest.h: sha256 and
//               bytes of every file below the directory, the inputs that have manifests as
//               parents, producer {job, attempt, command: "exec", params: {argv}}, type
//               checkpoint), atomically; one the program wrote during the attempt is taken
//               as it is (one older than the attempt is a previous run's: replaced). The
//               artifact's manifest hash is the sha256 of that stemma.json, as for the engine.
//   dataset     a directory: the same manifest with type dataset; a file: its own sha256.
//   results     a results JSON in the eval's format (docs/eval.md, "format":
//               "stemma-eval-v1"); its metrics become the job's metric points
//               (`<metric>/<task>` with labels task, type, language), as an eval's do. The
//               artifact is a file (its sha256), named as declared.
//   file        any regular file: its sha256.
//
// Paths: an absolute path is taken as it is; a relative one is below the worker's storage
// root (as engine output paths are), or below the attempt directory when the worker has none.
// The same resolution gives the program STEMMA_OUTPUT_<NAME> (spawn_plan.h).
//
// Thread-safety: no state; the functions read and write files, so the executor calls them
// without its lock.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "stemma/v1/job.pb.h"
#include "stemma/v1/worker_service.pb.h"

namespace stemma::worker {

// `path` resolved as above.
std::string ResolveExecPath(const std::string& path, const std::string& storage_root,
                            const std::string& workdir);

// The environment variable that gives a program its declared output `name`:
// STEMMA_OUTPUT_<NAME upper-cased>.
std::string ExecOutputVariable(const std::string& name);

// A metric point that a results output reported.
struct ResultPoint {
  std::string name;  // acc/belebele_uk
  double value = 0;
  std::map<std::string, std::string> labels;  // task, type, language (when given)
};

struct ExecOutputs {
  std::string error;  // non-empty: the attempt fails with it (the first problem found)
  std::vector<v1::OutputArtifact> artifacts;  // by output name
  std::vector<ResultPoint> points;            // from results outputs
};

// Checks and manifests every declared output of `spec` (an exec job) for attempt
// `attempt_id` of job `job_id`, in output-name order. Outputs of no declared name are not
// looked at. A missing output, a checkpoint without config.json or weights, a results file
// that is not in the results format, an unreadable file: `error` names the output, its type
// and path ("declared output 'model' (checkpoint) is missing: /root/bob/m").
// `started_ms`: when the attempt started (wall clock, ms).
ExecOutputs CollectExecOutputs(const v1::JobSpec& spec, const std::string& job_id,
                               const std::string& attempt_id, const std::string& storage_root,
                               const std::string& workdir, int64_t started_ms);

}  // namespace stemma::worker
