// Rendering of jobs and workers for people (tables, key: value) and programs (JSON, YAML),
// plus parsing of the filter flags. Pure functions: no I/O, no RPCs; thread-compatible.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "stemma/v1/job.pb.h"
#include "stemma/v1/user_service.pb.h"

namespace stemma::cli {

// kCsv: commands without a CSV form (all but `metrics`) print their table. kName: the ids
// (or names) of what the command shows, one a line. kJsonPath: the JSON through a template.
enum class OutputFormat { kTable, kWide, kJson, kYaml, kCsv, kName, kJsonPath };

// "table" | "wide" | "json" | "yaml" | "csv" | "name" | "jsonpath=TEMPLATE"; a usage error
// otherwise. With jsonpath, `*jsonpath` receives the template (checked here).
absl::StatusOr<OutputFormat> ParseOutputFormat(const std::string& name,
                                               std::string* jsonpath = nullptr);

// kubectl's JSONPath subset (docs/cli.md): literal text with {EXPR} where EXPR is
// `.a.b`, `.items[*].id`, `.items[0]`, `.items[-1]`, `['key with dots']`, `$`/`@` roots,
// `"literal\n"`, and `{range .items[*]}...{end}` (paths inside are relative to the item).
// Text outside braces keeps \n and \t escapes. Strings print raw, other values as JSON;
// several results of one expression are separated by spaces. A usage error naming the
// problem for a template that does not parse.
absl::StatusOr<std::string> ApplyJsonPath(const nlohmann::json& value,
                                          const std::string& template_text);
// "90" (seconds), "90s", "500ms", "10m", "2h", "30d", "1h30m" to seconds; a usage error
// naming `flag` otherwise.
absl::StatusOr<double> ParseDurationSeconds(const std::string& text, const std::string& flag);

// A usage error: main exits with status 2 instead of 1.
absl::Status UsageError(const std::string& message);
bool IsUsageError(const absl::Status& status);

// Job states from flag values: each may be a comma list; names are case-insensitive
// ("running", "Failed"). A usage error naming the bad value otherwise.
absl::StatusOr<std::vector<v1::JobState>> ParseStates(const std::vector<std::string>& values);
// "noop" | "exec" | "engine" (case-insensitive), returned lower-case.
absl::StatusOr<std::string> ParseKind(const std::string& value);
// "k=v" values into a map; a usage error naming the value without '=' or with an empty key.
absl::StatusOr<std::map<std::string, std::string>> ParseLabels(
    const std::vector<std::string>& values);

// "850ms" below a second, then "3s", "4m", "2h", "5d". Negative durations render as "0s".
std::string HumanDuration(int64_t ms);
// Age of a wall-clock timestamp at `now_ms`; "-" when the timestamp is unset (0).
std::string HumanAge(int64_t timestamp_ms, int64_t now_ms);
// MiB as "512M", "16G", "1.5T"; "-" for 0.
std::string HumanMemoryMb(int64_t mb);
// "2024-05-01 12:03:04.123" in local time; "-" for 0.
std::string FormatTimestamp(int64_t ms);
// "12:03:04.123" in local time.
std::string FormatClock(int64_t ms);

// The machine-readable shape of a job, shared by `get`, `ls`, `watch` and benchmarks:
// id, name, kind, state (upper-case), attempts, max_attempts, priority, labels, experiment,
// depends_on, reason, exit_code, archived, preemptions, preempted_by, created_ms, queued_ms,
// started_ms, finished_ms, attempt_id, workers, gpus, progress {fraction, message, step}, outputs,
// spec (protobuf JSON).
nlohmann::json JobToJson(const v1::Job& job);
// id, host, state ("ALIVE" | "DRAINING" | "LOST"), gpus [{id, model, memory_mb}],
// gpus_in_use, cpus, cpus_in_use, memory_mb, memory_in_use_mb, labels, allow_exec,
// attempts, last_heartbeat_ms (as sent), heartbeat_age_ms, registered_ms.
nlohmann::json WorkerToJson(const v1::WorkerInfo& worker);

// Milliseconds since the worker's last heartbeat at `now_ms`; negative when unknown
// (disconnected). Accepts last_heartbeat_ms as an age (what the coordinator sends) or as
// a Unix timestamp.
int64_t HeartbeatAgeMs(const v1::WorkerInfo& worker, int64_t now_ms);

// "ALIVE", "DRAINING", "LOST", "UNSPECIFIED".
std::string WorkerStateName(v1::WorkerState state);

// A YAML document with the same tree as `value` (strings that would read back as another
// type are quoted). Ends with a newline.
std::string JsonToYaml(const nlohmann::json& value);

// Terminal safety (issue 25): every string that came from the coordinator — names,
// reasons, engine-spec strings such as an eval task's name or a path — may carry escape
// sequences (ESC, OSC, CSI) or line breaks that would drive the user's terminal or forge
// table rows. Two guards, both here:
//  - TerminalSafe(text) for a one-line field: control characters (C0 including \n, \r and
//    \t, DEL, and C1 as UTF-8 U+0080..U+009F) become visible escapes ("\n", "\u001b");
//    RenderTable applies it to every cell, the line renderers to every field;
//  - GuardStdout() (main, before any command runs) routes std::cout and std::cerr through a
//    filter that writes every control character but \n, \t and \r the same way, so that
//    nothing printed anywhere reaches the terminal raw. `stemma logs` into a file or pipe
//    keeps the job's bytes (UnguardStdout()).
std::string TerminalSafe(std::string_view text);
void GuardStdout();
void UnguardStdout();

// Columns padded to their widest cell, separated by three spaces; no trailing blanks.
// Ends with a newline.
std::string RenderTable(const std::vector<std::string>& header,
                        const std::vector<std::vector<std::string>>& rows);

// The `ls` table: ID NAME KIND STATE ATTEMPTS AGE REASON; `wide` adds
// PRIORITY GPUS WORKER(S) EXIT.
std::string RenderJobsTable(const std::vector<v1::Job>& jobs, bool wide, int64_t now_ms);
// One job as aligned "key: value" lines.
std::string RenderJobDetails(const v1::Job& job, int64_t now_ms);
// Attempt history (`stemma get`): every attempt, oldest first, as JSON (number, id, workers,
// assigned_ms, started_ms, finished_ms, result, preempted_by) and as a table
// ATTEMPT WORKERS STARTED FINISHED RESULT PREEMPTED-BY.
nlohmann::json AttemptsToJson(const std::vector<v1::Attempt>& history);
std::string RenderAttemptsTable(const std::vector<v1::Attempt>& history);
// The `workers` table: ID HOST STATE GPUS CPUS MEM ATTEMPTS HEARTBEAT-AGE (wide adds
// LABELS and EXEC).
std::string RenderWorkersTable(const std::vector<v1::WorkerInfo>& workers, bool wide,
                               int64_t now_ms);

// One `watch` line: "HH:MM:SS.mmm ID NAME PREV -> STATE reason" ("-" for no previous
// state, at the job's updated_ms or `now_ms` when unset). No newline.
std::string RenderEventLine(const v1::JobEvent& event, int64_t now_ms);
// "40% step 12 loss 2.5 lr 0.0003": the job's last reported progress, or "" when none.
std::string ProgressText(const v1::Job& job);
// The job's JSON with "previous" and "event_ms" added.
nlohmann::json EventToJson(const v1::JobEvent& event, int64_t now_ms);

}  // namespace stemma::cli
