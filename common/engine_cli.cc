#include "common/engine_cli.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/engine_contract.h"
#include "common/engine_spec.h"
#include "common/files.h"
#include "common/proto_yaml.h"
#include "common/status.h"
#include "common/yaml_json.h"

namespace stemma {
namespace {

namespace pb = google::protobuf;

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::string(v) : std::string();
}

}  // namespace

std::optional<int64_t> ModelLayersFromConfig(const std::string& dir) {
  if (dir.empty() || dir.rfind("ckpt:", 0) == 0 || dir.rfind("${{", 0) == 0) return std::nullopt;
  absl::StatusOr<std::string> text = files::ReadFile(dir + "/config.json");
  if (!text.ok()) return std::nullopt;
  absl::StatusOr<std::vector<YamlNode>> docs = LoadYamlDocuments(*text, "config.json");
  if (!docs.ok() || docs->empty()) return std::nullopt;
  const YamlNode* root = &(*docs)[0];
  if (const YamlNode* t = root->Find("text_config"); t != nullptr && t->IsMap()) root = t;
  const YamlNode* n = root->Find("num_hidden_layers");
  int64_t layers = 0;
  if (n == nullptr || !n->IsScalar() || !absl::SimpleAtoi(n->scalar, &layers)) return std::nullopt;
  return layers;
}

absl::StatusOr<EngineInvocation> ParseEngineCommandLine(
    std::string_view command, int argc, char** argv,
    const std::vector<std::string>& command_flags) {
  EngineInvocation inv;
  inv.spec = NewEngineSpec(command);
  if (inv.spec == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("'", std::string(command), "' takes no spec"));
  }
  const pb::Descriptor* d = inv.spec->GetDescriptor();
  // Flag overrides become one YAML mapping read after the file, so they get the same types
  // and errors as the file's fields.
  std::string overrides;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      inv.help = true;
      inv.spec.reset();
      return inv;
    }
    if (arg.rfind("--", 0) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("unexpected argument '", arg, "' (try --help)"));
    }
    std::string key = arg.substr(2), value;
    bool has_value = false;
    if (auto eq = key.find('='); eq != std::string::npos) {
      value = key.substr(eq + 1);
      key = key.substr(0, eq);
      has_value = true;
    }
    const bool own =
        std::find(command_flags.begin(), command_flags.end(), key) != command_flags.end();
    const std::string field = absl::StrReplaceAll(key, {{"-", "_"}});
    const pb::FieldDescriptor* f = own || key == "spec" ? nullptr : d->FindFieldByName(field);
    if (!own && key != "spec" && f == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", key, " (try --help)"));
    }
    if (!has_value) {
      if (f != nullptr && f->cpp_type() == pb::FieldDescriptor::CPPTYPE_BOOL &&
          (i + 1 >= argc || std::string_view(argv[i + 1]).rfind("--", 0) == 0)) {
        value = "true";  // --tie-embeddings
      } else if (i + 1 < argc) {
        value = argv[++i];
      } else {
        return absl::InvalidArgumentError(absl::StrCat("flag --", key, " needs a value"));
      }
    }
    if (key == "spec") {
      inv.spec_file = value;
    } else if (own) {
      inv.flags[key] = value;
    } else {
      absl::StrAppend(&overrides, field, ": ", value, "\n");
    }
  }

  FieldLines lines;
  std::string where = "command line";
  if (!inv.spec_file.empty()) {
    absl::StatusOr<std::string> text = files::ReadFile(inv.spec_file);
    if (!text.ok()) {
      return absl::NotFoundError(absl::StrCat(inv.spec_file, ": cannot open the spec file"));
    }
    ASSIGN_OR_RETURN(std::vector<YamlNode> docs, LoadYamlDocuments(*text, inv.spec_file));
    if (docs.size() != 1 || !docs[0].IsMap()) {
      return absl::InvalidArgumentError(
          absl::StrCat(inv.spec_file, ": the spec must be one mapping"));
    }
    RETURN_IF_ERROR(ReadYamlInto(docs[0], inv.spec.get(), inv.spec_file, "", &lines));
    where = inv.spec_file;
  }
  if (!overrides.empty()) {
    ASSIGN_OR_RETURN(std::vector<YamlNode> docs, LoadYamlDocuments(overrides, "command line"));
    if (!docs.empty() && docs[0].IsMap()) {
      // Set fields are replaced, not appended to.
      for (size_t k = 0; k + 1 < docs[0].items.size(); k += 2) {
        const pb::FieldDescriptor* f = d->FindFieldByName(docs[0].items[k].scalar);
        if (f != nullptr) inv.spec->GetReflection()->ClearField(inv.spec.get(), f);
      }
      RETURN_IF_ERROR(ReadYamlInto(docs[0], inv.spec.get(), "command line", "", nullptr));
    }
  }
  FillSpecDefaults(inv.spec.get());
  std::string root = Env(std::string(engine_contract::kEnvStorageRoot).c_str());
  if (root.empty()) {
    root = inv.spec_file.empty() ? std::filesystem::current_path().string()
                                 : std::filesystem::absolute(inv.spec_file).parent_path().string();
  }
  ResolveSpecPaths(inv.spec.get(), root);
  SpecContext context;
  context.where = where;
  context.lines = &lines;
  context.model_layers = ModelLayersFromConfig;
  int64_t cpus = 0;
  if (absl::SimpleAtoi(Env(std::string(engine_contract::kEnvCpus).c_str()), &cpus))
    context.job_cpus = cpus;
  RETURN_IF_ERROR(ValidateEngineSpec(*inv.spec, context));
  return inv;
}

std::string EngineHelp(std::string_view command, std::string_view usage) {
  return absl::StrCat(
      "usage: ", std::string(usage), "\n\nSpec fields (in --spec FILE, or as --<field> VALUE):\n",
      SpecHelpText(command), "\nReference: docs/engine/", std::string(command), ".md\n");
}

int ReportEngineFailure(const absl::Status& status) {
  std::fprintf(stderr, "%.*s%s\n", static_cast<int>(engine_contract::kErrorPrefix.size()),
               engine_contract::kErrorPrefix.data(), std::string(status.message()).c_str());
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kAlreadyExists:
      return engine_contract::kExitBadInput;
    default:
      return engine_contract::kExitFailed;
  }
}

int64_t EffectiveThreads(int64_t spec_threads) {
  if (spec_threads > 0) return spec_threads;
  int64_t cpus = 0;
  if (absl::SimpleAtoi(Env(std::string(engine_contract::kEnvCpus).c_str()), &cpus) && cpus > 0)
    return cpus;
  return 0;
}

}  // namespace stemma
