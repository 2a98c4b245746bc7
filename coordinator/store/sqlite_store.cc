// The SQLite backend: the only file in the project that includes <sqlite3.h>.
#include <fcntl.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/files.h"
#include "common/logging.h"
#include "common/status.h"
#include "coordinator/store/store.h"

namespace stemma::coordinator {
namespace {

// Statements run after the tables of a version are created, to take the database from
// version i to i + 1 (index i). Tables themselves come from their descriptors (kSince).
const char* const kMigrationExtras[] = {
    "", "", "", "CREATE INDEX IF NOT EXISTS jobs_by_owner ON jobs(owner)", ""};
static_assert(sizeof(kMigrationExtras) / sizeof(kMigrationExtras[0]) == kSchemaVersion);

// "INSERT INTO t(a, b, c) VALUES(?1, ?2, ?3) ON CONFLICT(a) DO UPDATE SET b=excluded.b, ..."
template <typename T>
std::string PutSql() {
  std::vector<std::string> names, params, updates;
  int i = 0;
  for (const Column& c : T::kColumns) {
    names.push_back(c.name);
    params.push_back(absl::StrCat("?", ++i));
    if (T::kConflict != nullptr && std::string(c.name) != T::kConflict) {
      updates.push_back(absl::StrCat(c.name, "=excluded.", c.name));
    }
  }
  std::string sql = absl::StrCat("INSERT INTO ", T::kName, "(", absl::StrJoin(names, ", "),
                                 ") VALUES(", absl::StrJoin(params, ", "), ")");
  if (T::kConflict != nullptr) {
    absl::StrAppend(&sql, " ON CONFLICT(", T::kConflict, ") DO UPDATE SET ",
                    absl::StrJoin(updates, ", "));
  }
  return sql;
}

template <typename... T>
constexpr size_t CountTables(TableList<T...>) {
  return sizeof...(T);
}

template <typename T>
std::string LoadSql() {
  std::vector<std::string> names;
  for (const Column& c : T::kColumns) names.push_back(c.name);
  return absl::StrCat("SELECT ", absl::StrJoin(names, ", "), " FROM ", T::kName, " ORDER BY ",
                      T::kOrderBy);
}

class Statement {
 public:
  Statement() = default;
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;
  ~Statement() { sqlite3_finalize(stmt_); }
  sqlite3_stmt** out() { return &stmt_; }
  sqlite3_stmt* get() const { return stmt_; }

 private:
  sqlite3_stmt* stmt_ = nullptr;
};

// Thread-compatible: the committer thread is the only caller after Load().
class SqliteStore final : public Store {
 public:
  explicit SqliteStore(std::string path) : path_(std::move(path)) {}
  // close_v2 defers the close until the member statements are finalized.
  ~SqliteStore() override {
    {
      std::lock_guard<std::mutex> lock(checkpoint_mu_);
      stop_checkpoints_ = true;
    }
    checkpoint_cv_.notify_all();
    if (checkpointer_.joinable()) checkpointer_.join();
    if (checkpoint_db_) sqlite3_close_v2(checkpoint_db_);
    if (read_db_) sqlite3_close_v2(read_db_);
    sqlite3_close_v2(db_);
  }

  absl::Status Open() {
    // The database holds job secrets (exec.env): owner-only, and SQLite gives the -wal and
    // -shm files the database file's mode. An older, wider database is narrowed.
    if (auto fd = files::Open(path_, O_RDWR | O_CREAT, 0600); fd.ok()) {
      ::fchmod(fd->get(), 0600);
      for (const char* suffix : {"-wal", "-shm"}) ::chmod((path_ + suffix).c_str(), 0600);
    }
    int rc =
        sqlite3_open_v2(path_.c_str(), &db_,
                        SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, nullptr);
    if (rc != SQLITE_OK) return Error("open", rc);
    sqlite3_busy_timeout(db_, 5000);
    RETURN_IF_ERROR(Exec("PRAGMA journal_mode=WAL"));
    RETURN_IF_ERROR(Exec("PRAGMA synchronous=FULL"));
    // Checkpoints copy the WAL back into the database and fsync it; done inside a commit
    // (SQLite's default) they stall that commit for tens of milliseconds on a large
    // database. A second connection checkpoints in the background instead.
    RETURN_IF_ERROR(Exec("PRAGMA wal_autocheckpoint=0"));
    RETURN_IF_ERROR(Exec("PRAGMA foreign_keys=ON"));
    RETURN_IF_ERROR(Migrate());
    {
      std::lock_guard<std::mutex> lock(reserve_mu_);
      RefreshReserveLocked();
    }
    if (sqlite3_open_v2(path_.c_str(), &checkpoint_db_, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX,
                        nullptr) != SQLITE_OK) {
      return Error("open checkpoint connection", SQLITE_CANTOPEN);
    }
    sqlite3_busy_timeout(checkpoint_db_, 5000);
    sqlite3_exec(checkpoint_db_, "PRAGMA synchronous=FULL", nullptr, nullptr, nullptr);
    checkpointer_ = std::thread([this] { CheckpointLoop(); });
    absl::Status prepared;
    ForEachTable([&](auto table, Statement& put) {
      using T = decltype(table);
      if (prepared.ok()) prepared = Prepare(PutSql<T>().c_str(), &put);
    });
    RETURN_IF_ERROR(prepared);
    // Queries run on their own connection (WAL readers never block the writer), so that
    // RPC threads can read while the committer writes.
    if (sqlite3_open_v2(path_.c_str(), &read_db_, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX,
                        nullptr) != SQLITE_OK) {
      return Error("open query connection", SQLITE_CANTOPEN);
    }
    sqlite3_busy_timeout(read_db_, 5000);
    // Prepared once: sqlite3_exec would parse them again for every transaction.
    RETURN_IF_ERROR(Prepare("BEGIN IMMEDIATE", &begin_));
    RETURN_IF_ERROR(Prepare("COMMIT", &commit_));
    return absl::OkStatus();
  }

  absl::StatusOr<StoreSnapshot> Load() override {
    StoreSnapshot snap;
    absl::Status st;
    snap.ForEach([&](auto table, auto& rows) {
      using T = decltype(table);
      if (st.ok() && T::kKind == TableKind::kState) st = LoadTable<T>(&rows);
    });
    RETURN_IF_ERROR(st);
    return snap;
  }

  absl::StatusOr<std::vector<v1::MetricPoint>> ReadMetrics(const MetricQuery& query,
                                                           bool* truncated) override {
    std::lock_guard<std::mutex> lock(read_mu_);
    if (!read_all_.get()) {
      RETURN_IF_ERROR(PrepareOn(read_db_,
                                absl::StrCat(LoadSql<MetricPointsTable>().substr(
                                                 0, LoadSql<MetricPointsTable>().find(" ORDER BY")),
                                             " WHERE job = ?1 ORDER BY rowid"),
                                &read_all_));
      RETURN_IF_ERROR(PrepareOn(
          read_db_,
          absl::StrCat(LoadSql<MetricPointsTable>().substr(
                           0, LoadSql<MetricPointsTable>().find(" ORDER BY")),
                       " WHERE rowid IN (SELECT max(rowid) FROM metric_points WHERE job = ?1 "
                       "GROUP BY name) ORDER BY rowid"),
          &read_last_));
    }
    sqlite3_stmt* s = query.last_only ? read_last_.get() : read_all_.get();
    std::vector<v1::MetricPoint> out;
    bool cut = false;
    // One read transaction for all jobs: a consistent view.
    sqlite3_exec(read_db_, "BEGIN", nullptr, nullptr, nullptr);
    absl::Status st;
    for (const std::string& job : query.job_ids) {
      sqlite3_reset(s);
      sqlite3_bind_text(s, 1, job.data(), job.size(), SQLITE_TRANSIENT);
      int rc = SQLITE_DONE;
      StatementRow row(s);
      while (!cut && (rc = sqlite3_step(s)) == SQLITE_ROW) {
        if (!MetricNameMatches(query.name_pattern, std::string(row.Text(2)))) continue;
        auto run = MetricPointsTable::Read(row);
        if (!run.ok()) {
          st = absl::DataLossError(absl::StrCat(path_, ": ", run.status().message()));
          break;
        }
        if (!AppendRunPoints(*run, query, &out)) cut = true;
      }
      if (!st.ok() || cut) break;
      if (rc != SQLITE_DONE) {
        st = ErrorOn(read_db_, "read metric points", rc);
        break;
      }
    }
    sqlite3_reset(s);
    sqlite3_exec(read_db_, "COMMIT", nullptr, nullptr, nullptr);
    RETURN_IF_ERROR(st);
    if (truncated) *truncated = cut;
    return out;
  }

  absl::Status Commit(const StoreBatch& batch) override {
    if (batch.empty()) return absl::OkStatus();
    absl::Status st = CommitOnce(batch);
    if (st.ok() || !DiskFull(st)) return st;
    // The disk is full under a change that is already made in memory: give the reserve
    // back and try again, so that it is kept whole; new work is refused from now on
    // (CheckWritable) until there is room again.
    bool released = false;
    {
      std::lock_guard<std::mutex> lock(reserve_mu_);
      full_ = true;
      if (reserve_present_) {
        released = ::unlink(reserve_path_.c_str()) == 0;
        reserve_present_ = false;
      }
    }
    spdlog::error("{}: the disk is full ({}); {}", path_, std::string(st.message()),
                  released ? "released the reserve and retrying; new submits are refused"
                           : "no reserve left; new submits are refused");
    return released ? CommitOnce(batch) : st;
  }

  absl::Status CheckWritable() override {
    std::lock_guard<std::mutex> lock(reserve_mu_);
    const int64_t free = RefreshReserveLocked();
    if (!full_ && free >= kLowWaterBytes) return absl::OkStatus();
    return absl::ResourceExhaustedError(absl::StrCat(
        "the coordinator's disk is full: ", free < 0 ? 0 : free / 1024, " KiB free for ", path_,
        " (it needs ", (reserve_present_ ? kLowWaterBytes : kLowWaterBytes + kReserveBytes) >> 20,
        " MiB); nothing was changed: free space on the coordinator's disk and submit again"));
  }

  // PASSIVE checkpoints never block the writer; they copy what no reader still needs.
  // Every 200 ms, or sooner when commits have piled up, until the store closes.
  void CheckpointLoop() {
    std::unique_lock<std::mutex> lock(checkpoint_mu_);
    while (!stop_checkpoints_) {
      checkpoint_cv_.wait_for(lock, std::chrono::milliseconds(200));
      if (stop_checkpoints_) break;
      lock.unlock();
      int log_frames = 0, done = 0;
      int rc = sqlite3_wal_checkpoint_v2(checkpoint_db_, nullptr, SQLITE_CHECKPOINT_PASSIVE,
                                         &log_frames, &done);
      if (rc != SQLITE_OK && rc != SQLITE_BUSY) {
        std::fprintf(stderr, "%s: background checkpoint: %s\n", path_.c_str(),
                     sqlite3_errmsg(checkpoint_db_));
      }
      lock.lock();
    }
  }

  absl::StatusOr<std::string> IntegrityCheck() override {
    Statement st;
    RETURN_IF_ERROR(Prepare("PRAGMA integrity_check", &st));
    std::string result;
    int rc;
    while ((rc = sqlite3_step(st.get())) == SQLITE_ROW) {
      if (!result.empty()) result += "; ";
      result += ColumnText(st.get(), 0);
    }
    if (rc != SQLITE_DONE) return Error("integrity_check", rc);
    return result;
  }

 private:
  // Binds a record's columns to a prepared statement, in order.
  class BindingWriter final : public RowWriter {
   public:
    explicit BindingWriter(sqlite3_stmt* s) : s_(s) {}
    void Int(int64_t v) override { sqlite3_bind_int64(s_, ++i_, v); }
    void Real(double v) override { sqlite3_bind_double(s_, ++i_, v); }
    void Text(absl::string_view v) override {
      sqlite3_bind_text(s_, ++i_, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
    }
    void TextRef(absl::string_view v) override {
      sqlite3_bind_text(s_, ++i_, v.data(), static_cast<int>(v.size()), SQLITE_STATIC);
    }
    void Blob(absl::string_view v) override {
      sqlite3_bind_blob(s_, ++i_, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
    }

   private:
    sqlite3_stmt* s_;
    int i_ = 0;
  };

  // The current row of a stepped statement.
  class StatementRow final : public RowReader {
   public:
    explicit StatementRow(sqlite3_stmt* s) : s_(s) {}
    int64_t Int(int c) const override { return sqlite3_column_int64(s_, c); }
    double Real(int c) const override { return sqlite3_column_double(s_, c); }
    absl::string_view Text(int c) const override {
      const unsigned char* t = sqlite3_column_text(s_, c);
      return t ? absl::string_view(reinterpret_cast<const char*>(t), sqlite3_column_bytes(s_, c))
               : absl::string_view();
    }
    absl::string_view Blob(int c) const override {
      const void* b = sqlite3_column_blob(s_, c);
      return b ? absl::string_view(static_cast<const char*>(b), sqlite3_column_bytes(s_, c))
               : absl::string_view();
    }

   private:
    sqlite3_stmt* s_;
  };

  template <typename T>
  absl::Status LoadTable(std::vector<typename T::Record>* rows) {
    Statement st;
    RETURN_IF_ERROR(Prepare(LoadSql<T>().c_str(), &st));
    StatementRow row(st.get());
    int rc;
    while ((rc = sqlite3_step(st.get())) == SQLITE_ROW) {
      auto r = T::Read(row);
      if (!r.ok()) return absl::DataLossError(absl::StrCat(path_, ": ", r.status().message()));
      rows->push_back(std::move(*r));
    }
    if (rc != SQLITE_DONE) return Error(absl::StrCat("load ", T::kName), rc);
    return absl::OkStatus();
  }

  absl::Status WriteBatch(const StoreBatch& batch) {
    absl::Status st;
    ForEachTable([&](auto table, Statement& put) {
      using T = decltype(table);
      sqlite3_stmt* s = put.get();
      for (const auto& r : batch.of<T>()) {
        if (!st.ok()) return;
        sqlite3_reset(s);
        BindingWriter w(s);
        T::Write(r, &w);
        int rc = sqlite3_step(s);
        if (rc != SQLITE_DONE) st = Error(absl::StrCat("write ", T::Describe(r)), rc);
      }
    });
    return st;
  }

  // f(Table{}, that table's upsert statement) for every durable table.
  template <typename F>
  void ForEachTable(F&& f) {
    ForEachTableIn(DurableTables{}, f);
  }
  template <typename... T, typename F>
  void ForEachTableIn(TableList<T...>, F& f) {
    size_t i = 0;
    (f(T{}, puts_[i++]), ...);  // left to right: the list's order
  }

  absl::Status Migrate() {
    RETURN_IF_ERROR(Exec("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)"));
    int version = 0;
    {
      Statement st;
      RETURN_IF_ERROR(Prepare("SELECT version FROM schema_version", &st));
      if (sqlite3_step(st.get()) == SQLITE_ROW) version = sqlite3_column_int(st.get(), 0);
    }
    if (version > kSchemaVersion) {
      return absl::FailedPreconditionError(
          absl::StrCat(path_, ": schema version ", version, " is newer than this coordinator (",
                       kSchemaVersion, "); upgrade stemma-coordinator"));
    }
    if (version == kSchemaVersion) return absl::OkStatus();
    RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE"));
    absl::Status st;
    for (int v = version; v < kSchemaVersion && st.ok(); ++v) {
      ForEachTable([&](auto table, Statement&) {
        using T = decltype(table);
        if (st.ok() && T::kSince == v + 1) st = Exec(T::kSchema);
      });
      for (const AddedColumn& c : kAddedColumns) {
        if (st.ok() && c.since == v + 1) st = AddColumn(c);
      }
      if (st.ok() && *kMigrationExtras[v] != '\0') st = Exec(kMigrationExtras[v]);
    }
    if (st.ok()) st = Exec("DELETE FROM schema_version");
    if (st.ok()) st = Exec(absl::StrCat("INSERT INTO schema_version VALUES(", kSchemaVersion, ")"));
    if (st.ok()) st = Exec("COMMIT");
    if (!st.ok()) sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
    return st;
  }

  // ALTER TABLE ADD COLUMN, unless the table has the column already (a table created at
  // this version by its descriptor's schema, or one migrated by hand).
  absl::Status AddColumn(const AddedColumn& c) {
    Statement info;
    RETURN_IF_ERROR(Prepare(absl::StrCat("PRAGMA table_info(", c.table, ")").c_str(), &info));
    int rc;
    while ((rc = sqlite3_step(info.get())) == SQLITE_ROW) {
      if (ColumnText(info.get(), 1) == c.column) return absl::OkStatus();
    }
    if (rc != SQLITE_DONE) return Error(absl::StrCat("table_info ", c.table), rc);
    return Exec(
        absl::StrCat("ALTER TABLE ", c.table, " ADD COLUMN ", c.column, " ", c.declaration));
  }

  absl::Status Exec(const std::string& sql) {
    char* err = nullptr;
    int rc = sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &err);
    if (rc != SQLITE_OK) {
      std::string msg = err ? err : sqlite3_errstr(rc);
      sqlite3_free(err);
      return Status(rc, absl::StrCat(path_, ": ", sql.substr(0, 40), ": ", msg));
    }
    return absl::OkStatus();
  }

  // Runs a prepared statement that returns no rows.
  absl::Status Step(const Statement& st, const char* what) {
    int rc = sqlite3_step(st.get());
    absl::Status result = rc == SQLITE_DONE ? absl::OkStatus() : Error(what, rc);
    sqlite3_reset(st.get());  // ready for the next run; the message is taken already
    return result;
  }

  absl::Status Prepare(const char* sql, Statement* st) {
    int rc = sqlite3_prepare_v2(db_, sql, -1, st->out(), nullptr);
    if (rc != SQLITE_OK) return Error(absl::StrCat("prepare ", sql), rc);
    return absl::OkStatus();
  }

  absl::Status PrepareOn(sqlite3* db, const std::string& sql, Statement* st) {
    int rc = sqlite3_prepare_v2(db, sql.c_str(), -1, st->out(), nullptr);
    if (rc != SQLITE_OK) return ErrorOn(db, absl::StrCat("prepare ", sql), rc);
    return absl::OkStatus();
  }

  static std::string ColumnText(sqlite3_stmt* st, int col) {
    const unsigned char* t = sqlite3_column_text(st, col);
    return t ? reinterpret_cast<const char*>(t) : "";
  }

  absl::Status CommitOnce(const StoreBatch& batch) {
    RETURN_IF_ERROR(Step(begin_, "BEGIN IMMEDIATE"));
    absl::Status st = WriteBatch(batch);
    if (st.ok()) st = Step(commit_, "COMMIT");
    if (!st.ok()) {
      sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
      return st;
    }
    return absl::OkStatus();
  }

  // SQLITE_FULL, or an I/O error whose cause was ENOSPC.
  bool DiskFull(const absl::Status& st) const {
    return st.code() == absl::StatusCode::kResourceExhausted || sqlite3_system_errno(db_) == ENOSPC;
  }

  // Bytes free to this process on the database's file system (-1 if unknown).
  int64_t FreeBytes() const {
    struct statvfs vfs;
    if (::statvfs(dir_.c_str(), &vfs) != 0) return -1;
    return static_cast<int64_t>(vfs.f_bavail) * static_cast<int64_t>(vfs.f_frsize);
  }

  // Makes the reserve when it is missing and there is room for it and the margin (then the
  // disk is no longer full). Returns the free bytes.
  int64_t RefreshReserveLocked() {
    int64_t free = FreeBytes();
    if (reserve_present_ || free < 0) return free;
    if (free < kReserveBytes + kLowWaterBytes) {
      full_ = true;
      return free;
    }
    if (auto fd = files::Open(reserve_path_, O_WRONLY | O_CREAT, 0600); fd.ok()) {
      const bool made = ::posix_fallocate(fd->get(), 0, kReserveBytes) == 0 &&
                        files::SyncFd(fd->get(), reserve_path_).ok();
      fd->reset();
      if (made) {
        reserve_present_ = true;
        if (full_) spdlog::info("{}: disk space is back; submits are accepted again", path_);
        full_ = false;
        return FreeBytes();
      }
      ::unlink(reserve_path_.c_str());
    }
    full_ = true;
    return FreeBytes();
  }

  absl::Status Error(absl::string_view what, int rc) const { return ErrorOn(db_, what, rc); }

  absl::Status ErrorOn(sqlite3* db, absl::string_view what, int rc) const {
    const char* msg = db ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
    return Status(rc, absl::StrCat(path_, ": ", what, ": ", msg));
  }

  static absl::Status Status(int rc, std::string msg) {
    switch (rc & 0xff) {
      case SQLITE_BUSY:
      case SQLITE_LOCKED:
        return absl::UnavailableError(msg);
      case SQLITE_FULL:
        return absl::ResourceExhaustedError(msg);
      case SQLITE_CORRUPT:
      case SQLITE_NOTADB:
        return absl::DataLossError(msg);
      case SQLITE_CANTOPEN:
      case SQLITE_PERM:
      case SQLITE_READONLY:
        return absl::PermissionDeniedError(msg);
      default:
        return absl::InternalError(msg);
    }
  }

  std::string path_;
  std::string dir_ = [this] {
    const size_t slash = path_.rfind('/');
    return slash == std::string::npos ? std::string(".") : path_.substr(0, slash == 0 ? 1 : slash);
  }();
  // Disk full (see OpenSqliteStore). reserve_mu_ guards the reserve file and the flags.
  static constexpr int64_t kReserveBytes = 8 << 20;
  static constexpr int64_t kLowWaterBytes = 4 << 20;
  const std::string reserve_path_ = path_ + ".reserve";
  std::mutex reserve_mu_;
  bool reserve_present_ = false;
  bool full_ = false;
  sqlite3* db_ = nullptr;
  sqlite3* checkpoint_db_ = nullptr;
  std::thread checkpointer_;
  std::mutex checkpoint_mu_;
  std::condition_variable checkpoint_cv_;
  bool stop_checkpoints_ = false;
  // One upsert (or insert) statement per durable table, in DurableTables order.
  std::array<Statement, CountTables(DurableTables{})> puts_;
  // The query connection (ReadMetrics), its statements and the lock that serializes them.
  std::mutex read_mu_;
  sqlite3* read_db_ = nullptr;
  Statement read_all_;
  Statement read_last_;
  Statement begin_;
  Statement commit_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Store>> OpenSqliteStore(const std::string& path) {
  auto store = std::make_unique<SqliteStore>(path);
  absl::Status st = store->Open();
  if (!st.ok()) return st;
  return std::unique_ptr<Store>(std::move(store));
}

}  // namespace stemma::coordinator
