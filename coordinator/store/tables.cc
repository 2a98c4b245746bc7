#include "coordinator/store/tables.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

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
}

absl::StatusOr<v1::Job> JobsTable::Read(const RowReader& r) {
  return ParseRecord<v1::Job>(r.Blob(4), "job", r.Text(1));
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

void MetricPointsTable::Write(const Record& r, RowWriter* w) {
  w->TextRef(r.job_id());
  w->Int(r.attempt());
  w->TextRef(r.name());
  w->Int(r.step());
  w->Real(r.value());
  if (r.labels().empty()) {
    w->TextRef("");
  } else {
    std::vector<std::pair<std::string, std::string>> labels(r.labels().begin(), r.labels().end());
    std::sort(labels.begin(), labels.end());
    w->Text(absl::StrJoin(labels, std::string(1, kLabelSeparator),
                          absl::PairFormatter("=")));
  }
  w->Int(r.time_ms());
}

absl::StatusOr<v1::MetricPoint> MetricPointsTable::Read(const RowReader& r) {
  v1::MetricPoint p;
  p.set_job_id(std::string(r.Text(0)));
  p.set_attempt(static_cast<int32_t>(r.Int(1)));
  p.set_name(std::string(r.Text(2)));
  p.set_step(r.Int(3));
  p.set_value(r.Real(4));
  absl::string_view labels = r.Text(5);
  if (!labels.empty()) {
    for (absl::string_view kv : absl::StrSplit(labels, kLabelSeparator)) {
      auto eq = kv.find('=');
      if (eq == absl::string_view::npos) {
        return absl::DataLossError(absl::StrCat("metric point of ", p.job_id(), " (", p.name(),
                                                "): label '", kv, "' has no '='"));
      }
      (*p.mutable_labels())[std::string(kv.substr(0, eq))] = std::string(kv.substr(eq + 1));
    }
  }
  p.set_time_ms(r.Int(6));
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
}

absl::StatusOr<v1::Artifact> ArtifactsTable::Read(const RowReader& r) {
  return ParseRecord<v1::Artifact>(r.Blob(7), "artifact", r.Text(1));
}

}  // namespace stemma::coordinator
