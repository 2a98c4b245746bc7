#include "cli/report/report_writers.h"

#include <cmath>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"

namespace stemma::cli::report {
namespace {

using nlohmann::json;

std::string Arrow(const Column& c) { return c.lower_is_better ? "↓" : "↑"; }

std::string MetricWord(const std::string& m) {
  if (m == "bpb") return "bits per byte";
  if (m == "ppl") return "perplexity";
  if (m == "acc") return "choice accuracy";
  if (m == "acc_norm") return "choice accuracy (length-normalised)";
  if (m == "acc_bytes") return "choice accuracy (byte-normalised)";
  if (m == "chrf") return "chrF";
  if (m == "chrf++") return "chrF++";
  return m;
}

std::string RoleWord(const std::string& role) {
  if (role == "held_in") return "held-in";
  if (role == "held_out") return "held-out";
  return role;
}

// Markdown text from the experiment (names, metrics, reasons): raw HTML in it would be
// rendered by a Markdown viewer, and control characters would reach a terminal, so both
// are escaped.
std::string MdText(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) {
    switch (c) {
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '&':
        out += "&amp;";
        break;
      default:
        if (c < 0x20 || c == 0x7f) {
          out += ' ';
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out;
}

// Markdown table cell text: no pipes, no newlines, no HTML.
std::string MdCell(const std::string& s) { return absl::StrReplaceAll(MdText(s), {{"|", "\\|"}}); }

std::string Shorten(const std::string& s, size_t n) {
  if (s.size() <= n) return s;
  size_t cut = n;
  while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;
  return s.substr(0, cut) + "…";
}

std::string StateText(const Row& row) {
  if (row.state == "SUCCEEDED") return "";
  if (!row.reason.empty() && (row.state == "FAILED" || row.state == "CANCELLED")) {
    return absl::StrCat(row.state, ": ", Shorten(row.reason, 60));
  }
  return row.state;
}

bool AnyUnfinished(const Report& r, bool table) {
  for (const Row& row : r.rows) {
    if (row.in_table == table && row.state != "SUCCEEDED") return true;
  }
  return false;
}

std::string Opt(const std::optional<double>& v, bool sign) {
  if (!v) return "-";
  return sign ? FormatDelta(*v, *v == 0 ? 1 : *v) : FormatNumber(*v);
}

std::string LanguagesLine(const Report& r) {
  std::vector<std::string> parts;
  for (const char* role : {"held_in", "held_out", "general", "other"}) {
    std::vector<std::string> langs;
    for (const Language& l : r.languages) {
      if (l.role != role) continue;
      langs.push_back(l.family.empty() ? l.code : absl::StrCat(l.code, " (", l.family, ")"));
    }
    if (!langs.empty())
      parts.push_back(absl::StrCat(RoleWord(role), ": ", absl::StrJoin(langs, ", ")));
  }
  return absl::StrJoin(parts, "; ");
}

std::string RolesSource(const Report& r) {
  if (!r.roles_source.empty()) return r.roles_source;
  return r.roles_from_corpus ? "from the corpus manifest" : "assumed: no corpus manifest";
}

// The summary's columns: row, target, acquisition, transfer, forgetting, Pareto front, then
// per family (when the study has several) its acquisition and, with held-out languages, its
// transfer.
struct SummaryColumn {
  std::string title;  // "acquisition ↑", "romance acq. ↑"
  std::string family;
  bool transfer = false;
};
std::vector<SummaryColumn> FamilyColumns(const Report& r) {
  std::vector<SummaryColumn> out;
  if (!r.family_groups) return out;
  for (const std::string& f : r.families) {
    bool in = false, held_out = false;
    for (const Summary& s : r.summary) {
      auto it = s.families.find(f);
      if (it == s.families.end()) continue;
      in |= it->second.acquisition.has_value();
      held_out |= it->second.transfer.has_value();
    }
    if (in) out.push_back({f + " acq. ↑", f, false});
    if (held_out) out.push_back({f + " transfer ↑", f, true});
  }
  return out;
}
std::optional<double> FamilyValue(const Summary& s, const SummaryColumn& c) {
  auto it = s.families.find(c.family);
  if (it == s.families.end()) return std::nullopt;
  return c.transfer ? it->second.transfer : it->second.acquisition;
}
std::string TargetText(const Summary& s) {
  if (s.baseline) return "-";
  return s.target.empty() ? "all" : s.target;
}

// One sentence under the summary's heading.
std::string SummaryIntro(const Report& r) {
  const std::string& m = r.perplexity_metric;
  std::string out = absl::StrCat(
      "acquisition: mean ", m,
      " gain over the baseline on the held-in languages of the row's target (its family or "
      "languages; every held-in language for a row without one; higher is better); transfer: the "
      "same on the target's held-out languages; forgetting: general-language ",
      m,
      " minus the baseline's (lower is better); the Pareto front is over acquisition and "
      "forgetting.");
  if (r.family_groups)
    out += " Per family: the same gains on each family's held-in and held-out languages.";
  return out;
}

std::string StatesLine(const Report& r) {
  std::vector<std::string> s;
  for (const auto& [state, n] : r.states) s.push_back(absl::StrCat(n, " ", state));
  return absl::StrCat(r.cells, " cells: ", absl::StrJoin(s, ", "));
}

std::string MetricsLine(const Report& r) {
  std::vector<std::string> seen, parts;
  for (const Column& c : r.columns) {
    if (std::find(seen.begin(), seen.end(), c.metric) != seen.end()) continue;
    seen.push_back(c.metric);
    parts.push_back(absl::StrCat(c.metric, " = ", MetricWord(c.metric), " (",
                                 c.lower_is_better ? "lower" : "higher", " is better)"));
  }
  return absl::StrJoin(parts, "; ");
}

// --- Markdown ------------------------------------------------------------------------------

std::string MdTable(const Report& r, bool table) {
  const bool state = AnyUnfinished(r, table);
  bool groups = false;
  for (const Row& row : r.rows) groups |= row.in_table == table && !row.group.empty();
  std::vector<std::string> header = {"row"};
  if (!table) header.insert(header.end(), {"range", "α"});
  for (const Column& c : r.columns)
    header.push_back(MdCell(absl::StrCat(c.title, " ", c.metric, " ", Arrow(c))));
  if (state) header.push_back("state");
  std::string out = absl::StrCat("| ", absl::StrJoin(header, " | "), " |\n|");
  for (size_t i = 0; i < header.size(); ++i) {
    const bool numeric = i > 0 && !(state && i + 1 == header.size()) && !(!table && i == 1);
    absl::StrAppend(&out, numeric ? " ---: |" : " --- |");
  }
  out += "\n";
  std::string group = "\x01";
  for (const Row& row : r.rows) {
    if (row.in_table != table) continue;
    if (table && groups && !row.baseline && row.group != group) {
      group = row.group;
      // A heading row, padded with empty cells so the table stays rectangular.
      absl::StrAppend(&out, "| *", MdCell(group.empty() ? "other" : group), "* |");
      for (size_t i = 1; i < header.size(); ++i) out += " |";
      out += "\n";
    }
    std::vector<std::string> cells = {MdCell(row.baseline ? row.title + " (baseline)" : row.title)};
    if (!table) {
      cells.push_back(MdCell(row.range.empty() ? "-" : row.range));
      cells.push_back(row.alpha ? absl::StrFormat("%g", *row.alpha) : "-");
    }
    for (const Column& c : r.columns) {
      const Value& v = row.values.at(c.key);
      if (!v.value) {
        cells.push_back("-");
        continue;
      }
      std::string text = FormatNumber(*v.value);
      if (v.best) text = "**" + text + "**";
      if (v.delta && !row.baseline)
        absl::StrAppend(&text, " (", FormatDelta(*v.delta, *v.value), ")");
      cells.push_back(text);
    }
    if (state) cells.push_back(MdCell(StateText(row)));
    absl::StrAppend(&out, "| ", absl::StrJoin(cells, " | "), " |\n");
  }
  return out;
}

std::string MdSummary(const Report& r) {
  const std::vector<SummaryColumn> families = FamilyColumns(r);
  std::string out = absl::StrCat("\n## Acquisition vs forgetting (", MdText(r.perplexity_metric),
                                 ")\n\n", MdText(SummaryIntro(r)), "\n\n");
  out += "| row | target | acquisition ↑ | transfer ↑ | forgetting ↓ | Pareto front |";
  for (const SummaryColumn& c : families) absl::StrAppend(&out, " ", MdCell(c.title), " |");
  out += "\n| --- | --- | ---: | ---: | ---: | --- |";
  for (size_t i = 0; i < families.size(); ++i) out += " ---: |";
  out += "\n";
  for (const Summary& s : r.summary) {
    absl::StrAppend(&out, "| ", MdCell(s.baseline ? s.row + " (baseline)" : s.row), " | ",
                    MdCell(TargetText(s)), " | ", Opt(s.acquisition, true), " | ",
                    Opt(s.transfer, true), " | ", Opt(s.forgetting, true), " | ",
                    s.pareto ? "yes" : "", " |");
    for (const SummaryColumn& c : families)
      absl::StrAppend(&out, " ", Opt(FamilyValue(s, c), true), " |");
    out += "\n";
  }
  return out;
}

// --- HTML ----------------------------------------------------------------------------------

std::string H(const std::string& s) { return XmlEscape(s); }

constexpr char kCss[] =
    R"(body{font-family:sans-serif;margin:24px;color:#222;background:#fff;max-width:1400px}
h1{font-size:22px}h2{font-size:18px;margin-top:28px}
table{border-collapse:collapse;margin:8px 0 16px 0;font-size:13px}
th,td{border:1px solid #ccc;padding:4px 8px}th{background:#f2f2f2}
td.num{text-align:right;white-space:nowrap}td.best{font-weight:bold;background:#eef6ee}
tr.baseline td{background:#f7f7fb}tr.group td{background:#fafafa;font-style:italic}
span.delta{font-size:11px;margin-left:4px}span.good{color:#1a7f37}span.bad{color:#c62828}
td.state{color:#8a5a00}figure{display:inline-block;margin:8px 16px 16px 0;vertical-align:top}
figcaption{font-size:12px;max-width:640px;color:#444}p.meta{color:#444;font-size:13px}
ul.omitted li,ul.notes li{font-size:13px;color:#444}th.family{background:#e8eef7})";

// A column's group in the results table's first header row: its family (held-in and
// held-out languages), "general", or none.
std::string ColumnGroup(const Column& c) {
  if ((c.role == "held_in" || c.role == "held_out") && !c.family.empty()) return c.family;
  if (c.role == "general") return "general";
  return "";
}

// The header row that names each family over its columns, when the columns span several
// families; "" otherwise. `lead` cells precede the columns (row, range, α).
std::string HtmlGroupRow(const Report& r, int lead) {
  std::set<std::string> families;
  for (const Column& c : r.columns) {
    if (ColumnGroup(c) != "general" && !ColumnGroup(c).empty()) families.insert(ColumnGroup(c));
  }
  if (families.size() < 2) return "";
  std::string out = absl::StrCat("<tr class=\"groups\"><th colspan=\"", lead, "\"></th>");
  for (size_t i = 0; i < r.columns.size();) {
    const Column& c = r.columns[i];
    size_t n = 1;
    while (i + n < r.columns.size() && r.columns[i + n].metric == c.metric &&
           ColumnGroup(r.columns[i + n]) == ColumnGroup(c))
      ++n;
    absl::StrAppend(&out, "<th colspan=\"", n, "\" class=\"family\">", H(ColumnGroup(c)), "</th>");
    i += n;
  }
  return out + "</tr>";
}

std::string HtmlTable(const Report& r, bool table) {
  const bool state = AnyUnfinished(r, table);
  bool groups = false;
  for (const Row& row : r.rows) groups |= row.in_table == table && !row.group.empty();
  std::string out = absl::StrCat("<table class=\"", table ? "results" : "sweep", "\">\n<thead>",
                                 HtmlGroupRow(r, table ? 1 : 3), "<tr><th>row</th>");
  if (!table) out += "<th>range</th><th>α</th>";
  for (const Column& c : r.columns) {
    absl::StrAppend(&out, "<th title=\"",
                    H(absl::StrCat(MetricWord(c.metric), ", ", RoleWord(c.role),
                                   c.family.empty() ? "" : ", " + c.family)),
                    "\">", H(c.title), "<br>", H(c.metric), " ", Arrow(c), "</th>");
  }
  if (state) out += "<th>state</th>";
  out += "</tr></thead>\n<tbody>\n";
  const size_t width = 1 + (table ? 0 : 2) + r.columns.size() + (state ? 1 : 0);
  std::string group = "\x01";
  for (const Row& row : r.rows) {
    if (row.in_table != table) continue;
    if (table && groups && !row.baseline && row.group != group) {
      group = row.group;
      absl::StrAppend(&out, "<tr class=\"group\"><td colspan=\"", width, "\">",
                      H(group.empty() ? "other" : group), "</td></tr>\n");
    }
    absl::StrAppend(&out, "<tr", row.baseline ? " class=\"baseline\"" : "", "><td title=\"",
                    H(row.job_name + " " + row.job_id), "\">", H(row.title),
                    row.baseline ? " <em>(baseline)</em>" : "", "</td>");
    if (!table) {
      absl::StrAppend(&out, "<td>", H(row.range.empty() ? "-" : row.range),
                      "</td><td class=\"num\">",
                      row.alpha ? absl::StrFormat("%g", *row.alpha) : "-", "</td>");
    }
    for (const Column& c : r.columns) {
      const Value& v = row.values.at(c.key);
      if (!v.value) {
        out += "<td class=\"num missing\">-</td>";
        continue;
      }
      absl::StrAppend(&out, "<td class=\"num", v.best ? " best" : "", "\">",
                      FormatNumber(*v.value));
      if (v.delta && !row.baseline) {
        const bool good = c.lower_is_better ? *v.delta < 0 : *v.delta > 0;
        const bool bad = c.lower_is_better ? *v.delta > 0 : *v.delta < 0;
        absl::StrAppend(&out, "<span class=\"delta",
                        good  ? " good"
                        : bad ? " bad"
                              : "",
                        "\">", FormatDelta(*v.delta, *v.value), "</span>");
      }
      out += "</td>";
    }
    if (state) absl::StrAppend(&out, "<td class=\"state\">", H(StateText(row)), "</td>");
    out += "</tr>\n";
  }
  out += "</tbody></table>\n";
  return out;
}

std::string HtmlSummary(const Report& r) {
  const std::vector<SummaryColumn> families = FamilyColumns(r);
  std::string out = absl::StrCat("<h2>Acquisition vs forgetting (", H(r.perplexity_metric),
                                 ")</h2>\n<p class=\"meta\">", H(SummaryIntro(r)),
                                 "</p>\n<table class=\"summary\">\n<thead>");
  if (!families.empty()) {
    // A header row naming each family over its column group.
    out += "<tr><th colspan=\"6\"></th>";
    for (size_t i = 0; i < families.size();) {
      size_t n = 1;
      while (i + n < families.size() && families[i + n].family == families[i].family) ++n;
      absl::StrAppend(&out, "<th colspan=\"", n, "\" class=\"family\">", H(families[i].family),
                      "</th>");
      i += n;
    }
    out += "</tr>";
  }
  out +=
      "<tr><th>row</th><th>target</th><th>acquisition ↑</th><th>transfer ↑</th><th>forgetting "
      "↓</th><th>Pareto front</th>";
  for (const SummaryColumn& c : families)
    absl::StrAppend(&out, "<th>", c.transfer ? "transfer ↑" : "acquisition ↑", "</th>");
  out += "</tr></thead>\n<tbody>\n";
  for (const Summary& s : r.summary) {
    std::string langs = absl::StrJoin(s.held_in, ", ");
    if (!s.held_out.empty())
      absl::StrAppend(&langs, "; held-out ", absl::StrJoin(s.held_out, ", "));
    absl::StrAppend(&out, "<tr", s.baseline ? " class=\"baseline\"" : "", "><td>", H(s.row),
                    "</td><td title=\"", H(langs), "\">", H(TargetText(s)),
                    "</td><td class=\"num\">", Opt(s.acquisition, true), "</td><td class=\"num\">",
                    Opt(s.transfer, true), "</td><td class=\"num\">", Opt(s.forgetting, true),
                    "</td><td>", s.pareto ? "yes" : "", "</td>");
    for (const SummaryColumn& c : families)
      absl::StrAppend(&out, "<td class=\"num\">", Opt(FamilyValue(s, c), true), "</td>");
    out += "</tr>\n";
  }
  out += "</tbody></table>\n";
  return out;
}

json Opt(const std::optional<double>& v) { return v ? json(*v) : json(nullptr); }

}  // namespace

std::string RenderMarkdown(const Report& r, bool plots_written) {
  std::string out = absl::StrCat("# ", MdText(r.experiment), ", revision ", r.revision, "\n\n");
  absl::StrAppend(&out, MdText(StatesLine(r)), ".\n\n");
  if (!r.baseline.empty())
    absl::StrAppend(
        &out, "Baseline: ", MdText(r.baseline),
        "; deltas in parentheses are against it, the best value of each column is in bold.\n");
  if (!r.columns.empty()) absl::StrAppend(&out, "Metrics: ", MdText(MetricsLine(r)), ".\n");
  if (!r.languages.empty()) {
    absl::StrAppend(&out, "Languages (", MdText(RolesSource(r)), "): ", MdText(LanguagesLine(r)),
                    ".\n");
  }
  out += "\n";
  bool table_rows = false, sweep_rows = false;
  for (const Row& row : r.rows) (row.in_table ? table_rows : sweep_rows) = true;
  if (!table_rows) {
    out += "No eval cells yet: the table has no rows.\n";
  } else if (r.columns.empty()) {
    out += "No metric has been reported yet (or none matches --metric).\n";
  }
  if (table_rows) out += MdTable(r, true);
  if (!r.summary.empty()) out += MdSummary(r);
  if (sweep_rows) {
    out += "\n## Interpolation sweep\n\n";
    out += MdTable(r, false);
  }
  out += "\n## Plots\n\n";
  for (const Plot& p : r.plots) {
    if (!p.omitted.empty()) {
      absl::StrAppend(&out, "- ", p.file, ": not drawn: ", MdText(p.omitted), "\n");
    } else if (plots_written) {
      absl::StrAppend(&out, "- [", p.file, "](", p.file, "): ", MdText(p.caption), "\n");
    } else {
      absl::StrAppend(&out, "- ", p.file, ": ", MdText(p.caption), " (written with --out DIR)\n");
    }
  }
  if (!r.notes.empty()) {
    out += "\n## Notes\n\n";
    for (const std::string& n : r.notes) absl::StrAppend(&out, "- ", MdText(n), "\n");
  }
  return out;
}

std::string RenderHtml(const Report& r) {
  std::string title = absl::StrCat(r.experiment, ", revision ", r.revision);
  std::string out = absl::StrCat(
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
      "<meta http-equiv=\"Content-Security-Policy\" content=\"",
      kHtmlCsp,
      "\">\n"
      "<meta name=\"referrer\" content=\"no-referrer\">\n<title>",
      H(title), "</title>\n<style>", kCss, "</style>\n</head>\n<body>\n");
  std::string body;
  absl::StrAppend(&body, "<h1>", H(title), "</h1>\n<p class=\"meta\">", H(StatesLine(r)), ".");
  if (!r.baseline.empty())
    absl::StrAppend(&body, "<br>Baseline: <b>", H(r.baseline),
                    "</b>; small numbers are deltas against it (green better, red worse); the best "
                    "value of each column is bold.");
  if (!r.columns.empty()) absl::StrAppend(&body, "<br>Metrics: ", H(MetricsLine(r)), ".");
  if (!r.languages.empty()) {
    absl::StrAppend(&body, "<br>Languages (", H(RolesSource(r)), "): ", H(LanguagesLine(r)), ".");
  }
  body += "</p>\n<h2>Results</h2>\n";
  bool table_rows = false, sweep_rows = false;
  for (const Row& row : r.rows) (row.in_table ? table_rows : sweep_rows) = true;
  if (!table_rows) body += "<p>No eval cells yet: the table has no rows.</p>\n";
  if (table_rows) body += HtmlTable(r, true);
  if (!r.summary.empty()) body += HtmlSummary(r);
  if (sweep_rows) {
    body += "<h2>Interpolation sweep</h2>\n";
    body += HtmlTable(r, false);
  }
  body += "<h2>Plots</h2>\n";
  std::vector<const Plot*> omitted;
  for (const Plot& p : r.plots) {
    if (!p.omitted.empty()) {
      omitted.push_back(&p);
      continue;
    }
    std::string id = p.file.substr(0, p.file.rfind('.'));
    absl::StrAppend(&body, "<figure id=\"plot-", H(id), "\">\n", RenderSvg(p.svg, false),
                    "<figcaption>", H(p.caption), "</figcaption>\n</figure>\n");
  }
  if (!omitted.empty()) {
    body += "<p>Not drawn:</p>\n<ul class=\"omitted\">\n";
    for (const Plot* p : omitted)
      absl::StrAppend(&body, "<li>", H(p->file), ": ", H(p->omitted), "</li>\n");
    body += "</ul>\n";
  }
  if (!r.notes.empty()) {
    body += "<h2>Notes</h2>\n<ul class=\"notes\">\n";
    for (const std::string& n : r.notes) absl::StrAppend(&body, "<li>", H(n), "</li>\n");
    body += "</ul>\n";
  }
  // Nothing in the page may look like a reference to elsewhere, even inside text (a path
  // with "//", a note quoting a URL): the markup written above never needs these sequences.
  body = absl::StrReplaceAll(body, {{"//", "/&#47;"},
                                    {"http:", "http&#58;"},
                                    {"https:", "https&#58;"},
                                    {"url(", "url&#40;"},
                                    {"src=", "src&#61;"},
                                    {"href=", "href&#61;"}});
  absl::StrAppend(&out, body, "</body>\n</html>\n");
  return out;
}

std::string RenderCsv(const Report& r) {
  auto field = [](const std::string& s) {
    if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
    return "\"" + absl::StrReplaceAll(s, {{"\"", "\"\""}}) + "\"";
  };
  auto number = [](const std::optional<double>& v) {
    return v ? absl::StrFormat("%.10g", *v) : std::string();
  };
  std::string out = "row,column,metric,value,delta\n";
  for (const Row& row : r.rows) {
    for (const Column& c : r.columns) {
      const Value& v = row.values.at(c.key);
      absl::StrAppend(&out, field(row.title), ",", field(c.title), ",", field(c.metric), ",",
                      number(v.value), ",", row.baseline ? std::string() : number(v.delta), "\n");
    }
  }
  return out;
}

json ReportToJson(const Report& r) {
  json j = {{"format", "stemma.report/1"},
            {"experiment", r.experiment},
            {"revision", r.revision},
            {"baseline", r.baseline.empty() ? json(nullptr) : json(r.baseline)},
            {"perplexity_metric", r.perplexity_metric},
            {"roles_from_corpus", r.roles_from_corpus},
            {"roles_source", RolesSource(r)},
            {"families", r.families},
            {"cells", r.cells},
            {"states", r.states},
            {"notes", r.notes}};
  j["languages"] = json::array();
  for (const Language& l : r.languages) {
    j["languages"].push_back(
        {{"code", l.code}, {"family", l.family}, {"role", l.role}, {"name", l.name}});
  }
  j["columns"] = json::array();
  for (const Column& c : r.columns) {
    j["columns"].push_back({{"key", c.key},
                            {"title", c.title},
                            {"metric", c.metric},
                            {"language", c.language},
                            {"family", c.family},
                            {"role", c.role},
                            {"lower_is_better", c.lower_is_better},
                            {"names", c.names}});
  }
  j["rows"] = json::array();
  j["sweep"] = json::array();
  for (const Row& row : r.rows) {
    json cells = json::object();
    for (const Column& c : r.columns) {
      const Value& v = row.values.at(c.key);
      cells[c.key] = {{"value", Opt(v.value)}, {"delta", Opt(v.delta)}, {"best", v.best}};
    }
    json x = {{"title", row.title},
              {"job_name", row.job_name},
              {"job_id", row.job_id},
              {"stage", row.stage},
              {"group", row.group},
              {"state", row.state},
              {"reason", row.reason},
              {"baseline", row.baseline},
              {"checkpoint_sha256", row.checkpoint_sha256},
              {"alpha", Opt(row.alpha)},
              {"range", row.range},
              {"cells", cells},
              {"target", row.target},
              {"target_from", row.target_from},
              {"metrics", row.metrics}};
    (row.in_table ? j["rows"] : j["sweep"]).push_back(std::move(x));
  }
  j["summary"] = json::array();
  for (const Summary& s : r.summary) {
    json families = json::object();
    for (const auto& [family, gain] : s.families)
      families[family] = {{"acquisition", Opt(gain.acquisition)}, {"transfer", Opt(gain.transfer)}};
    j["summary"].push_back({{"row", s.row},
                            {"baseline", s.baseline},
                            {"target", s.target},
                            {"held_in", s.held_in},
                            {"held_out", s.held_out},
                            {"acquisition", Opt(s.acquisition)},
                            {"transfer", Opt(s.transfer)},
                            {"forgetting", Opt(s.forgetting)},
                            {"pareto", s.pareto},
                            {"families", families}});
  }
  j["plots"] = json::array();
  for (const Plot& p : r.plots) {
    json series = json::array();
    for (const SvgSeries& s : p.svg.series) {
      json points = json::array();
      for (size_t i = 0; i < std::min(s.x.size(), s.y.size()); ++i) {
        points.push_back({std::isfinite(s.x[i]) ? json(s.x[i]) : json(nullptr),
                          std::isfinite(s.y[i]) ? json(s.y[i]) : json(nullptr)});
      }
      json e = {{"name", s.name}, {"points", points}};
      if (!s.labels.empty()) e["labels"] = s.labels;
      series.push_back(std::move(e));
    }
    json e = {{"file", p.file},
              {"caption", p.caption},
              {"title", p.svg.title},
              {"x_label", p.svg.x_label},
              {"y_label", p.svg.y_label},
              {"series", series},
              {"drawn", p.omitted.empty()}};
    if (!p.omitted.empty()) e["omitted"] = p.omitted;
    j["plots"].push_back(std::move(e));
  }
  return j;
}

}  // namespace stemma::cli::report
