// The report's four forms (docs/report.md): Markdown for the terminal, one self-contained
// HTML page (inline CSS and SVG, a Content-Security-Policy that forbids every fetch), CSV
// (row, column, metric, value, delta) and JSON (everything, plot series included). Pure
// functions of the Report; thread-compatible.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/report/report_model.h"

namespace stemma::cli::report {

// The table, the acquisition/forgetting summary, the sweep, the plots (as links to
// `<file>` when `plots_written`, else the list of plots that would be drawn) and the notes.
std::string RenderMarkdown(const Report& report, bool plots_written);

// One page; names no URL, loads nothing, runs nothing.
std::string RenderHtml(const Report& report);

// row,column,metric,value,delta: one line per row (table rows and sweep points) × column.
std::string RenderCsv(const Report& report);

nlohmann::json ReportToJson(const Report& report);

// The HTML page's Content-Security-Policy.
inline constexpr char kHtmlCsp[] =
    "default-src 'none'; style-src 'unsafe-inline'; img-src 'none'; form-action 'none'; base-uri "
    "'none'";

}  // namespace stemma::cli::report
