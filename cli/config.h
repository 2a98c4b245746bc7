// The CLI's config file: named contexts, as kubeconfig has them. A context names a
// coordinator (address), the CA of its TLS certificate and the file holding the token, and
// optionally the namespace `exp` commands look names up in; `current-context` picks the one
// used when no --context is given.
//
//   current-context: lab
//   contexts:
//   - name: lab
//     server: coord.lab:7070
//     ca: /home/me/.config/stemma/lab-ca.pem
//     token-file: /home/me/.config/stemma/lab-token
//     namespace: nlp
//
// The file is $STEMMA_CONFIG, else ~/.config/stemma/config.yaml. Pure file handling: no
// RPCs. Thread-compatible.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace stemma::cli {

struct Context {
  std::string name;
  std::string server;      // HOST:PORT
  std::string ca;          // PEM CA file ("": plaintext, or the default CA file)
  std::string token_file;  // "": no token (or the default token file)
  std::string space;       // the namespace of `exp` commands ("": the caller's own)
};

struct CliConfig {
  std::string current_context;
  std::vector<Context> contexts;

  const Context* Find(const std::string& name) const;
  Context* Find(const std::string& name);
};

// $STEMMA_CONFIG, else $HOME/.config/stemma/config.yaml ("" when neither is known).
std::string ConfigPath();
// The file at `path`; an empty config when it does not exist. InvalidArgument naming the
// file and the problem when it does not parse or a context lacks a name.
absl::StatusOr<CliConfig> LoadConfig(const std::string& path);
// Writes `config` to `path` (mode 0600: it names token files), creating its directory.
absl::Status SaveConfig(const std::string& path, const CliConfig& config);

}  // namespace stemma::cli
