// The SQLite backend: the only file in the project that includes <sqlite3.h>.
#include <sqlite3.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status.h"
#include "coordinator/store/store.h"

namespace stemma::coordinator {
namespace {

// Schema migrations: entry i takes the database from version i to i + 1.
const char* const kMigrations[] = {
    R"sql(
CREATE TABLE jobs (
  seq INTEGER PRIMARY KEY,       -- submission order; the id is "j-<seq>"
  id TEXT NOT NULL,
  state TEXT NOT NULL,
  experiment TEXT NOT NULL DEFAULT '',
  record BLOB NOT NULL           -- stemma.v1.Job
);
CREATE TABLE workers (
  id TEXT PRIMARY KEY,
  record BLOB NOT NULL
);
CREATE TABLE idempotency_keys (
  key TEXT PRIMARY KEY,
  job_ids TEXT NOT NULL
);
)sql",
};
static_assert(sizeof(kMigrations) / sizeof(kMigrations[0]) == kSchemaVersion);

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
    sqlite3_close_v2(db_);
  }

  absl::Status Open() {
    int rc = sqlite3_open_v2(path_.c_str(), &db_,
                             SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                             nullptr);
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
    if (sqlite3_open_v2(path_.c_str(), &checkpoint_db_, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX,
                        nullptr) != SQLITE_OK) {
      return Error("open checkpoint connection", SQLITE_CANTOPEN);
    }
    sqlite3_busy_timeout(checkpoint_db_, 5000);
    sqlite3_exec(checkpoint_db_, "PRAGMA synchronous=FULL", nullptr, nullptr, nullptr);
    checkpointer_ = std::thread([this] { CheckpointLoop(); });
    RETURN_IF_ERROR(Prepare(
        "INSERT INTO jobs(id, seq, state, experiment, record) VALUES(?1, ?2, ?3, ?4, ?5) "
        "ON CONFLICT(seq) DO UPDATE SET state=excluded.state, record=excluded.record",
        &put_job_));
    RETURN_IF_ERROR(Prepare(
        "INSERT INTO workers(id, record) VALUES(?1, ?2) "
        "ON CONFLICT(id) DO UPDATE SET record=excluded.record",
        &put_worker_));
    RETURN_IF_ERROR(Prepare(
        "INSERT INTO idempotency_keys(key, job_ids) VALUES(?1, ?2) "
        "ON CONFLICT(key) DO UPDATE SET job_ids=excluded.job_ids",
        &put_key_));
    // Prepared once: sqlite3_exec would parse them again for every transaction.
    RETURN_IF_ERROR(Prepare("BEGIN IMMEDIATE", &begin_));
    RETURN_IF_ERROR(Prepare("COMMIT", &commit_));
    return absl::OkStatus();
  }

  absl::StatusOr<StoreSnapshot> Load() override {
    StoreSnapshot snap;
    {
      Statement st;
      RETURN_IF_ERROR(Prepare("SELECT id, record FROM jobs ORDER BY seq", &st));
      int rc;
      while ((rc = sqlite3_step(st.get())) == SQLITE_ROW) {
        v1::Job job;
        if (!job.ParseFromArray(sqlite3_column_blob(st.get(), 1),
                                sqlite3_column_bytes(st.get(), 1))) {
          return absl::DataLossError(absl::StrCat(path_, ": job record ",
                                                  ColumnText(st.get(), 0), " does not parse"));
        }
        snap.jobs.push_back(std::move(job));
      }
      if (rc != SQLITE_DONE) return Error("load jobs", rc);
    }
    {
      Statement st;
      RETURN_IF_ERROR(Prepare("SELECT id, record FROM workers ORDER BY id", &st));
      int rc;
      while ((rc = sqlite3_step(st.get())) == SQLITE_ROW) {
        v1::WorkerInfo w;
        if (!w.ParseFromArray(sqlite3_column_blob(st.get(), 1),
                              sqlite3_column_bytes(st.get(), 1))) {
          return absl::DataLossError(absl::StrCat(path_, ": worker record ",
                                                  ColumnText(st.get(), 0), " does not parse"));
        }
        snap.workers.push_back(std::move(w));
      }
      if (rc != SQLITE_DONE) return Error("load workers", rc);
    }
    {
      Statement st;
      RETURN_IF_ERROR(Prepare("SELECT key, job_ids FROM idempotency_keys", &st));
      int rc;
      while ((rc = sqlite3_step(st.get())) == SQLITE_ROW) {
        std::vector<std::string> ids = absl::StrSplit(ColumnText(st.get(), 1), ',',
                                                      absl::SkipEmpty());
        snap.idempotency_keys.emplace_back(ColumnText(st.get(), 0), std::move(ids));
      }
      if (rc != SQLITE_DONE) return Error("load idempotency keys", rc);
    }
    return snap;
  }

  absl::Status Commit(const StoreBatch& batch) override {
    if (batch.empty()) return absl::OkStatus();
    RETURN_IF_ERROR(Step(begin_, "BEGIN IMMEDIATE"));
    absl::Status st = WriteBatch(batch);
    if (st.ok()) st = Step(commit_, "COMMIT");
    if (!st.ok()) {
      sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
      return st;
    }
    return absl::OkStatus();
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
  absl::Status WriteBatch(const StoreBatch& batch) {
    std::string buf;
    for (const auto& job : batch.jobs) {
      sqlite3_stmt* s = put_job_.get();
      sqlite3_reset(s);
      job.SerializeToString(&buf);
      sqlite3_bind_text(s, 1, job.id().data(), job.id().size(), SQLITE_TRANSIENT);
      sqlite3_bind_int64(s, 2, static_cast<int64_t>(job.seq()));
      const std::string& state = v1::JobState_Name(job.state());
      sqlite3_bind_text(s, 3, state.data(), state.size(), SQLITE_TRANSIENT);
      sqlite3_bind_text(s, 4, job.spec().experiment().data(), job.spec().experiment().size(),
                        SQLITE_TRANSIENT);
      sqlite3_bind_blob(s, 5, buf.data(), buf.size(), SQLITE_TRANSIENT);
      int rc = sqlite3_step(s);
      if (rc != SQLITE_DONE) return Error(absl::StrCat("write job ", job.id()), rc);
    }
    for (const auto& w : batch.workers) {
      sqlite3_stmt* s = put_worker_.get();
      sqlite3_reset(s);
      w.SerializeToString(&buf);
      sqlite3_bind_text(s, 1, w.id().data(), w.id().size(), SQLITE_TRANSIENT);
      sqlite3_bind_blob(s, 2, buf.data(), buf.size(), SQLITE_TRANSIENT);
      int rc = sqlite3_step(s);
      if (rc != SQLITE_DONE) return Error(absl::StrCat("write worker ", w.id()), rc);
    }
    for (const auto& [key, ids] : batch.idempotency_keys) {
      sqlite3_stmt* s = put_key_.get();
      sqlite3_reset(s);
      std::string joined = absl::StrJoin(ids, ",");
      sqlite3_bind_text(s, 1, key.data(), key.size(), SQLITE_TRANSIENT);
      sqlite3_bind_text(s, 2, joined.data(), joined.size(), SQLITE_TRANSIENT);
      int rc = sqlite3_step(s);
      if (rc != SQLITE_DONE) return Error("write idempotency key", rc);
    }
    return absl::OkStatus();
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
    for (int v = version; v < kSchemaVersion && st.ok(); ++v) st = Exec(kMigrations[v]);
    if (st.ok()) st = Exec("DELETE FROM schema_version");
    if (st.ok()) st = Exec(absl::StrCat("INSERT INTO schema_version VALUES(", kSchemaVersion, ")"));
    if (st.ok()) st = Exec("COMMIT");
    if (!st.ok()) sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
    return st;
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

  static std::string ColumnText(sqlite3_stmt* st, int col) {
    const unsigned char* t = sqlite3_column_text(st, col);
    return t ? reinterpret_cast<const char*>(t) : "";
  }

  absl::Status Error(absl::string_view what, int rc) const {
    const char* msg = db_ ? sqlite3_errmsg(db_) : sqlite3_errstr(rc);
    return Status(rc, absl::StrCat(path_, ": ", what, ": ", msg));
  }

  static absl::Status Status(int rc, std::string msg) {
    switch (rc & 0xff) {
      case SQLITE_BUSY:
      case SQLITE_LOCKED: return absl::UnavailableError(msg);
      case SQLITE_FULL: return absl::ResourceExhaustedError(msg);
      case SQLITE_CORRUPT:
      case SQLITE_NOTADB: return absl::DataLossError(msg);
      case SQLITE_CANTOPEN:
      case SQLITE_PERM:
      case SQLITE_READONLY: return absl::PermissionDeniedError(msg);
      default: return absl::InternalError(msg);
    }
  }

  std::string path_;
  sqlite3* db_ = nullptr;
  sqlite3* checkpoint_db_ = nullptr;
  std::thread checkpointer_;
  std::mutex checkpoint_mu_;
  std::condition_variable checkpoint_cv_;
  bool stop_checkpoints_ = false;
  Statement put_job_;
  Statement put_worker_;
  Statement put_key_;
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
