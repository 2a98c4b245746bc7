#include "cli/output.h"

#include <google/protobuf/util/json_util.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <ctime>
#include <iostream>
#include <memory>
#include <set>
#include <streambuf>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/job_spec.h"

namespace stemma::cli {
namespace {

constexpr char kUsagePayload[] = "stemma.dev/usage";

// The states a user may name, in lifecycle order.
constexpr v1::JobState kStates[] = {v1::PENDING,   v1::QUEUED, v1::ASSIGNED, v1::RUNNING,
                                    v1::SUCCEEDED, v1::FAILED, v1::CANCELLED};

std::string StateList() {
  std::vector<std::string> names;
  for (v1::JobState s : kStates) names.push_back(absl::AsciiStrToLower(StateName(s)));
  return absl::StrJoin(names, ", ");
}

std::string OrDash(const std::string& s) { return s.empty() ? "-" : s; }

int64_t NowMsForJson() { return absl::ToUnixMillis(absl::Now()); }

std::vector<std::string> Workers(const v1::Job& job) {
  std::vector<std::string> out;
  for (const auto& part : job.current().parts()) {
    if (!part.worker_id().empty()) out.push_back(part.worker_id());
  }
  return out;
}

std::vector<int> Gpus(const v1::Job& job) {
  std::vector<int> out;
  for (const auto& part : job.current().parts()) {
    for (int id : part.gpu_ids()) out.push_back(id);
  }
  return out;
}

int MaxAttempts(const v1::Job& job) {
  return job.attempt_budget() > 0 ? job.attempt_budget() : job.spec().max_attempts();
}

std::string AttemptsCell(const v1::Job& job) {
  int budget = MaxAttempts(job);
  if (budget <= 0) return absl::StrCat(job.attempts());
  return absl::StrCat(job.attempts(), "/", budget);
}

std::string ExitCell(const v1::Job& job) {
  if (!IsTerminal(job.state()) || job.state() == v1::CANCELLED) return "-";
  return absl::StrCat(job.exit_code());
}

std::string FormatNumber(double v) {
  std::string s = absl::StrFormat("%.2f", v);
  while (!s.empty() && s.back() == '0') s.pop_back();
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s;
}

std::string MapCell(const google::protobuf::Map<std::string, std::string>& map) {
  std::map<std::string, std::string> sorted(map.begin(), map.end());
  return OrDash(absl::StrJoin(sorted, ",", absl::PairFormatter("=")));
}

// Would a plain YAML scalar with this text read back as something other than a string?
bool NeedsQuotes(const std::string& s) {
  if (s.empty()) return true;
  static const std::set<std::string> kSpecial = {
      "~",    "null", "Null", "NULL",  "true",  "True",  "TRUE", "false", "False", "FALSE", "yes",
      "Yes",  "YES",  "no",   "No",    "NO",    "on",    "On",   "ON",    "off",   "Off",   "OFF",
      ".inf", ".Inf", ".INF", "-.inf", "-.Inf", "-.INF", ".nan", ".NaN",  ".NAN"};
  if (kSpecial.count(s)) return true;
  double d;
  if (absl::SimpleAtod(s, &d)) return true;
  return std::isspace(static_cast<unsigned char>(s.front())) ||
         std::isspace(static_cast<unsigned char>(s.back()));
}

void EmitYaml(const nlohmann::json& value, YAML::Emitter* out) {
  switch (value.type()) {
    case nlohmann::json::value_t::object:
      if (value.empty()) {
        *out << YAML::Flow << YAML::BeginMap << YAML::EndMap;
        break;
      }
      *out << YAML::BeginMap;
      for (const auto& [key, item] : value.items()) {
        *out << YAML::Key << key << YAML::Value;
        EmitYaml(item, out);
      }
      *out << YAML::EndMap;
      break;
    case nlohmann::json::value_t::array:
      if (value.empty()) {
        *out << YAML::Flow << YAML::BeginSeq << YAML::EndSeq;
        break;
      }
      *out << YAML::BeginSeq;
      for (const auto& item : value) EmitYaml(item, out);
      *out << YAML::EndSeq;
      break;
    case nlohmann::json::value_t::string: {
      const auto& s = value.get_ref<const std::string&>();
      if (NeedsQuotes(s)) {
        *out << YAML::DoubleQuoted << s;
      } else {
        *out << s;
      }
      break;
    }
    case nlohmann::json::value_t::boolean:
      *out << value.get<bool>();
      break;
    case nlohmann::json::value_t::number_integer:
      *out << value.get<int64_t>();
      break;
    case nlohmann::json::value_t::number_unsigned:
      *out << value.get<uint64_t>();
      break;
    case nlohmann::json::value_t::number_float:
      *out << value.get<double>();
      break;
    default:
      *out << YAML::Null;
      break;
  }
}

}  // namespace

absl::StatusOr<OutputFormat> ParseOutputFormat(const std::string& name, std::string* jsonpath) {
  std::string lower = absl::AsciiStrToLower(name);
  if (lower == "table") return OutputFormat::kTable;
  if (lower == "wide") return OutputFormat::kWide;
  if (lower == "json") return OutputFormat::kJson;
  if (lower == "yaml") return OutputFormat::kYaml;
  if (lower == "csv") return OutputFormat::kCsv;
  if (lower == "name") return OutputFormat::kName;
  if (absl::StartsWith(lower, "jsonpath=")) {
    const std::string tmpl = name.substr(9);
    if (tmpl.empty()) return UsageError("-o jsonpath=: the template is empty");
    absl::StatusOr<std::string> checked = ApplyJsonPath(nlohmann::json::object(), tmpl);
    if (!checked.ok()) return checked.status();
    if (jsonpath != nullptr) *jsonpath = tmpl;
    return OutputFormat::kJsonPath;
  }
  return UsageError(absl::StrCat("unknown output format '", name,
                                 "' (expected table, wide, json, yaml, csv, name or "
                                 "jsonpath=TEMPLATE)"));
}

absl::Status UsageError(const std::string& message) {
  absl::Status status = absl::InvalidArgumentError(message);
  status.SetPayload(kUsagePayload, absl::Cord("1"));
  return status;
}

bool IsUsageError(const absl::Status& status) {
  return status.GetPayload(kUsagePayload).has_value();
}

absl::StatusOr<std::vector<v1::JobState>> ParseStates(const std::vector<std::string>& values) {
  std::vector<v1::JobState> states;
  for (const std::string& value : values) {
    for (absl::string_view piece : absl::StrSplit(value, ',')) {
      std::string name = absl::AsciiStrToUpper(absl::StripAsciiWhitespace(piece));
      v1::JobState state;
      if (name.empty() || !v1::JobState_Parse(name, &state) || state == v1::JOB_STATE_UNSPECIFIED) {
        return UsageError(absl::StrCat("unknown state '", absl::StripAsciiWhitespace(piece),
                                       "' (expected one of ", StateList(), ")"));
      }
      if (std::find(states.begin(), states.end(), state) == states.end()) {
        states.push_back(state);
      }
    }
  }
  return states;
}

absl::StatusOr<std::string> ParseKind(const std::string& value) {
  std::string lower = absl::AsciiStrToLower(value);
  if (lower == "noop" || lower == "exec" || lower == "engine") return lower;
  return UsageError(
      absl::StrCat("unknown kind '", value, "' (expected one of noop, exec, engine)"));
}

absl::StatusOr<std::map<std::string, std::string>> ParseLabels(
    const std::vector<std::string>& values) {
  std::map<std::string, std::string> labels;
  for (const std::string& value : values) {
    std::pair<std::string, std::string> kv = absl::StrSplit(value, absl::MaxSplits('=', 1));
    if (value.find('=') == std::string::npos || kv.first.empty()) {
      return UsageError(absl::StrCat("bad label '", value, "' (expected key=value)"));
    }
    labels[kv.first] = kv.second;
  }
  return labels;
}

std::string HumanDuration(int64_t ms) {
  if (ms < 0) ms = 0;
  if (ms < 1000) return ms == 0 ? "0s" : absl::StrCat(ms, "ms");
  int64_t s = ms / 1000;
  if (s < 60) return absl::StrCat(s, "s");
  if (s < 3600) return absl::StrCat(s / 60, "m");
  if (s < 48 * 3600) return absl::StrCat(s / 3600, "h");
  return absl::StrCat(s / 86400, "d");
}

std::string HumanAge(int64_t timestamp_ms, int64_t now_ms) {
  if (timestamp_ms <= 0) return "-";
  return HumanDuration(now_ms - timestamp_ms);
}

std::string HumanMemoryMb(int64_t mb) {
  if (mb <= 0) return "-";
  if (mb < 1024) return absl::StrCat(mb, "M");
  if (mb < 1024 * 1024) return absl::StrCat(FormatNumber(mb / 1024.0), "G");
  return absl::StrCat(FormatNumber(mb / (1024.0 * 1024.0)), "T");
}

namespace {
std::string FormatLocal(int64_t ms, const char* format) {
  time_t secs = static_cast<time_t>(ms / 1000);
  struct tm tm;
  localtime_r(&secs, &tm);
  char buf[64];
  strftime(buf, sizeof(buf), format, &tm);
  return absl::StrFormat("%s.%03d", buf, static_cast<int>(ms % 1000));
}
}  // namespace

std::string FormatTimestamp(int64_t ms) {
  if (ms <= 0) return "-";
  return FormatLocal(ms, "%Y-%m-%d %H:%M:%S");
}

std::string FormatClock(int64_t ms) { return FormatLocal(ms, "%H:%M:%S"); }

nlohmann::json JobToJson(const v1::Job& job) {
  nlohmann::json j;
  const v1::JobSpec& spec = job.spec();
  j["id"] = job.id();
  j["name"] = spec.name();
  j["kind"] = JobKind(spec);
  j["state"] = StateName(job.state());
  j["attempts"] = job.attempts();
  j["max_attempts"] = MaxAttempts(job);
  j["priority"] = spec.priority();
  j["labels"] = std::map<std::string, std::string>(spec.labels().begin(), spec.labels().end());
  j["experiment"] = spec.experiment();
  j["owner"] = job.owner();  // who submitted it ("" without authentication)
  j["depends_on"] = std::vector<std::string>(spec.depends_on().begin(), spec.depends_on().end());
  j["reason"] = job.reason();
  j["early_stop"] = job.early_stop();            // a trial stopped at a rung, or skipped for one
  j["preemptions"] = job.preemptions();          // times a higher-priority job preempted it
  j["preempted_by"] = job.preempted_by();        // the last one that did ("" if none)
  j["engine_build_id"] = job.engine_build_id();  // the engine build that produced the outputs
  j["exit_code"] = job.exit_code();
  j["archived"] = job.archived();
  j["created_ms"] = job.created_ms();
  j["queued_ms"] = job.queued_ms();
  j["started_ms"] = job.current().started_ms();
  j["finished_ms"] = job.finished_ms();
  j["attempt_id"] = job.current().id();
  j["workers"] = Workers(job);
  j["gpus"] = Gpus(job);
  j["progress"] = {{"fraction", job.progress().fraction()},
                   {"message", job.progress().message()},
                   {"step", job.progress().step()}};
  j["outputs"] = std::map<std::string, std::string>(job.outputs().begin(), job.outputs().end());
  std::string spec_json;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  if (google::protobuf::util::MessageToJsonString(spec, &spec_json, options).ok()) {
    j["spec"] = nlohmann::json::parse(spec_json, nullptr, /*allow_exceptions=*/false);
  } else {
    j["spec"] = nullptr;
  }
  return j;
}

int64_t HeartbeatAgeMs(const v1::WorkerInfo& worker, int64_t now_ms) {
  // The coordinator sends the age (ms since the last heartbeat; -1 while disconnected).
  // A value that looks like a Unix timestamp is read as one.
  constexpr int64_t kYear2000Ms = 946'684'800'000;
  int64_t v = worker.last_heartbeat_ms();
  if (v >= kYear2000Ms) return std::max<int64_t>(0, now_ms - v);
  return v;
}

std::string WorkerStateName(v1::WorkerState state) {
  switch (state) {
    case v1::WORKER_ALIVE:
      return "ALIVE";
    case v1::WORKER_DRAINING:
      return "DRAINING";
    case v1::WORKER_LOST:
      return "LOST";
    default:
      return "UNSPECIFIED";
  }
}

nlohmann::json WorkerToJson(const v1::WorkerInfo& worker) {
  nlohmann::json j;
  j["id"] = worker.id();
  j["host"] = worker.host();
  j["state"] = WorkerStateName(worker.state());
  j["engine_build_id"] = worker.engine_build_id();
  nlohmann::json gpus = nlohmann::json::array();
  for (const auto& gpu : worker.gpus()) {
    gpus.push_back({{"id", gpu.id()}, {"model", gpu.model()}, {"memory_mb", gpu.memory_mb()}});
  }
  j["gpus"] = gpus;
  j["gpus_in_use"] = std::vector<int>(worker.gpus_in_use().begin(), worker.gpus_in_use().end());
  j["cpus"] = worker.cpus();
  j["cpus_in_use"] = worker.cpus_in_use();
  j["memory_mb"] = worker.memory_mb();
  j["memory_in_use_mb"] = worker.memory_in_use_mb();
  j["labels"] = std::map<std::string, std::string>(worker.labels().begin(), worker.labels().end());
  j["allow_exec"] = worker.allow_exec();
  j["attempts"] = std::vector<std::string>(worker.attempts().begin(), worker.attempts().end());
  j["last_heartbeat_ms"] = worker.last_heartbeat_ms();
  j["heartbeat_age_ms"] = HeartbeatAgeMs(worker, NowMsForJson());
  j["registered_ms"] = worker.registered_ms();
  return j;
}

std::string JsonToYaml(const nlohmann::json& value) {
  YAML::Emitter out;
  EmitYaml(value, &out);
  std::string text = out.c_str();
  if (text.empty() || text.back() != '\n') text += '\n';
  return text;
}

namespace {

// Appends the visible escape of control character `c` ("\n", "\u001b").
void AppendEscape(unsigned c, std::string* out) {
  switch (c) {
    case '\n':
      *out += "\\n";
      return;
    case '\r':
      *out += "\\r";
      return;
    case '\t':
      *out += "\\t";
      return;
    default:
      *out += absl::StrFormat("\\u%04x", c);
  }
}

bool IsC0OrDel(unsigned char c) { return c < 0x20 || c == 0x7f; }

// Writes through to `next`, escaping control characters but \n, \t and \r. A UTF-8 C1
// control (0xC2 0x80..0x9F) is held one byte until its second byte is known.
class GuardBuf final : public std::streambuf {
 public:
  explicit GuardBuf(std::streambuf* next) : next_(next) {}
  std::streambuf* next() const { return next_; }

 protected:
  int_type overflow(int_type ch) override {
    if (traits_type::eq_int_type(ch, traits_type::eof())) return traits_type::not_eof(ch);
    const unsigned char c = static_cast<unsigned char>(traits_type::to_char_type(ch));
    std::string out;
    if (pending_c2_) {
      pending_c2_ = false;
      if (c >= 0x80 && c <= 0x9f) {
        AppendEscape(c, &out);
        return Put(out) ? ch : traits_type::eof();
      }
      out += '\xc2';
    }
    if (c == 0xc2) {
      pending_c2_ = true;
    } else if (IsC0OrDel(c) && c != '\n' && c != '\t' && c != '\r') {
      AppendEscape(c, &out);
    } else {
      out += static_cast<char>(c);
    }
    return Put(out) ? ch : traits_type::eof();
  }
  std::streamsize xsputn(const char* s, std::streamsize n) override {
    std::streamsize i = 0;
    // Runs of ordinary bytes go through in one call.
    while (i < n) {
      std::streamsize j = i;
      while (!pending_c2_ && j < n) {
        const unsigned char c = static_cast<unsigned char>(s[j]);
        if (c == 0xc2 || (IsC0OrDel(c) && c != '\n' && c != '\t' && c != '\r')) break;
        ++j;
      }
      if (j > i && next_->sputn(s + i, j - i) != j - i) return i;
      i = j;
      if (i < n) {
        if (traits_type::eq_int_type(overflow(traits_type::to_int_type(s[i])),
                                     traits_type::eof())) {
          return i;
        }
        ++i;
      }
    }
    return n;
  }
  int sync() override {
    if (pending_c2_) {
      pending_c2_ = false;
      if (next_->sputc('\xc2') == traits_type::eof()) return -1;
    }
    return next_->pubsync();
  }

 private:
  bool Put(const std::string& s) {
    return next_->sputn(s.data(), static_cast<std::streamsize>(s.size())) ==
           static_cast<std::streamsize>(s.size());
  }

  std::streambuf* next_;
  bool pending_c2_ = false;
};

// Never destroyed while installed: std::cout is flushed after static destructors run.
GuardBuf* out_guard = nullptr;
GuardBuf* err_guard = nullptr;

}  // namespace

std::string TerminalSafe(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (IsC0OrDel(c)) {
      AppendEscape(c, &out);
    } else if (c == 0xc2 && i + 1 < text.size() &&
               static_cast<unsigned char>(text[i + 1]) >= 0x80 &&
               static_cast<unsigned char>(text[i + 1]) <= 0x9f) {
      AppendEscape(static_cast<unsigned char>(text[++i]), &out);
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

void GuardStdout() {
  if (out_guard != nullptr) return;
  std::cout.flush();
  std::cerr.flush();
  out_guard = new GuardBuf(std::cout.rdbuf());
  err_guard = new GuardBuf(std::cerr.rdbuf());
  std::cout.rdbuf(out_guard);
  std::cerr.rdbuf(err_guard);
}

void UnguardStdout() {
  if (out_guard == nullptr) return;
  std::cout.flush();
  std::cerr.flush();
  std::cout.rdbuf(out_guard->next());
  std::cerr.rdbuf(err_guard->next());
  delete out_guard;
  delete err_guard;
  out_guard = nullptr;
  err_guard = nullptr;
}

std::string RenderTable(const std::vector<std::string>& header,
                        const std::vector<std::vector<std::string>>& raw_rows) {
  std::vector<std::vector<std::string>> rows;
  rows.reserve(raw_rows.size());
  for (const auto& row : raw_rows) {
    std::vector<std::string> safe;
    safe.reserve(row.size());
    for (const auto& cell : row) safe.push_back(TerminalSafe(cell));
    rows.push_back(std::move(safe));
  }
  std::vector<size_t> widths(header.size(), 0);
  auto measure = [&](const std::vector<std::string>& row) {
    for (size_t i = 0; i < row.size() && i < widths.size(); ++i) {
      widths[i] = std::max(widths[i], row[i].size());
    }
  };
  measure(header);
  for (const auto& row : rows) measure(row);
  std::string out;
  auto emit = [&](const std::vector<std::string>& row) {
    std::string line;
    for (size_t i = 0; i < widths.size(); ++i) {
      const std::string cell = i < row.size() ? row[i] : "";
      line += cell;
      if (i + 1 < widths.size()) line += std::string(widths[i] - cell.size() + 3, ' ');
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line;
    out += '\n';
  };
  emit(header);
  for (const auto& row : rows) emit(row);
  return out;
}

std::string RenderJobsTable(const std::vector<v1::Job>& jobs, bool wide, int64_t now_ms) {
  std::vector<std::string> header = {"ID", "NAME", "KIND", "STATE", "ATTEMPTS", "AGE", "REASON"};
  if (wide) {
    header.insert(header.end() - 1, {"PRIORITY", "GPUS", "WORKER(S)", "EXIT"});
  }
  std::vector<std::vector<std::string>> rows;
  for (const v1::Job& job : jobs) {
    std::vector<std::string> row = {job.id(),
                                    OrDash(job.spec().name()),
                                    OrDash(JobKind(job.spec())),
                                    StateName(job.state()),
                                    AttemptsCell(job),
                                    HumanAge(job.created_ms(), now_ms)};
    if (wide) {
      row.push_back(absl::StrCat(job.spec().priority()));
      row.push_back(OrDash(absl::StrJoin(Gpus(job), ",")));
      row.push_back(OrDash(absl::StrJoin(Workers(job), ",")));
      row.push_back(ExitCell(job));
    }
    row.push_back(job.reason());
    rows.push_back(std::move(row));
  }
  return RenderTable(header, rows);
}

std::string RenderJobDetails(const v1::Job& job, int64_t now_ms) {
  const v1::JobSpec& spec = job.spec();
  auto when = [&](int64_t ms) {
    if (ms <= 0) return std::string("-");
    return absl::StrCat(FormatTimestamp(ms), " (", HumanAge(ms, now_ms), " ago)");
  };
  std::vector<std::pair<std::string, std::string>> kv = {
      {"id", job.id()},
      {"name", OrDash(spec.name())},
      {"kind", OrDash(JobKind(spec))},
      {"state", StateName(job.state())},
      {"reason", OrDash(job.reason())},
      {"attempts", AttemptsCell(job)},
      {"priority", absl::StrCat(spec.priority())},
      {"experiment", OrDash(spec.experiment())},
      {"owner", OrDash(job.owner())},
      {"labels", MapCell(spec.labels())},
      {"depends_on", OrDash(absl::StrJoin(spec.depends_on(), ","))},
      {"dependents", OrDash(absl::StrJoin(job.dependents(), ","))},
      {"resources", absl::StrCat("gpus=", spec.resources().gpus(),
                                 " cpus=", FormatNumber(spec.resources().cpus()),
                                 " memory=", HumanMemoryMb(spec.resources().memory_mb()),
                                 " nodes=", spec.nodes() > 0 ? spec.nodes() : 1)},
      {"created", when(job.created_ms())},
      {"queued", when(job.queued_ms())},
      {"started", when(job.current().started_ms())},
      {"finished", when(job.finished_ms())},
      {"attempt", OrDash(job.current().id())},
      {"result", OrDash(job.current().result())},
      {"workers", OrDash(absl::StrJoin(Workers(job), ","))},
      {"gpus", OrDash(absl::StrJoin(Gpus(job), ","))},
      {"exit_code", ExitCell(job)},
  };
  if (job.archived()) kv.emplace_back("archived", "yes (stemma gc jobs)");
  if (std::string progress = ProgressText(job); !progress.empty()) {
    kv.emplace_back("progress", progress);
  }
  if (job.preemptions() > 0) {
    kv.emplace_back("preempted",
                    absl::StrCat(job.preemptions(), job.preemptions() == 1 ? " time" : " times",
                                 ", last by ", job.preempted_by(), " (attempts not counted)"));
  }
  if (!job.outputs().empty()) kv.emplace_back("outputs", MapCell(job.outputs()));
  size_t width = 0;
  for (const auto& [key, value] : kv) width = std::max(width, key.size());
  std::string out;
  for (const auto& [key, value] : kv) {
    absl::StrAppend(&out, key, ":", std::string(width - key.size() + 1, ' '), TerminalSafe(value),
                    "\n");
  }
  return out;
}

namespace {
std::vector<std::string> AttemptWorkers(const v1::Attempt& a) {
  std::vector<std::string> out;
  for (const auto& part : a.parts()) {
    if (!part.worker_id().empty()) out.push_back(part.worker_id());
  }
  return out;
}
}  // namespace

nlohmann::json AttemptsToJson(const std::vector<v1::Attempt>& history) {
  nlohmann::json out = nlohmann::json::array();
  for (const v1::Attempt& a : history) {
    out.push_back({{"number", a.number()},
                   {"id", a.id()},
                   {"workers", AttemptWorkers(a)},
                   {"assigned_ms", a.assigned_ms()},
                   {"started_ms", a.started_ms()},
                   {"finished_ms", a.finished_ms()},
                   {"result", a.result()},
                   {"preempted_by", a.preempted_by()}});
  }
  return out;
}

std::string RenderAttemptsTable(const std::vector<v1::Attempt>& history) {
  std::vector<std::vector<std::string>> rows;
  for (const v1::Attempt& a : history) {
    rows.push_back({absl::StrCat(a.number()), OrDash(absl::StrJoin(AttemptWorkers(a), ",")),
                    FormatTimestamp(a.started_ms() > 0 ? a.started_ms() : a.assigned_ms()),
                    FormatTimestamp(a.finished_ms()),
                    OrDash(a.result().empty() && a.finished_ms() == 0 ? "running" : a.result()),
                    OrDash(a.preempted_by())});
  }
  return RenderTable({"ATTEMPT", "WORKERS", "STARTED", "FINISHED", "RESULT", "PREEMPTED-BY"}, rows);
}

std::string RenderWorkersTable(const std::vector<v1::WorkerInfo>& workers, bool wide,
                               int64_t now_ms) {
  std::vector<std::string> header = {"ID",   "HOST", "STATE",    "GPUS",
                                     "CPUS", "MEM",  "ATTEMPTS", "HEARTBEAT-AGE"};
  if (wide) header.insert(header.end(), {"EXEC", "LABELS"});
  std::vector<std::vector<std::string>> rows;
  for (const v1::WorkerInfo& w : workers) {
    std::vector<std::string> row = {
        w.id(),
        OrDash(w.host()),
        WorkerStateName(w.state()),
        absl::StrCat(w.gpus_in_use_size(), "/", w.gpus_size()),
        absl::StrCat(FormatNumber(w.cpus_in_use()), "/", FormatNumber(w.cpus())),
        absl::StrCat(w.memory_in_use_mb() > 0 ? HumanMemoryMb(w.memory_in_use_mb()) : "0", "/",
                     HumanMemoryMb(w.memory_mb())),
        absl::StrCat(w.attempts_size()),
        HeartbeatAgeMs(w, now_ms) < 0 ? "-" : HumanDuration(HeartbeatAgeMs(w, now_ms))};
    if (wide) {
      row.push_back(w.allow_exec() ? "yes" : "no");
      row.push_back(MapCell(w.labels()));
    }
    rows.push_back(std::move(row));
  }
  return RenderTable(header, rows);
}

namespace {
int64_t EventMs(const v1::JobEvent& event, int64_t now_ms) {
  return event.job().updated_ms() > 0 ? event.job().updated_ms() : now_ms;
}
std::string PreviousName(const v1::JobEvent& event) {
  return event.previous() == v1::JOB_STATE_UNSPECIFIED ? "-" : StateName(event.previous());
}
}  // namespace

std::string ProgressText(const v1::Job& job) {
  if (!job.has_progress() || (job.progress().fraction() <= 0 && job.progress().step() <= 0 &&
                              job.progress().message().empty())) {
    return "";
  }
  std::string progress = absl::StrCat(FormatNumber(job.progress().fraction() * 100), "%");
  if (job.progress().step() > 0) absl::StrAppend(&progress, " step ", job.progress().step());
  if (!job.progress().message().empty()) absl::StrAppend(&progress, " ", job.progress().message());
  return progress;
}

std::string RenderEventLine(const v1::JobEvent& event, int64_t now_ms) {
  const v1::Job& job = event.job();
  if (event.previous() == job.state()) {
    // Not a transition: progress reported by the running attempt.
    std::string progress = ProgressText(job);
    return TerminalSafe(absl::StrCat(FormatClock(EventMs(event, now_ms)), " ", job.id(), " ",
                                     OrDash(job.spec().name()), " ", StateName(job.state()), " ",
                                     progress.empty() ? "progress" : progress));
  }
  std::string line = absl::StrCat(FormatClock(EventMs(event, now_ms)), " ", job.id(), " ",
                                  OrDash(job.spec().name()), " ", PreviousName(event), " -> ",
                                  StateName(job.state()));
  if (!job.reason().empty()) absl::StrAppend(&line, " ", job.reason());
  return TerminalSafe(line);
}

nlohmann::json EventToJson(const v1::JobEvent& event, int64_t now_ms) {
  nlohmann::json j = JobToJson(event.job());
  j["previous"] = PreviousName(event);
  j["event_ms"] = EventMs(event, now_ms);
  return j;
}

}  // namespace stemma::cli
