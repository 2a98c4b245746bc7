// `stemma-engine prepare` (docs/engine/prepare.md, docs/corpus.md): the spec
// stemma.v1.PrepareSpec from --spec FILE and/or flags, through the one engine command-line
// parser; the work is engine/data/prepare.h.
#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/engine_cli.h"
#include "common/engine_contract.h"
#include "common/status.h"
#include "engine/commands.h"
#include "engine/data/commands.h"
#include "engine/data/prepare.h"
#include "engine/events.h"
#include "nlohmann/json.hpp"
#include "stemma/v1/specs/data.pb.h"

namespace stemma::engine {
namespace {

constexpr char kUsage[] =
    "stemma-engine prepare --spec FILE [--out DIR] [--overwrite] [--<field> VALUE ...]";

void Emit(const v1::EngineEvent& event) { EventWriter().Emit(event); }

absl::StatusOr<int> Prepare(const SpecCall& call) {
  const auto& spec = call.Get<v1::PrepareSpec>();
  EventDetails languages = EventDetails::array();
  for (const auto& l : spec.languages()) languages.push_back(l.code());
  Emit(CommandEvent(engine_contract::kEventStart, "prepare",
                    {{"spec", call.source}, {"languages", languages}, {"out", spec.out()}}));
  auto progress = [](double fraction, const std::string& message) {
    Emit(ProgressEvent(fraction, message));
  };
  ASSIGN_OR_RETURN(data::PrepareSummary summary, data::PrepareCorpus(spec, progress));
  // A corpus's manifest is its manifest.json (not a stemma.json): the event is built here.
  v1::EngineEvent output = NewEvent(engine_contract::kEventOutput);
  output.set_name("corpus");
  output.set_path(summary.out);
  output.set_type("corpus");
  output.set_manifest_sha256(summary.manifest_sha256);
  output.set_bytes(static_cast<double>(summary.bytes));
  output.set_operation("prepare");
  Emit(output);
  v1::EngineEvent done = CommandEvent(engine_contract::kEventDone, "prepare",
                                      {{"out", summary.out},
                                       {"content_hash", summary.content_hash},
                                       {"seconds", summary.seconds},
                                       {"languages", summary.languages}});
  done.set_bytes(static_cast<double>(summary.bytes));
  Emit(done);
  return engine_contract::kExitOk;
}

}  // namespace

int RunPrepare(int argc, char** argv) { return RunSpecCommand({kUsage, {}, Prepare}, argc, argv); }

}  // namespace stemma::engine
