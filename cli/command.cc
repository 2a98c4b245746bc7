#include "cli/command.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstring>
#include <iostream>
#include <memory>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/auth.h"
#include "common/files.h"
#include "common/status.h"

namespace stemma::cli {

namespace {

// Set once by main before any action runs.
std::string* jsonpath_template = new std::string;
bool no_headers = false;

constexpr char kWaitPayload[] = "stemma.dev/wait-timeout";
constexpr char kServerPayload[] = "stemma.dev/from-coordinator";

// -o name: an item's id, else its name, else its job's id.
std::string NameOf(const nlohmann::json& item) {
  if (!item.is_object()) return item.is_string() ? item.get<std::string>() : item.dump();
  for (const char* key : {"id", "name", "job_id"}) {
    auto it = item.find(key);
    if (it != item.end() && it->is_string() && !it->get<std::string>().empty()) return *it;
  }
  return "";
}

}  // namespace

void SetOutputSettings(const std::string& jsonpath, bool headers_off) {
  *jsonpath_template = jsonpath;
  no_headers = headers_off;
}

bool IsStructured(OutputFormat format) {
  return format == OutputFormat::kJson || format == OutputFormat::kYaml ||
         format == OutputFormat::kName || format == OutputFormat::kJsonPath;
}

void PrintStructured(const nlohmann::json& value, OutputFormat format) {
  if (format == OutputFormat::kYaml) {
    std::cout << JsonToYaml(value);
  } else if (format == OutputFormat::kName) {
    // A list's items, or an object holding one list (a response such as {"job_ids": [...]}).
    const nlohmann::json* items = &value;
    if (value.is_object() && NameOf(value).empty()) {
      for (const auto& [key, v] : value.items()) {
        if (v.is_array()) items = &v;
      }
    }
    if (!items->is_array()) {
      std::cout << NameOf(*items) << "\n";
      return;
    }
    for (const auto& item : *items) {
      if (std::string name = NameOf(item); !name.empty()) std::cout << name << "\n";
    }
  } else if (format == OutputFormat::kJsonPath) {
    const nlohmann::json input =
        value.is_array() ? nlohmann::json{{"kind", "List"}, {"items", value}} : value;
    absl::StatusOr<std::string> out = ApplyJsonPath(input, *jsonpath_template);
    std::cout << (out.ok() ? *out : std::string(out.status().message())) << "\n";
  } else {
    std::cout << value.dump(2) << "\n";
  }
}

CLI::Validator DurationFlag() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        absl::StatusOr<double> seconds = ParseDurationSeconds(value, "duration");
        if (!seconds.ok()) return std::string(seconds.status().message());
        value = absl::StrCat(*seconds);
        return "";
      },
      "DURATION");
}

void PrintTable(const std::string& table) {
  if (!no_headers) {
    std::cout << table;
    return;
  }
  const size_t eol = table.find('\n');
  if (eol != std::string::npos) std::cout << table.substr(eol + 1);
}

absl::Status WaitTimedOut(const std::string& message) {
  absl::Status status = absl::DeadlineExceededError(message);
  status.SetPayload(kWaitPayload, absl::Cord("1"));
  return status;
}

absl::Status FromCoordinator(absl::Status status) {
  if (!status.ok()) status.SetPayload(kServerPayload, absl::Cord("1"));
  return status;
}

int ExitCodeFor(const absl::Status& status) {
  if (status.ok()) return kExitOk;
  if (status.GetPayload(kWaitPayload).has_value()) return kExitTimedOut;
  if (IsUsageError(status)) return kExitUsage;
  const absl::StatusCode code = status.code();
  if (code == absl::StatusCode::kUnavailable || code == absl::StatusCode::kDeadlineExceeded) {
    return kExitUnreachable;
  }
  if (status.GetPayload(kServerPayload).has_value()) return kExitRefused;
  switch (code) {  // found here, before anything was sent
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kAlreadyExists:
      return kExitUsage;
    default:
      return kExitFailed;
  }
}

int64_t NowMs() { return absl::ToUnixMillis(absl::Now()); }

namespace {

struct TokenOptions {
  std::string role;
  std::string subject;
  std::string file;
  std::string out;  // write the token here (mode 0600) instead of printing it
};

// `token > file` under umask 022 makes a file others can read, which every reader of token
// files refuses: --out writes it 0600 whatever the umask (an existing file is replaced and
// made 0600 too).
absl::Status WriteTokenFile(const std::string& path, const std::string& token) {
  files::UniqueFd fd(
      ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!fd.valid()) {
    return absl::FailedPreconditionError(
        absl::StrCat("--out ", path, ": cannot write: ", std::strerror(errno)));
  }
  const std::string text = token + "\n";
  int err = 0;
  if (::fchmod(fd.get(), 0600) != 0) err = errno;
  if (err == 0) {
    if (absl::Status s = files::WriteAll(fd.get(), text, path); !s.ok()) err = errno;
  }
  if (absl::Status s = fd.Close(path); !s.ok() && err == 0) err = errno;
  if (err != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("--out ", path, ": cannot write: ", std::strerror(err)));
  }
  return absl::OkStatus();
}

absl::StatusOr<int> RunTokenCreate(const GlobalOptions& g, const TokenOptions& o) {
  ASSIGN_OR_RETURN(Role role, ParseRole(o.role));
  if (!o.out.empty() && o.out == o.file) {
    return UsageError("--out must not be the --file token file (that holds digests)");
  }
  std::string token;
  std::string line;
  if (!o.file.empty()) {
    ASSIGN_OR_RETURN(token, CreateTokenInFile(o.file, role, o.subject));
  } else {
    ASSIGN_OR_RETURN(token, NewToken());
  }
  ASSIGN_OR_RETURN(line, TokenFileLine(token, role, o.subject));
  if (!o.out.empty()) {
    RETURN_IF_ERROR(WriteTokenFile(o.out, token));
    std::cerr << "wrote the " << RoleName(role) << " token for " << o.subject << " to " << o.out
              << " (mode 0600)\n";
    if (o.file.empty()) {
      std::cerr << "add this line to the coordinator's --tokens file:\n" << line << "\n";
    }
    return 0;
  }
  // The token is shown once, here; only its digest is kept.
  if (IsStructured(g.format)) {
    nlohmann::json j = {{"token", token},
                        {"role", std::string(RoleName(role))},
                        {"subject", o.subject},
                        {"line", line}};
    if (!o.file.empty()) j["file"] = o.file;
    PrintStructured(j, g.format);
  } else {
    std::cout << token << "\n";
    if (o.file.empty()) {
      std::cerr << "add this line to the coordinator's --tokens file:\n" << line << "\n";
    } else {
      std::cerr << "added " << RoleName(role) << " token for " << o.subject << " to " << o.file
                << " (the coordinator reloads it within seconds)\n";
    }
  }
  return 0;
}

}  // namespace

void AddTokenCommand(CLI::App* app, const GlobalOptions* globals, Action* action) {
  CLI::App* token = app->add_subcommand("token", "Bearer tokens for the coordinator");
  token->require_subcommand(1);
  auto o = std::make_shared<TokenOptions>();
  CLI::App* create = token->add_subcommand(
      "create", "Print a new token once; store its sha256 digest in the token file");
  create->add_option("--role", o->role, "admin | user | worker | read-only")->required();
  create
      ->add_option("--subject", o->subject,
                   "who holds it: a user name, or the worker id for a worker token")
      ->required();
  create->add_option("--file", o->file,
                     "append the digest line to this token file (created with mode 0600)");
  create->add_option("--out", o->out,
                     "write the token to this file, mode 0600 whatever the umask, instead of "
                     "printing it (`> file` would make it readable by others, and the CLI and "
                     "workers refuse such files)");
  create->callback(
      [globals, action, o] { *action = [globals, o] { return RunTokenCreate(*globals, *o); }; });
}

}  // namespace stemma::cli
