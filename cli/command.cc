#include "cli/command.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstring>
#include <iostream>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/auth.h"
#include "common/files.h"
#include "common/status.h"

namespace stemma::cli {

void PrintStructured(const nlohmann::json& value, OutputFormat format) {
  if (format == OutputFormat::kYaml) {
    std::cout << JsonToYaml(value);
  } else {
    std::cout << value.dump(2) << "\n";
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
  if (g.format == OutputFormat::kJson || g.format == OutputFormat::kYaml) {
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
