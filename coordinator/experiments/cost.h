// The size of an expanded experiment: GPUs asked for, dependency edges, a GPU-hour estimate
// of its training: 6·N·tokens over an assumed 400 TFLOP/s at 40% utilisation, for train cells
// whose model size and token budget are known (N: the parameters a token runs, so an MoE
// counts experts_per_tok of its experts), and the memory plan of every train and eval cell
// (memory.h). A model's size and shape come from an upstream cell's estimate (init from its
// sizes; merge, revert, graft keep what they read; upcycle multiplies the FFN), from the
// file's `models:`, or from the caller (the coordinator reads the model's config.json).
// Pure: no store, no clock, no files.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "common/yaml_json.h"
#include "coordinator/experiments/experiment_plan.h"
#include "stemma/v1/experiment.pb.h"

namespace stemma::experiments {

// Fills `plan`'s edges, gpus, gpu_hours_estimate and unknown_cost_cells, and each cell's
// memory plan, from its cells. `declared`: the file's `models:` (path → size).
void EstimateCost(const std::map<std::string, v1::ModelSize>& declared, const ExpansionEnv& env,
                  ExperimentPlan* plan);

// Parameters of a model from its config.json's text and its layer count: 4·d² (attention) plus
// experts·3·d·ffn (the MLP) per block, plus V·d per embedding matrix (an estimate; MoE counts
// every expert; a `text_config` is read where there is one). nullopt when it does not say.
std::optional<int64_t> ParamsFromConfig(std::string_view config_json, int64_t layers);

}  // namespace stemma::experiments
