#include "worker/exec_outputs.h"

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/files.h"
#include "common/manifest.h"
#include "common/sha256.h"
#include "common/status.h"

namespace stemma::worker {
namespace {

namespace fs = std::filesystem;

constexpr char kResultsFormat[] = "stemma-eval-v1";
constexpr size_t kMaxResultsBytes = 64 << 20;
constexpr size_t kMaxFiles = 100000;

std::string Trimmed(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

// Every regular file below `dir` (relative paths, sorted), the manifest itself and the
// atomic writer's temporaries left out; symbolic links are not followed.
absl::StatusOr<std::vector<std::string>> FilesBelow(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  fs::recursive_directory_iterator it(dir, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    if (!it->is_regular_file(ec) || it->is_symlink(ec)) continue;
    const std::string rel = it->path().lexically_relative(dir).string();
    if (rel == manifest::kManifestName ||
        rel.rfind(std::string(manifest::kManifestName) + ".tmp-", 0) == 0) {
      continue;
    }
    if (out.size() >= kMaxFiles) {
      return absl::ResourceExhaustedError(absl::StrCat(dir, ": more than ", kMaxFiles, " files"));
    }
    out.push_back(rel);
  }
  if (ec) return absl::InternalError(absl::StrCat("cannot list ", dir, ": ", ec.message()));
  std::sort(out.begin(), out.end());
  return out;
}

// Whether `path` was modified at or after `since_ms` (wall clock).
bool ModifiedSince(const std::string& path, int64_t since_ms) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return false;
  const int64_t mtime_ms =
      static_cast<int64_t>(st.st_mtim.tv_sec) * 1000 + st.st_mtim.tv_nsec / 1000000;
  return mtime_ms >= since_ms;
}

// What CollectOne passes on about the attempt.
struct Attempt {
  const v1::JobSpec& spec;
  const std::vector<std::string>& inputs;
  const std::string& job_id;
  const std::string& attempt_id;
  int64_t started_ms;
};

// The directory's stemma.json: the program's own when it wrote one during the attempt, else
// one written here. Sets the artifact's manifest hash, bytes and parents.
absl::Status DirectoryManifest(const std::string& dir, const std::string& type, const Attempt& at,
                               v1::OutputArtifact* art) {
  const v1::JobSpec& spec = at.spec;
  const std::vector<std::string>& inputs = at.inputs;
  const std::string path = absl::StrCat(dir, "/", manifest::kManifestName);
  if (files::PathExists(path) && ModifiedSince(path, at.started_ms)) {
    ASSIGN_OR_RETURN(std::string text, files::ReadFile(path));
    ASSIGN_OR_RETURN(manifest::Manifest m, manifest::ParseManifest(text, path));
    art->set_manifest_sha256(Sha256Hex(text));
    int64_t bytes = 0;
    for (const auto& [name, f] : m.files) bytes += static_cast<int64_t>(f.bytes);
    art->set_bytes(bytes);
    for (const manifest::ManifestParent& p : m.parents) art->add_parents(p.path);
    return absl::OkStatus();
  }
  manifest::Manifest m;
  m.type = type;
  ASSIGN_OR_RETURN(std::vector<std::string> names, FilesBelow(dir));
  int64_t bytes = 0;
  for (const std::string& name : names) {
    manifest::ManifestFile f;
    ASSIGN_OR_RETURN(f.sha256, Sha256File(absl::StrCat(dir, "/", name), &f.bytes));
    bytes += static_cast<int64_t>(f.bytes);
    m.files[name] = std::move(f);
  }
  for (const std::string& input : inputs) {
    const std::string parent_manifest = absl::StrCat(input, "/", manifest::kManifestName);
    if (!files::PathExists(parent_manifest)) continue;
    manifest::ManifestParent p;
    p.path = input;
    ASSIGN_OR_RETURN(p.manifest_sha256, Sha256File(parent_manifest));
    m.parents.push_back(std::move(p));
    art->add_parents(input);
  }
  m.producer.job = at.job_id;
  m.producer.attempt = at.attempt_id;
  m.producer.command = "exec";
  m.producer.params = nlohmann::json::object();
  m.producer.params["argv"] =
      std::vector<std::string>(spec.exec().argv().begin(), spec.exec().argv().end());
  m.created_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                     std::chrono::system_clock::now().time_since_epoch())
                     .count();
  const std::string text = manifest::ManifestToJson(m).dump(2) + "\n";
  RETURN_IF_ERROR(files::WriteFileAtomic(path, text));
  art->set_manifest_sha256(Sha256Hex(text));
  art->set_bytes(bytes);
  return absl::OkStatus();
}

// A results file's metric points: each task's metrics as <metric>/<task> with its labels, or
// (without tasks) the top-level metrics as named. InvalidArgument when it is not the format.
absl::Status ResultPoints(const std::string& path, std::vector<ResultPoint>* points) {
  ASSIGN_OR_RETURN(std::string text, files::ReadFile(path));
  if (text.size() > kMaxResultsBytes) {
    return absl::InvalidArgumentError(absl::StrCat("larger than ", kMaxResultsBytes, " bytes"));
  }
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return absl::InvalidArgumentError("not a JSON object");
  if (!j.contains("format") || j["format"] != kResultsFormat) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"format\" is not \"", kResultsFormat, "\" (docs/eval.md)"));
  }
  auto add = [&](const std::string& name, const nlohmann::json& v,
                 std::map<std::string, std::string> labels) {
    if (!v.is_number() || !std::isfinite(v.get<double>()) || name.size() > 200) return;
    points->push_back({name, v.get<double>(), std::move(labels)});
  };
  if (j.contains("tasks") && j["tasks"].is_array()) {
    for (const nlohmann::json& t : j["tasks"]) {
      if (!t.is_object() || !t.contains("name") || !t["name"].is_string()) continue;
      if (!t.contains("metrics") || !t["metrics"].is_object()) continue;
      std::map<std::string, std::string> labels = {{"task", t["name"].get<std::string>()}};
      for (const char* key : {"type", "language"}) {
        if (t.contains(key) && t[key].is_string()) labels[key] = t[key].get<std::string>();
      }
      for (const auto& [m, v] : t["metrics"].items()) {
        add(absl::StrCat(m, "/", labels["task"]), v, labels);
      }
    }
  } else if (j.contains("metrics") && j["metrics"].is_object()) {
    for (const auto& [m, v] : j["metrics"].items()) add(m, v, {});
  }
  if (points->empty()) return absl::InvalidArgumentError("holds no metrics");
  return absl::OkStatus();
}

// One declared output: "" or what is wrong with it.
std::string CollectOne(const std::string& name, const v1::ExecOutput& out, const std::string& path,
                       const Attempt& at, ExecOutputs* result) {
  const std::string what = absl::StrCat("declared output '", name, "' (", out.type(), ")");
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return absl::StrCat(what, " is missing: ", path);
  const bool dir = S_ISDIR(st.st_mode);
  v1::OutputArtifact art;
  art.set_name(name);
  art.set_path(path);
  art.set_operation("exec");
  absl::Status status;
  if (out.type() == "checkpoint") {
    if (!dir) return absl::StrCat(what, " is not a directory: ", path);
    if (!files::PathExists(path + "/config.json")) {
      return absl::StrCat(what, " has no config.json: ", path);
    }
    if (!files::PathExists(path + "/model.safetensors") &&
        !files::PathExists(path + "/model.safetensors.index.json")) {
      return absl::StrCat(what, " has no model.safetensors (or its index): ", path);
    }
    art.set_type("checkpoint");
    status = DirectoryManifest(path, "checkpoint", at, &art);
  } else if (out.type() == "dataset" && dir) {
    art.set_type("dataset");
    status = DirectoryManifest(path, "dataset", at, &art);
  } else {
    if (!S_ISREG(st.st_mode)) return absl::StrCat(what, " is not a regular file: ", path);
    art.set_type(out.type() == "dataset" ? "dataset" : "file");
    if (out.type() == "results") {
      std::vector<ResultPoint> points;
      status = ResultPoints(path, &points);
      if (!status.ok()) return absl::StrCat(what, " ", path, ": ", status.message());
      for (ResultPoint& p : points) result->points.push_back(std::move(p));
    }
    uint64_t bytes = 0;
    absl::StatusOr<std::string> sha = Sha256File(path, &bytes);
    if (sha.ok()) {
      art.set_manifest_sha256(*sha);
      art.set_bytes(static_cast<int64_t>(bytes));
    }
    status = sha.status();
  }
  if (!status.ok()) return absl::StrCat(what, " ", path, ": ", status.message());
  result->artifacts.push_back(std::move(art));
  return "";
}

}  // namespace

std::string ResolveExecPath(const std::string& path, const std::string& storage_root,
                            const std::string& workdir) {
  if (path.empty() || path[0] == '/') return Trimmed(fs::path(path).lexically_normal().string());
  const std::string& base = storage_root.empty() ? workdir : storage_root;
  return Trimmed((fs::path(base) / path).lexically_normal().string());
}

std::string ExecOutputVariable(const std::string& name) {
  return absl::StrCat("STEMMA_OUTPUT_", absl::AsciiStrToUpper(name));
}

ExecOutputs CollectExecOutputs(const v1::JobSpec& spec, const std::string& job_id,
                               const std::string& attempt_id, const std::string& storage_root,
                               const std::string& workdir, int64_t started_ms) {
  ExecOutputs result;
  std::vector<std::string> inputs;
  for (const std::string& in : spec.exec().inputs()) {
    inputs.push_back(ResolveExecPath(in, storage_root, workdir));
  }
  // protobuf maps iterate in no fixed order: by name.
  std::map<std::string, v1::ExecOutput> outputs(spec.exec().outputs().begin(),
                                                spec.exec().outputs().end());
  for (const auto& [name, out] : outputs) {
    const std::string path = ResolveExecPath(out.path(), storage_root, workdir);
    result.error =
        CollectOne(name, out, path, Attempt{spec, inputs, job_id, attempt_id, started_ms}, &result);
    if (!result.error.empty()) {
      result.artifacts.clear();
      result.points.clear();
      return result;
    }
  }
  return result;
}

}  // namespace stemma::worker
