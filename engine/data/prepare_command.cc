// `stemma-engine prepare` (docs/engine/prepare.md, docs/corpus.md): the spec
// stemma.v1.PrepareSpec from --spec FILE and/or flags, through the one engine command-line
// parser; the work is engine/data/prepare.h.
#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/engine_cli.h"
#include "common/engine_contract.h"
#include "engine/data/commands.h"
#include "engine/data/prepare.h"
#include "engine/events.h"
#include "nlohmann/json.hpp"
#include "stemma/v1/specs/data.pb.h"

namespace stemma::engine {
namespace {

constexpr char kUsage[] =
    "stemma-engine prepare --spec FILE [--out DIR] [--overwrite] [--<field> VALUE ...]";

void Emit(const Event& event) { EventWriter().Emit(event); }

}  // namespace

int RunPrepare(int argc, char** argv) {
  absl::StatusOr<EngineInvocation> inv = ParseEngineCommandLine("prepare", argc, argv, {});
  if (!inv.ok()) return ReportEngineFailure(inv.status());
  if (inv->help) {
    std::fputs(EngineHelp("prepare", kUsage).c_str(), stdout);
    return engine_contract::kExitOk;
  }
  const auto& spec = static_cast<const v1::PrepareSpec&>(*inv->spec);
  Event languages = Event::array();
  for (const auto& l : spec.languages()) languages.push_back(l.code());
  Emit({{"event", std::string(engine_contract::kEventStart)},
        {"command", "prepare"},
        {"spec", inv->spec_file.empty() ? "command line" : inv->spec_file},
        {"languages", languages},
        {"out", spec.out()}});
  auto progress = [](double fraction, const std::string& message) {
    Emit({{"event", "progress"}, {"fraction", fraction}, {"message", message}});
  };
  absl::StatusOr<data::PrepareSummary> summary = data::PrepareCorpus(spec, progress);
  if (!summary.ok()) return ReportEngineFailure(summary.status());
  // A corpus's manifest is its manifest.json (not a stemma.json): the event is built here.
  Emit({{"event", std::string(engine_contract::kEventOutput)},
        {"name", "corpus"},
        {"path", summary->out},
        {"type", "corpus"},
        {"manifest_sha256", summary->manifest_sha256},
        {"bytes", summary->bytes},
        {"parents", Event::array()},
        {"operation", "prepare"}});
  Emit({{"event", std::string(engine_contract::kEventDone)},
        {"command", "prepare"},
        {"out", summary->out},
        {"content_hash", summary->content_hash},
        {"bytes", summary->bytes},
        {"seconds", summary->seconds},
        {"languages", summary->languages}});
  return engine_contract::kExitOk;
}

}  // namespace stemma::engine
