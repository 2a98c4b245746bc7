// Wiring of outputs into inputs: an experiment cell's spec holds a token
// "${{ <job name>.outputs.<output> }}" (experiments::OutputToken) where it reads an upstream
// job's output; when the cell is released, JobTable replaces each token with the path that
// job reported. Early stopping drops the reads of trials that were stopped.
//
// Pure functions over the spec (no store, no clock, no files).
#pragma once

#include <functional>
#include <set>
#include <string>

#include "absl/status/status.h"
#include "google/protobuf/map.h"
#include "stemma/v1/job.pb.h"

namespace stemma::coordinator {

// Replaces every wiring token in `spec`'s engine spec with the output path that job
// reported. `outputs_of(job name)` returns that job's outputs map, or null when the job is
// not one of this job's dependencies. FailedPrecondition naming the job and output when an
// output is missing.
// `${{ self.id }}` (in an output path the expansion chose) becomes `self_id`.
absl::Status WireInputs(
    v1::JobSpec* spec,
    const std::function<const google::protobuf::Map<std::string, std::string>*(const std::string&)>&
        outputs_of,
    const std::string& self_id = "");

// Early stopping: removes from `spec`'s engine spec every list item that reads an output of
// a job named in `pruned` (a fan-in reads the survivors only). False, with the job's name in
// `*pruned_read`, when the spec reads one of them outside a list item (one-to-one: the job
// has nothing to run on) or a list it reads them in would be left empty.
bool DropReadsOf(v1::JobSpec* spec, const std::set<std::string>& pruned, std::string* pruned_read);

}  // namespace stemma::coordinator
