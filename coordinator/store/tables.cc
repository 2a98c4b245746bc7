#include "coordinator/store/tables.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/auth.h"
#include "common/status.h"

namespace stemma::coordinator {
namespace {

template <typename Message>
absl::StatusOr<Message> ParseRecord(absl::string_view blob, absl::string_view what,
                                    absl::string_view key) {
  Message m;
  if (!m.ParseFromArray(blob.data(), static_cast<int>(blob.size()))) {
    return absl::DataLossError(absl::StrCat(what, " record ", key, " does not parse"));
  }
  return m;
}

std::string Serialize(const google::protobuf::MessageLite& m) {
  std::string out;
  m.SerializeToString(&out);
  return out;
}

constexpr char kLabelSeparator = '\x1f';

}  // namespace

void JobsTable::Write(const Record& r, RowWriter* w) {
  w->Int(static_cast<int64_t>(r.seq()));
  w->TextRef(r.id());
  w->TextRef(v1::JobState_Name(r.state()));  // a static string
  w->TextRef(r.spec().experiment());
  w->Blob(Serialize(r));
  w->TextRef(r.owner());
}

absl::StatusOr<v1::Job> JobsTable::Read(const RowReader& r) {
  ASSIGN_OR_RETURN(v1::Job job, ParseRecord<v1::Job>(r.Blob(4), "job", r.Text(1)));
  // Written before version 4: the owner was only the label the coordinator set.
  if (job.owner().empty()) {
    auto it = job.spec().labels().find(kOwnerLabel);
    if (it != job.spec().labels().end()) job.set_owner(it->second);
  }
  return job;
}

void WorkersTable::Write(const Record& r, RowWriter* w) {
  w->Text(r.id());
  w->Blob(Serialize(r));
}

absl::StatusOr<v1::WorkerInfo> WorkersTable::Read(const RowReader& r) {
  return ParseRecord<v1::WorkerInfo>(r.Blob(1), "worker", r.Text(0));
}

void IdempotencyKeysTable::Write(const Record& r, RowWriter* w) {
  w->Text(r.first);
  w->Text(absl::StrJoin(r.second, ","));
}

absl::StatusOr<IdempotencyKeysTable::Record> IdempotencyKeysTable::Read(const RowReader& r) {
  std::vector<std::string> ids = absl::StrSplit(r.Text(1), ',', absl::SkipEmpty());
  return Record(std::string(r.Text(0)), std::move(ids));
}

namespace {

template <typename T>
absl::string_view Bytes(const std::vector<T>& v) {
  return absl::string_view(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

template <typename T>
bool Unpack(absl::string_view blob, size_t n, std::vector<T>* out) {
  if (blob.size() != n * sizeof(T)) return false;
  out->resize(n);
  if (n > 0) std::memcpy(out->data(), blob.data(), blob.size());
  return true;
}

}  // namespace

void MetricPointsTable::Write(const Record& r, RowWriter* w) {
  w->TextRef(r.job_id);
  w->Int(r.attempt);
  w->TextRef(r.name);
  if (r.labels.empty()) {
    w->TextRef("");
  } else {
    w->Text(absl::StrJoin(r.labels, std::string(1, kLabelSeparator), absl::PairFormatter("=")));
  }
  w->Int(static_cast<int64_t>(r.size()));
  w->Int(r.steps.empty() ? 0 : r.steps.back());
  w->Blob(Bytes(r.steps));
  w->Blob(Bytes(r.values));
  w->Blob(Bytes(r.times_ms));
}

absl::StatusOr<MetricRun> MetricPointsTable::Read(const RowReader& r) {
  MetricRun run;
  run.job_id = std::string(r.Text(0));
  run.attempt = static_cast<int32_t>(r.Int(1));
  run.name = std::string(r.Text(2));
  absl::string_view labels = r.Text(3);
  if (!labels.empty()) {
    for (absl::string_view kv : absl::StrSplit(labels, kLabelSeparator)) {
      auto eq = kv.find('=');
      if (eq == absl::string_view::npos) {
        return absl::DataLossError(absl::StrCat("metric points of ", run.job_id, " (", run.name,
                                                "): label '", kv, "' has no '='"));
      }
      run.labels.emplace_back(std::string(kv.substr(0, eq)), std::string(kv.substr(eq + 1)));
    }
  }
  const int64_t n = r.Int(4);
  if (n < 0 || !Unpack(r.Blob(6), n, &run.steps) || !Unpack(r.Blob(7), n, &run.values) ||
      !Unpack(r.Blob(8), n, &run.times_ms)) {
    return absl::DataLossError(absl::StrCat("metric points of ", run.job_id, " (", run.name,
                                            "): the packed columns do not hold ", n, " points"));
  }
  return run;
}

v1::MetricPoint MetricPointsTable::Point(const Record& r, size_t i) {
  v1::MetricPoint p;
  p.set_job_id(r.job_id);
  p.set_attempt(r.attempt);
  p.set_name(r.name);
  p.set_step(r.steps[i]);
  p.set_value(r.values[i]);
  p.set_time_ms(r.times_ms[i]);
  for (const auto& [k, v] : r.labels) (*p.mutable_labels())[k] = v;
  return p;
}

void ArtifactsTable::Write(const Record& r, RowWriter* w) {
  w->Int(static_cast<int64_t>(r.seq()));
  w->Text(r.id());
  w->Text(r.path());
  w->Text(r.manifest_sha256());
  w->Text(r.job_id());
  w->Text(r.experiment());
  w->Text(v1::ArtifactState_Name(r.state()));
  w->Blob(Serialize(r));
  w->TextRef(r.owner());
}

absl::StatusOr<v1::Artifact> ArtifactsTable::Read(const RowReader& r) {
  return ParseRecord<v1::Artifact>(r.Blob(7), "artifact", r.Text(1));
}

}  // namespace stemma::coordinator
