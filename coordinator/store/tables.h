// The coordinator's durable tables, each described once. The batch the committer hands to a
// store, the snapshot a store loads, both stores and the committer's merge step all iterate
// `DurableTables`: a new table is one descriptor here plus its name in that list.
//
// A descriptor is a type with:
//   using Record;  using Key;           the row type and its identity (later rows of a key
//                                       replace earlier ones; unused for series tables)
//   kName, kKind, kSince, kSchema       SQL table name; kState (upserted, loaded whole at
//                                       start) or kSeries (append-only, never loaded, read
//                                       by queries); the schema version that created it and
//                                       the SQL that does (run by the SQLite migration)
//   kColumns, kConflict, kOrderBy       columns in the order Write/Read use; the upsert key
//                                       column; the load order
//   Key KeyOf(const Record&)            identity
//   bool LoadsBefore(a, b)              the load order, for stores that sort themselves
//   void Write(const Record&, RowWriter*)   every column, in order
//   absl::StatusOr<Record> Read(const RowReader&)   DATA_LOSS naming the row when it does not parse
//   std::string Describe(const Record&)      for error messages ("job j-12")
#pragma once

#include <cstdint>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "stemma/v1/experiment.pb.h"
#include "stemma/v1/job.pb.h"
#include "stemma/v1/user_service.pb.h"

namespace stemma::coordinator {

enum class ColumnType { kInt, kReal, kText, kBlob };
struct Column {
  const char* name;
  ColumnType type;
};

enum class TableKind {
  kState,   // keyed upserts, loaded whole at start (the in-memory working set)
  kSeries,  // append-only rows, never loaded; the store answers queries over them
};

// Receives one record's columns, in the descriptor's column order.
class RowWriter {
 public:
  virtual void Int(int64_t value) = 0;
  virtual void Real(double value) = 0;
  virtual void Text(absl::string_view value) = 0;
  // Text whose bytes stay valid until the row is written (a field of the record itself):
  // the store need not copy them.
  virtual void TextRef(absl::string_view value) { Text(value); }
  virtual void Blob(absl::string_view value) = 0;

 protected:
  ~RowWriter() = default;
};

// One stored row's columns, by index in the descriptor's column order.
class RowReader {
 public:
  virtual int64_t Int(int column) const = 0;
  virtual double Real(int column) const = 0;
  virtual absl::string_view Text(int column) const = 0;
  virtual absl::string_view Blob(int column) const = 0;

 protected:
  ~RowReader() = default;
};

// ------------------------------------------------------------------------ tables

struct JobsTable {
  using Record = v1::Job;
  using Key = std::string;  // the id
  static constexpr const char* kName = "jobs";
  static constexpr TableKind kKind = TableKind::kState;
  static constexpr int kSince = 1;
  static constexpr const char* kSchema = R"sql(
CREATE TABLE jobs (
  seq INTEGER PRIMARY KEY,       -- submission order; the id is "j-<seq>"
  id TEXT NOT NULL,
  state TEXT NOT NULL,
  experiment TEXT NOT NULL DEFAULT '',
  record BLOB NOT NULL           -- stemma.v1.Job
);)sql";  // + owner (kAddedColumns)
  static constexpr Column kColumns[] = {
      {"seq", ColumnType::kInt},     {"id", ColumnType::kText},
      {"state", ColumnType::kText},  {"experiment", ColumnType::kText},
      {"record", ColumnType::kBlob}, {"owner", ColumnType::kText}};
  static constexpr const char* kConflict = "seq";
  static constexpr const char* kOrderBy = "seq";
  static Key KeyOf(const Record& r) { return r.id(); }
  static bool LoadsBefore(const Record& a, const Record& b) { return a.seq() < b.seq(); }
  static void Write(const Record& r, RowWriter* w);
  static absl::StatusOr<Record> Read(const RowReader& r);
  static std::string Describe(const Record& r) { return "job " + r.id(); }
};

struct WorkersTable {
  using Record = v1::WorkerInfo;
  using Key = std::string;
  static constexpr const char* kName = "workers";
  static constexpr TableKind kKind = TableKind::kState;
  static constexpr int kSince = 1;
  static constexpr const char* kSchema = R"sql(
CREATE TABLE workers (
  id TEXT PRIMARY KEY,
  record BLOB NOT NULL           -- stemma.v1.WorkerInfo
);)sql";
  static constexpr Column kColumns[] = {{"id", ColumnType::kText}, {"record", ColumnType::kBlob}};
  static constexpr const char* kConflict = "id";
  static constexpr const char* kOrderBy = "id";
  static Key KeyOf(const Record& r) { return r.id(); }
  static bool LoadsBefore(const Record& a, const Record& b) { return a.id() < b.id(); }
  static void Write(const Record& r, RowWriter* w);
  static absl::StatusOr<Record> Read(const RowReader& r);
  static std::string Describe(const Record& r) { return "worker " + r.id(); }
};

// Idempotency key -> the job ids its request created.
struct IdempotencyKeysTable {
  using Record = std::pair<std::string, std::vector<std::string>>;
  using Key = std::string;
  static constexpr const char* kName = "idempotency_keys";
  static constexpr TableKind kKind = TableKind::kState;
  static constexpr int kSince = 1;
  static constexpr const char* kSchema = R"sql(
CREATE TABLE idempotency_keys (
  key TEXT PRIMARY KEY,
  job_ids TEXT NOT NULL          -- comma-separated
);)sql";
  static constexpr Column kColumns[] = {{"key", ColumnType::kText}, {"job_ids", ColumnType::kText}};
  static constexpr const char* kConflict = "key";
  static constexpr const char* kOrderBy = "key";
  static Key KeyOf(const Record& r) { return r.first; }
  static bool LoadsBefore(const Record& a, const Record& b) { return a.first < b.first; }
  static void Write(const Record& r, RowWriter* w);
  static absl::StatusOr<Record> Read(const RowReader& r);
  static std::string Describe(const Record& r) { return "idempotency key " + r.first; }
};

// Consecutive points of one series (job, attempt, name, labels) reported together: the
// unit a transaction appends. Points keep their order.
struct MetricRun {
  std::string job_id;
  int32_t attempt = 0;
  std::string name;
  std::vector<std::pair<std::string, std::string>> labels;  // sorted by key
  std::vector<int64_t> steps;
  std::vector<double> values;
  std::vector<int64_t> times_ms;
  size_t size() const { return steps.size(); }
};

// The engine's step and metric events. Append-only and not loaded; a row holds the points
// of one series that one transaction appended, as packed columns (at ~100 points per job,
// a row per point cost the coordinator ~2 us per point in SQLite alone: more than the rest
// of the path).
struct MetricPointsTable {
  using Record = MetricRun;
  using Key = int;  // unused: rows are never replaced
  static constexpr const char* kName = "metric_points";
  static constexpr TableKind kKind = TableKind::kSeries;
  static constexpr int kSince = 2;
  static constexpr const char* kSchema = R"sql(
CREATE TABLE metric_points (
  job TEXT NOT NULL,
  attempt INTEGER NOT NULL,
  name TEXT NOT NULL,
  labels TEXT NOT NULL DEFAULT '', -- k=v pairs joined by \x1f, sorted by key
  points INTEGER NOT NULL,         -- how many points the row holds
  last_step INTEGER NOT NULL,
  steps BLOB NOT NULL,             -- int64 per point, little-endian
  vals BLOB NOT NULL,              -- float64 per point
  times_ms BLOB NOT NULL           -- int64 per point: when the worker read it (epoch ms)
);
CREATE INDEX metric_points_by_job ON metric_points(job, name);)sql";
  static constexpr Column kColumns[] = {
      {"job", ColumnType::kText},     {"attempt", ColumnType::kInt},
      {"name", ColumnType::kText},    {"labels", ColumnType::kText},
      {"points", ColumnType::kInt},   {"last_step", ColumnType::kInt},
      {"steps", ColumnType::kBlob},   {"vals", ColumnType::kBlob},
      {"times_ms", ColumnType::kBlob}};
  static constexpr const char* kConflict = nullptr;
  static constexpr const char* kOrderBy = "rowid";
  static Key KeyOf(const Record&) { return 0; }
  static bool LoadsBefore(const Record&, const Record&) { return false; }
  static void Write(const Record& r, RowWriter* w);
  static absl::StatusOr<Record> Read(const RowReader& r);
  static std::string Describe(const Record& r) { return "metric points of " + r.job_id; }
  // Point i of a run as the API's message.
  static v1::MetricPoint Point(const Record& r, size_t i);
};

// The checkpoint registry: one row per registered artifact (checkpoint, dataset, file).
struct ArtifactsTable {
  using Record = v1::Artifact;
  using Key = std::string;  // the id
  static constexpr const char* kName = "artifacts";
  static constexpr TableKind kKind = TableKind::kState;
  static constexpr int kSince = 2;
  static constexpr const char* kSchema = R"sql(
CREATE TABLE artifacts (
  seq INTEGER PRIMARY KEY,       -- registration order; the id is "a-<seq>"
  id TEXT NOT NULL,
  path TEXT NOT NULL,
  manifest_sha256 TEXT NOT NULL,
  job TEXT NOT NULL,             -- the producing job ('' for external artifacts)
  experiment TEXT NOT NULL,
  state TEXT NOT NULL,
  record BLOB NOT NULL           -- stemma.v1.Artifact
);
CREATE INDEX artifacts_by_manifest ON artifacts(manifest_sha256);
CREATE INDEX artifacts_by_job ON artifacts(job);
CREATE INDEX artifacts_by_path ON artifacts(path);)sql";  // + owner (kAddedColumns)
  static constexpr Column kColumns[] = {
      {"seq", ColumnType::kInt},    {"id", ColumnType::kText},
      {"path", ColumnType::kText},  {"manifest_sha256", ColumnType::kText},
      {"job", ColumnType::kText},   {"experiment", ColumnType::kText},
      {"state", ColumnType::kText}, {"record", ColumnType::kBlob},
      {"owner", ColumnType::kText}};
  static constexpr const char* kConflict = "seq";
  static constexpr const char* kOrderBy = "seq";
  static Key KeyOf(const Record& r) { return r.id(); }
  static bool LoadsBefore(const Record& a, const Record& b) { return a.seq() < b.seq(); }
  static void Write(const Record& r, RowWriter* w);
  static absl::StatusOr<Record> Read(const RowReader& r);
  static std::string Describe(const Record& r) { return "artifact " + r.id(); }
};

// Early stopping: one trial's value at one rung of its bracket and the decision made then
// (coordinator/early_stopper.h). Loaded at start, so a restarted coordinator neither loses
// a decision nor makes one twice.
struct EarlyStopRungsTable {
  using Record = v1::RungRecord;
  using Key = std::string;  // "<job id>/<rung>"
  static constexpr const char* kName = "early_stop_rungs";
  static constexpr TableKind kKind = TableKind::kState;
  static constexpr int kSince = 3;
  static constexpr const char* kSchema = R"sql(
CREATE TABLE early_stop_rungs (
  key TEXT PRIMARY KEY,          -- <job id>/<rung index>
  bracket TEXT NOT NULL,         -- experiment/stage/revision
  job TEXT NOT NULL,
  stopped INTEGER NOT NULL,
  record BLOB NOT NULL           -- stemma.v1.RungRecord
);)sql";
  static constexpr Column kColumns[] = {{"key", ColumnType::kText},
                                        {"bracket", ColumnType::kText},
                                        {"job", ColumnType::kText},
                                        {"stopped", ColumnType::kInt},
                                        {"record", ColumnType::kBlob}};
  static constexpr const char* kConflict = "key";
  static constexpr const char* kOrderBy = "rowid";  // the order decisions were made in
  static Key KeyOf(const Record& r) { return r.job_id() + "/" + std::to_string(r.rung()); }
  static bool LoadsBefore(const Record& a, const Record& b) {
    return a.decided_ms() < b.decided_ms();
  }
  static void Write(const Record& r, RowWriter* w) {
    w->Text(KeyOf(r));
    w->TextRef(r.bracket());
    w->TextRef(r.job_id());
    w->Int(r.stopped() ? 1 : 0);
    w->Blob(r.SerializeAsString());
  }
  static absl::StatusOr<Record> Read(const RowReader& r) {
    Record rec;
    absl::string_view blob = r.Blob(4);
    if (!rec.ParseFromArray(blob.data(), static_cast<int>(blob.size()))) {
      return absl::DataLossError(
          absl::StrCat("early-stop rung record ", std::string(r.Text(0)), " does not parse"));
    }
    return rec;
  }
  static std::string Describe(const Record& r) { return "early-stop rung " + KeyOf(r); }
};

// Attempt history (`stemma get`): an attempt's record once a newer attempt of its job has
// replaced it as Job.current (the current one lives in the job's record). Loaded at start.
struct AttemptsTable {
  using Record = v1::Attempt;
  using Key = std::string;  // the attempt id "<job id>.<n>"
  static constexpr const char* kName = "attempts";
  static constexpr TableKind kKind = TableKind::kState;
  static constexpr int kSince = 5;
  static constexpr const char* kSchema = R"sql(
CREATE TABLE attempts (
  id TEXT PRIMARY KEY,           -- <job id>.<n>
  job TEXT NOT NULL,
  record BLOB NOT NULL           -- stemma.v1.Attempt
);
CREATE INDEX attempts_by_job ON attempts(job);)sql";
  static constexpr Column kColumns[] = {
      {"id", ColumnType::kText}, {"job", ColumnType::kText}, {"record", ColumnType::kBlob}};
  static constexpr const char* kConflict = "id";
  static constexpr const char* kOrderBy = "rowid";
  static Key KeyOf(const Record& r) { return r.id(); }
  static bool LoadsBefore(const Record& a, const Record& b) { return a.number() < b.number(); }
  // "j-12.3" -> "j-12".
  static std::string JobOf(const Record& r) { return r.id().substr(0, r.id().rfind('.')); }
  static void Write(const Record& r, RowWriter* w) {
    w->TextRef(r.id());
    w->Text(JobOf(r));
    w->Blob(r.SerializeAsString());
  }
  static absl::StatusOr<Record> Read(const RowReader& r) {
    Record rec;
    absl::string_view blob = r.Blob(2);
    if (!rec.ParseFromArray(blob.data(), static_cast<int>(blob.size()))) {
      return absl::DataLossError(
          absl::StrCat("attempt record ", std::string(r.Text(0)), " does not parse"));
    }
    return rec;
  }
  static std::string Describe(const Record& r) { return "attempt " + r.id(); }
};

template <typename... T>
struct TableList {};

// A column added to a table after the version that created it. The SQLite migration adds
// it (ALTER TABLE ADD COLUMN, unless the table already has it) when it takes a database to
// version `since`; a descriptor lists it in kColumns like any other.
struct AddedColumn {
  const char* table;
  const char* column;
  const char* declaration;
  int since;
};
// Version 4: who owns each job and artifact (docs/tenancy.md). Rows written before it say
// '' in the column; their records are filled from the job's stemma.owner label on load.
inline constexpr AddedColumn kAddedColumns[] = {
    {"jobs", "owner", "TEXT NOT NULL DEFAULT ''", 4},
    {"artifacts", "owner", "TEXT NOT NULL DEFAULT ''", 4},
};

// Every durable table. Adding one: its descriptor above, and its name here.
using DurableTables = TableList<JobsTable, WorkersTable, IdempotencyKeysTable, MetricPointsTable,
                                ArtifactsTable, EarlyStopRungsTable, AttemptsTable>;

namespace internal {
template <typename T, typename... Ts>
constexpr size_t IndexOf() {
  constexpr bool same[] = {std::is_same_v<T, Ts>...};
  for (size_t i = 0; i < sizeof...(Ts); ++i) {
    if (same[i]) return i;
  }
  return sizeof...(Ts);
}
template <typename... T>
constexpr int MaxSince(TableList<T...>) {
  int v = 0;
  ((v = T::kSince > v ? T::kSince : v), ...);
  for (const AddedColumn& c : kAddedColumns) v = c.since > v ? c.since : v;
  return v;
}
}  // namespace internal

// The schema version the tables and added columns add up to.
inline constexpr int kSchemaVersion = internal::MaxSince(DurableTables{});

// Rows for every table of a list, by table: `rows.of<JobsTable>()`.
template <typename List>
class TableRows;
template <typename... T>
class TableRows<TableList<T...>> {
 public:
  template <typename Table>
  std::vector<typename Table::Record>& of() {
    static_assert(internal::IndexOf<Table, T...>() < sizeof...(T), "not a durable table");
    return std::get<internal::IndexOf<Table, T...>()>(rows_);
  }
  template <typename Table>
  const std::vector<typename Table::Record>& of() const {
    static_assert(internal::IndexOf<Table, T...>() < sizeof...(T), "not a durable table");
    return std::get<internal::IndexOf<Table, T...>()>(rows_);
  }
  // f(Table{}, rows) for every table, in list order.
  template <typename F>
  void ForEach(F&& f) {
    (f(T{}, of<T>()), ...);
  }
  template <typename F>
  void ForEach(F&& f) const {
    (f(T{}, of<T>()), ...);
  }
  bool empty() const { return (of<T>().empty() && ...); }
  size_t size() const { return (of<T>().size() + ...); }

 private:
  std::tuple<std::vector<typename T::Record>...> rows_;
};

// A set of writes applied atomically: upserts (later puts of a key win) and appends.
using StoreBatch = TableRows<DurableTables>;
// What Load() returns: every state table's rows in load order; series tables stay empty.
using StoreSnapshot = TableRows<DurableTables>;

}  // namespace stemma::coordinator
