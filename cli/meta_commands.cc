// Commands about the CLI itself, none of which reaches a coordinator: `stemma config`
// (named contexts, cli/config.h) and `stemma completion bash|zsh|fish`, generated from the
// command tree so that it lists every command and flag there is.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <climits>
#include <iostream>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "cli/command.h"
#include "cli/config.h"
#include "common/status.h"

namespace stemma::cli {
namespace {

// A relative path as the absolute one it names now: a context is used from anywhere.
std::string Absolute(const std::string& path) {
  if (path.empty() || path[0] == '/') return path;
  char cwd[PATH_MAX];
  if (::getcwd(cwd, sizeof cwd) == nullptr) return path;
  return absl::StrCat(cwd, "/", path);
}

struct SetContextOptions {
  std::string name;
  std::string server;
  std::string ca;
  std::string token_file;
  std::string space;
  bool use = false;
};

absl::StatusOr<int> RunSetContext(const CLI::App* sub, const SetContextOptions& o) {
  const std::string path = ConfigPath();
  ASSIGN_OR_RETURN(CliConfig config, LoadConfig(path));
  Context* c = config.Find(o.name);
  const bool created = c == nullptr;
  if (created) {
    if (o.server.empty()) return UsageError("a new context needs --server HOST:PORT");
    config.contexts.push_back(Context{o.name, "", "", "", ""});
    c = &config.contexts.back();
  }
  // Only what was given changes; "" clears a field.
  if (sub->count("--server")) c->server = o.server;
  if (sub->count("--ca")) c->ca = Absolute(o.ca);
  if (sub->count("--token-file")) c->token_file = Absolute(o.token_file);
  if (sub->count("--namespace")) c->space = o.space;
  if (o.use || config.current_context.empty()) config.current_context = o.name;
  RETURN_IF_ERROR(SaveConfig(path, config));
  std::cout << "context " << o.name << (created ? " created" : " modified")
            << (config.current_context == o.name ? " (current)" : "") << "\n";
  return 0;
}

absl::StatusOr<int> RunUseContext(const std::string& name) {
  const std::string path = ConfigPath();
  ASSIGN_OR_RETURN(CliConfig config, LoadConfig(path));
  if (config.Find(name) == nullptr) {
    return UsageError(absl::StrCat("no context '", name, "' in ", path));
  }
  config.current_context = name;
  RETURN_IF_ERROR(SaveConfig(path, config));
  std::cout << "switched to context " << name << "\n";
  return 0;
}

absl::StatusOr<int> RunDeleteContext(const std::string& name) {
  const std::string path = ConfigPath();
  ASSIGN_OR_RETURN(CliConfig config, LoadConfig(path));
  if (config.Find(name) == nullptr) {
    return UsageError(absl::StrCat("no context '", name, "' in ", path));
  }
  std::erase_if(config.contexts, [&](const Context& c) { return c.name == name; });
  if (config.current_context == name) config.current_context.clear();
  RETURN_IF_ERROR(SaveConfig(path, config));
  std::cout << "deleted context " << name << "\n";
  return 0;
}

absl::StatusOr<int> RunGetContexts(const GlobalOptions& g) {
  ASSIGN_OR_RETURN(CliConfig config, LoadConfig(ConfigPath()));
  if (IsStructured(g.format)) {
    nlohmann::json list = nlohmann::json::array();
    for (const Context& c : config.contexts) {
      list.push_back({{"name", c.name},
                      {"server", c.server},
                      {"ca", c.ca},
                      {"token_file", c.token_file},
                      {"namespace", c.space},
                      {"current", c.name == config.current_context}});
    }
    PrintStructured(list, g.format);
    return 0;
  }
  std::vector<std::vector<std::string>> rows;
  for (const Context& c : config.contexts) {
    auto dash = [](const std::string& s) { return s.empty() ? std::string("-") : s; };
    rows.push_back({c.name == config.current_context ? "*" : "", c.name, c.server, dash(c.ca),
                    dash(c.token_file), dash(c.space)});
  }
  PrintTable(RenderTable({"CURRENT", "NAME", "SERVER", "CA", "TOKEN-FILE", "NAMESPACE"}, rows));
  return 0;
}

absl::StatusOr<int> RunCurrentContext() {
  const std::string path = ConfigPath();
  ASSIGN_OR_RETURN(CliConfig config, LoadConfig(path));
  if (config.current_context.empty()) {
    return UsageError(
        absl::StrCat("no current context in ", path, " (stemma config use-context NAME)"));
  }
  std::cout << config.current_context << "\n";
  return 0;
}

// ------------------------------------------------------------------ completion

struct Level {
  std::vector<std::pair<std::string, std::string>> commands;  // name, description
  std::vector<std::string> flags;                             // --long and -s
};

bool Hidden(const CLI::App* app) { return app->get_group().empty(); }

void CollectFlags(const CLI::App* app, std::vector<std::string>* flags) {
  for (const CLI::Option* opt : app->get_options()) {
    if (opt->get_group().empty()) continue;
    for (const std::string& l : opt->get_lnames()) flags->push_back("--" + l);
    for (const std::string& s : opt->get_snames()) flags->push_back("-" + s);
  }
}

// Every command path ("" for the top) and what may follow it.
void Walk(const CLI::App* app, const std::string& path, const std::vector<std::string>& globals,
          std::map<std::string, Level>* out) {
  Level& level = (*out)[path];
  CollectFlags(app, &level.flags);
  if (!path.empty()) {
    for (const std::string& flag : globals) {  // the global flags, where not its own
      if (std::find(level.flags.begin(), level.flags.end(), flag) == level.flags.end()) {
        level.flags.push_back(flag);
      }
    }
  }
  for (const CLI::App* sub : app->get_subcommands({})) {
    if (Hidden(sub)) continue;
    level.commands.push_back({sub->get_name(), sub->get_description()});
    Walk(sub, path.empty() ? sub->get_name() : absl::StrCat(path, " ", sub->get_name()), globals,
         out);
  }
}

std::string Words(const Level& level) {
  std::vector<std::string> words;
  for (const auto& [name, d] : level.commands) words.push_back(name);
  words.insert(words.end(), level.flags.begin(), level.flags.end());
  return absl::StrJoin(words, " ");
}

std::string BashScript(const std::map<std::string, Level>& tree) {
  std::string s =
      "# stemma completion for bash: source <(stemma completion bash)\n"
      "_stemma_words() {\n  case \"$1\" in\n";
  for (const auto& [path, level] : tree) {
    absl::StrAppend(&s, "    \"", path, "\") echo \"", Words(level), "\" ;;\n");
  }
  absl::StrAppend(&s,
                  "    *) return 1 ;;\n  esac\n}\n"
                  "_stemma() {\n"
                  "  local cur=\"${COMP_WORDS[COMP_CWORD]}\" path=\"\" next w i\n"
                  "  for ((i = 1; i < COMP_CWORD; i++)); do\n"
                  "    w=\"${COMP_WORDS[i]}\"\n"
                  "    [[ \"$w\" == -* ]] && continue\n"
                  "    next=\"${path:+$path }$w\"\n"
                  "    _stemma_words \"$next\" >/dev/null && path=\"$next\"\n"
                  "  done\n"
                  "  COMPREPLY=($(compgen -W \"$(_stemma_words \"$path\")\" -- \"$cur\"))\n"
                  "}\n"
                  "complete -o default -F _stemma stemma\n");
  return s;
}

std::string FishQuote(const std::string& s) {
  return absl::StrCat("'", absl::StrReplaceAll(s, {{"\\", "\\\\"}, {"'", "\\'"}}), "'");
}

std::string FishScript(const std::map<std::string, Level>& tree) {
  std::vector<std::string> paths;
  for (const auto& [path, level] : tree) {
    if (!path.empty()) paths.push_back(FishQuote(path));
  }
  std::string s = absl::StrCat(
      "# stemma completion for fish: stemma completion fish | source\n"
      "set -g __stemma_paths ",
      absl::StrJoin(paths, " "),
      "\n"
      "function __stemma_at\n"
      "  set -l path\n"
      "  for w in (commandline -opc)[2..-1]\n"
      "    string match -q -- '-*' $w; and continue\n"
      "    set -l next (string join ' ' $path $w)\n"
      "    contains -- \"$next\" $__stemma_paths; and set path $path $w\n"
      "  end\n"
      "  set -l p (string join ' ' $path)\n"
      "  test \"$p\" = \"$argv[1]\"\n"
      "end\n"
      "complete -c stemma -f\n");
  for (const auto& [path, level] : tree) {
    const std::string cond = absl::StrCat("-n ", FishQuote("__stemma_at " + FishQuote(path)));
    for (const auto& [name, description] : level.commands) {
      absl::StrAppend(&s, "complete -c stemma ", cond, " -a ", FishQuote(name), " -d ",
                      FishQuote(description), "\n");
    }
    for (const std::string& flag : level.flags) {
      absl::StrAppend(&s, "complete -c stemma ", cond, flag.rfind("--", 0) == 0 ? " -l " : " -s ",
                      flag.substr(flag[1] == '-' ? 2 : 1), "\n");
    }
  }
  return s;
}

absl::StatusOr<int> RunCompletion(const CLI::App* root, const std::string& shell) {
  std::vector<std::string> globals;
  CollectFlags(root, &globals);
  std::map<std::string, Level> tree;
  Walk(root, "", globals, &tree);
  if (shell == "bash") {
    std::cout << BashScript(tree);
  } else if (shell == "zsh") {
    std::cout << "#compdef stemma\n# stemma completion for zsh: source <(stemma completion zsh)\n"
                 "autoload -U +X bashcompinit && bashcompinit\n"
              << BashScript(tree);
  } else if (shell == "fish") {
    std::cout << FishScript(tree);
  } else {
    return UsageError(absl::StrCat("completion: unknown shell '", shell, "' (bash, zsh or fish)"));
  }
  return 0;
}

}  // namespace

void AddConfigCommands(CLI::App* app, const GlobalOptions* globals, Action* action) {
  CLI::App* config =
      app->add_subcommand("config",
                          "Named contexts in the config file ($STEMMA_CONFIG, else "
                          "~/.config/stemma/config.yaml): which coordinator, CA and token to use");
  config->require_subcommand(1);
  {
    auto o = std::make_shared<SetContextOptions>();
    CLI::App* sub = config->add_subcommand(
        "set-context", "Create or change a context (only the flags given change)");
    sub->add_option("name", o->name, "context name")->required();
    sub->add_option("--server", o->server, "coordinator HOST:PORT");
    sub->add_option("--ca", o->ca, "PEM CA of the coordinator's TLS certificate");
    sub->add_option("--token-file", o->token_file, "file holding the token (mode 0600)");
    sub->add_option("--namespace", o->space, "default namespace of `exp` commands");
    sub->add_flag("--use", o->use, "make it the current context too");
    sub->callback([=] { *action = [=] { return RunSetContext(sub, *o); }; });
  }
  {
    auto name = std::make_shared<std::string>();
    CLI::App* sub = config->add_subcommand("use-context", "Make a context the current one");
    sub->add_option("name", *name, "context name")->required();
    sub->callback([=] { *action = [=] { return RunUseContext(*name); }; });
  }
  {
    auto name = std::make_shared<std::string>();
    CLI::App* sub = config->add_subcommand("delete-context", "Remove a context");
    sub->add_option("name", *name, "context name")->required();
    sub->callback([=] { *action = [=] { return RunDeleteContext(*name); }; });
  }
  CLI::App* get = config->add_subcommand("get-contexts", "List the contexts (* marks the current)");
  get->callback([=] { *action = [=] { return RunGetContexts(*globals); }; });
  CLI::App* current = config->add_subcommand("current-context", "Print the current context");
  current->callback([=] { *action = [] { return RunCurrentContext(); }; });
}

void AddCompletionCommand(CLI::App* app, const GlobalOptions*, Action* action) {
  auto shell = std::make_shared<std::string>();
  CLI::App* sub = app->add_subcommand("completion",
                                      "Print a shell completion script: bash, zsh or fish "
                                      "(e.g. source <(stemma completion bash))");
  sub->add_option("shell", *shell, "bash | zsh | fish")->required();
  sub->callback([=] { *action = [=] { return RunCompletion(app, *shell); }; });
}

}  // namespace stemma::cli
