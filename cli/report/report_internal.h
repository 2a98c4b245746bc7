// Internal to the report's model (report_model.cc builds the table, report_plots.cc the
// plots): what the two share. Not a public header; pure functions.
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "cli/report/report_model.h"
#include "nlohmann/json.hpp"

namespace stemma::cli::report {

// What is known about one metric name across the study.
struct NameInfo {
  std::string metric, task, language, type;
};

// A file name made of [A-Za-z0-9._-] (others become '_').
std::string Sanitize(const std::string& name);
// The number `j` holds, if it is one.
std::optional<double> Number(const nlohmann::json& j);
std::optional<double> Mean(const std::vector<double>& v);

// The report's baseline row, or null.
const Row* BaselineRow(const Report& r);
// The row's perplexity metric on each language of `role` (held_in, held_out, general):
// language → mean over its tasks; only the languages in `only` when it is given.
std::map<std::string, double> RoleValues(const Report& r,
                                         const std::map<std::string, NameInfo>& names,
                                         const Row& row, const std::string& role,
                                         const std::set<std::string>* only = nullptr);
// The language codes a row's target names (its families' languages and the codes it
// lists); empty for a row without a target.
std::set<std::string> TargetLanguages(const Report& r, const Row& row);
// The cell of a job name or id, or null.
const Cell* FindCell(const ReportInput& in, const std::string& name_or_id);

// Adds the report's plots (acquisition/forgetting, loss, alpha sweeps, analyses) to `r`,
// whose rows, languages, columns and summary are built.
void AddPlots(const ReportInput& in, const std::map<std::string, NameInfo>& names, Report* r);

}  // namespace stemma::cli::report
