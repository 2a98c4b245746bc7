// stemma ckpt ls|show|lineage|verify|gc|pin|unpin: the checkpoint registry.
#include <CLI/CLI.hpp>
#include <iostream>
#include <map>
#include <memory>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cli/client.h"
#include "cli/command.h"
#include "cli/metrics_view.h"
#include "common/job_spec.h"
#include "common/status.h"

namespace stemma::cli {
namespace {

bool Structured(const GlobalOptions& g) { return IsStructured(g.format); }

struct ListOptions {
  std::string experiment, job, type, sha256;
  bool all = false;
  int limit = 0;
};

absl::StatusOr<int> RunList(const GlobalOptions& g, const ListOptions& o) {
  v1::ListArtifactsRequest request;
  request.set_experiment(o.experiment);
  request.set_job_id(o.job);
  request.set_type(o.type);
  request.set_manifest_sha256(o.sha256);
  request.set_include_deleted(o.all);
  if (o.limit < 0) return UsageError("--limit must not be negative");
  request.set_limit(o.limit);
  CoordinatorClient client(g.coordinator, g.timeout());
  ASSIGN_OR_RETURN(v1::ListArtifactsResponse response, client.ListArtifacts(request));
  std::vector<v1::Artifact> list(response.artifacts().begin(), response.artifacts().end());
  if (Structured(g)) {
    nlohmann::json array = nlohmann::json::array();
    for (const auto& a : list) array.push_back(ArtifactToJson(a));
    PrintStructured(array, g.format);
  } else {
    PrintTable(RenderArtifactsTable(list, g.format == OutputFormat::kWide, NowMs()));
  }
  return 0;
}

void Line(const std::string& key, const std::string& value) {
  std::cout << key << ":" << std::string(key.size() < 16 ? 16 - key.size() : 1, ' ') << value
            << "\n";
}

absl::StatusOr<int> RunShow(const GlobalOptions& g, const std::string& id) {
  CoordinatorClient client(g.coordinator, g.timeout());
  ASSIGN_OR_RETURN(v1::ArtifactDetails d, client.GetArtifact(id));
  if (Structured(g)) {
    nlohmann::json j = ArtifactToJson(d.artifact());
    j["parents_detail"] = nlohmann::json::array();
    for (const auto& p : d.parents()) j["parents_detail"].push_back(ArtifactToJson(p));
    j["children"] = nlohmann::json::array();
    for (const auto& c : d.children()) j["children"].push_back(c.id());
    j["consumer_jobs"] =
        std::vector<std::string>(d.consumer_jobs().begin(), d.consumer_jobs().end());
    if (d.has_producer()) {
      j["producer"] = {{"id", d.producer().id()},
                       {"state", v1::JobState_Name(d.producer().state())},
                       {"spec", JobToJson(d.producer())["spec"]}};
    }
    PrintStructured(j, g.format);
    return 0;
  }
  const v1::Artifact& a = d.artifact();
  Line("id", a.id());
  Line("name", a.name().empty() ? "-" : a.name());
  Line("type", a.type());
  Line("path", a.path());
  Line("state", a.state() == v1::ARTIFACT_DELETED ? "deleted (" + a.deleted_by() + ")" : "present");
  Line("manifest_sha256", a.manifest_sha256().empty() ? "-" : a.manifest_sha256());
  Line("size", HumanBytes(a.bytes()));
  Line("verification",
       absl::StrCat(absl::AsciiStrToLower(v1::Verification_Name(a.verification())),
                    a.verification_detail().empty() ? "" : ": " + a.verification_detail()));
  Line("pinned", a.pinned() ? "yes" : "no");
  Line("operation", a.operation().empty() ? "-" : a.operation());
  Line("owner", a.owner().empty() ? "-" : a.owner());
  Line("experiment", a.experiment().empty() ? "-" : a.experiment());
  Line("stage", a.stage().empty() ? "-" : a.stage());
  Line("created", FormatTimestamp(a.created_ms()));
  if (d.has_producer()) {
    Line("job", absl::StrCat(d.producer().id(), " (", d.producer().spec().name(), ", ",
                             StateName(d.producer().state()), ", attempt ", a.attempt(), ")"));
    Line("spec", JobToJson(d.producer())["spec"].dump());
  } else {
    Line("job", a.external() ? "- (external: first seen as a parent)" : a.job_id());
  }
  std::vector<std::string> parents;
  for (const auto& p : d.parents()) parents.push_back(p.id() + " " + p.path());
  Line("parents", parents.empty() ? "-" : absl::StrJoin(parents, "; "));
  // Per measuring job: an old eval's numbers are not shown as if one measurement with a
  // newer eval's.
  const std::vector<std::string> measured = MeasuredLines(a);
  if (measured.empty()) Line("metrics", "-");
  for (size_t i = 0; i < measured.size(); ++i) {
    if (i == 0) {
      Line("metrics", measured[i]);
    } else {
      std::cout << std::string(17, ' ') << measured[i] << "\n";  // under the first
    }
  }
  std::vector<std::string> children;
  for (const auto& c : d.children()) children.push_back(c.id());
  Line("children", children.empty() ? "-" : absl::StrJoin(children, " "));
  Line("consumers", d.consumer_jobs().empty() ? "-" : absl::StrJoin(d.consumer_jobs(), " "));
  return 0;
}

absl::StatusOr<int> RunLineage(const GlobalOptions& g, const std::string& id, int depth) {
  if (depth < 0) return UsageError("--depth must not be negative");
  v1::LineageRequest request;
  request.set_id(id);
  request.set_max_depth(depth);
  CoordinatorClient client(g.coordinator, g.timeout());
  ASSIGN_OR_RETURN(v1::LineageResponse response, client.Lineage(request));
  if (Structured(g)) {
    nlohmann::json array = nlohmann::json::array();
    for (const auto& a : response.artifacts()) array.push_back(ArtifactToJson(a));
    PrintStructured(nlohmann::json{{"artifacts", array}, {"truncated", response.truncated()}},
                    g.format);
  } else {
    std::cout << RenderLineageTree(response);
  }
  return 0;
}

absl::StatusOr<int> RunVerify(const GlobalOptions& g, const std::string& id) {
  CoordinatorClient client(g.coordinator, g.timeout());
  ASSIGN_OR_RETURN(v1::VerifyArtifactResponse r, client.VerifyArtifact(id));
  if (Structured(g)) {
    PrintStructured(
        {{"artifact", ArtifactToJson(r.artifact())},
         {"ok", r.ok()},
         {"files_checked", r.files_checked()},
         {"problems", std::vector<std::string>(r.problems().begin(), r.problems().end())}},
        g.format);
  } else if (r.ok()) {
    std::cout << r.artifact().id() << " ok: " << r.files_checked() << " files match the manifest\n";
  } else {
    std::cout << r.artifact().id() << " FAILED:\n";
    for (const auto& p : r.problems()) std::cout << "  " << p << "\n";
  }
  return r.ok() ? 0 : 1;
}

struct GcOptions {
  int keep_best = 0;
  std::string metric;
  bool maximize = false;
  int keep_latest = 0;
  bool drop_intermediate = false;
  std::string experiment;
  bool apply = false;
  bool verbose = false;
};

absl::StatusOr<int> RunGc(const GlobalOptions& g, const GcOptions& o) {
  v1::GcRequest request;
  auto* p = request.mutable_policy();
  p->set_keep_best(o.keep_best);
  p->set_metric(o.metric);
  p->set_maximize(o.maximize);
  p->set_keep_latest(o.keep_latest);
  p->set_drop_intermediate(o.drop_intermediate);
  p->set_experiment(o.experiment);
  request.set_apply(o.apply);
  CoordinatorClient client(g.coordinator, g.timeout());
  ASSIGN_OR_RETURN(v1::GcResponse r, client.CollectGarbage(request));
  if (Structured(g)) {
    nlohmann::json array = nlohmann::json::array();
    for (const auto& d : r.decisions()) {
      array.push_back({{"id", d.artifact().id()},
                       {"path", d.artifact().path()},
                       {"deleted", d.deleted()},
                       {"reason", d.reason()},
                       {"error", d.error()},
                       {"bytes", d.artifact().bytes()}});
    }
    PrintStructured(
        {{"applied", r.applied()}, {"bytes_freed", r.bytes_freed()}, {"decisions", array}},
        g.format);
    return 0;
  }
  std::vector<std::vector<std::string>> rows;
  int deleted = 0, failed = 0;
  for (const auto& d : r.decisions()) {
    if (!d.error().empty()) ++failed;
    if (d.deleted()) ++deleted;
    if (!d.deleted() && d.error().empty() && !o.verbose) continue;
    std::string action = !d.error().empty() ? "FAILED"
                         : d.deleted()      ? (o.apply ? "deleted" : "delete")
                                            : "keep";
    rows.push_back({action, d.artifact().id(), d.artifact().name(), d.artifact().job_id(),
                    d.artifact().experiment().empty() ? "-" : d.artifact().experiment(),
                    HumanBytes(d.artifact().bytes()), d.error().empty() ? d.reason() : d.error()});
  }
  if (!rows.empty()) {
    PrintTable(RenderTable({"ACTION", "ID", "NAME", "JOB", "EXPERIMENT", "SIZE", "REASON"}, rows));
  }
  std::cout << (o.apply ? "deleted " : "would delete ") << deleted << " of " << r.decisions_size()
            << " checkpoints, " << HumanBytes(r.bytes_freed())
            << (o.apply ? " freed" : " (dry run: --apply deletes)");
  if (failed > 0) std::cout << "; " << failed << " could not be removed";
  std::cout << "\n";
  return failed > 0 ? 1 : 0;
}

absl::StatusOr<int> RunPin(const GlobalOptions& g, const std::string& id, bool unpin) {
  CoordinatorClient client(g.coordinator, g.timeout());
  ASSIGN_OR_RETURN(v1::Artifact a, client.PinArtifact(id, unpin));
  if (Structured(g)) {
    PrintStructured(ArtifactToJson(a), g.format);
  } else {
    std::cout << a.id() << (a.pinned() ? " pinned" : " unpinned") << "\n";
  }
  return 0;
}

}  // namespace

void AddCkptCommands(CLI::App* app, const GlobalOptions* globals, Action* action) {
  CLI::App* ckpt = app->add_subcommand("ckpt",
                                       "The checkpoint registry: ls, show, lineage, "
                                       "verify, gc, pin, unpin");
  ckpt->require_subcommand(1);
  {
    auto o = std::make_shared<ListOptions>();
    CLI::App* sub = ckpt->add_subcommand("ls", "List registered checkpoints and results");
    sub->add_option("--experiment", o->experiment, "only this experiment's");
    sub->add_option("--job", o->job, "only what this job produced");
    sub->add_option("--type", o->type, "checkpoint | dataset | file");
    sub->add_option("--sha256", o->sha256, "only artifacts with this manifest hash");
    sub->add_flag("--all", o->all, "deleted ones too");
    sub->add_option("--limit", o->limit, "at most this many, newest first (default 1000)");
    sub->callback([=] { *action = [=] { return RunList(*globals, *o); }; });
  }
  {
    auto id = std::make_shared<std::string>();
    CLI::App* sub = ckpt->add_subcommand(
        "show", "One artifact: producing job and spec, parents, metrics, consumers");
    sub->add_option("id", *id, "artifact id (a-12), ckpt:ID or path")->required();
    sub->callback([=] { *action = [=] { return RunShow(*globals, *id); }; });
  }
  {
    auto id = std::make_shared<std::string>();
    auto depth = std::make_shared<int>(0);
    CLI::App* sub =
        ckpt->add_subcommand("lineage", "The ancestry of an artifact, down to the base");
    sub->add_option("id", *id, "artifact id (a-12), ckpt:ID or path")->required();
    sub->add_option("--depth", *depth, "at most this many generations (default: all)");
    sub->callback([=] { *action = [=] { return RunLineage(*globals, *id, *depth); }; });
  }
  {
    auto id = std::make_shared<std::string>();
    CLI::App* sub = ckpt->add_subcommand(
        "verify", "Check an artifact's files against its manifest (exit 1 when they differ)");
    sub->add_option("id", *id, "artifact id (a-12), ckpt:ID or path")->required();
    sub->callback([=] { *action = [=] { return RunVerify(*globals, *id); }; });
  }
  {
    auto o = std::make_shared<GcOptions>();
    CLI::App* sub = ckpt->add_subcommand(
        "gc", "Delete checkpoints a retention policy does not keep (dry run unless --apply)");
    sub->add_option("--keep-best", o->keep_best, "keep the best N per experiment by --metric");
    sub->add_option("--metric", o->metric, "the metric --keep-best ranks by (lower is better)");
    sub->add_flag("--maximize", o->maximize, "higher --metric is better");
    sub->add_option("--keep-latest", o->keep_latest, "keep the latest N per experiment");
    sub->add_flag("--drop-intermediate", o->drop_intermediate,
                  "delete step checkpoints of succeeded runs");
    sub->add_option("--experiment", o->experiment, "only this experiment's checkpoints");
    sub->add_flag("--apply", o->apply, "delete (and record) instead of only listing");
    sub->add_flag("-v,--verbose", o->verbose, "also list what is kept, and why");
    sub->callback([=] { *action = [=] { return RunGc(*globals, *o); }; });
  }
  for (bool unpin : {false, true}) {
    auto id = std::make_shared<std::string>();
    CLI::App* sub = ckpt->add_subcommand(
        unpin ? "unpin" : "pin",
        unpin ? "Let gc delete the artifact again" : "Keep the artifact whatever gc's policy");
    sub->add_option("id", *id, "artifact id (a-12), ckpt:ID or path")->required();
    sub->callback([=] { *action = [=] { return RunPin(*globals, *id, unpin); }; });
  }
}

}  // namespace stemma::cli
