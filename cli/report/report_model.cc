#include "cli/report/report_model.h"

#include <fnmatch.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "cli/report/report_internal.h"

namespace stemma::cli::report {
namespace {

using nlohmann::json;

bool Glob(const std::string& pattern, const std::string& text) {
  return ::fnmatch(pattern.c_str(), text.c_str(), 0) == 0;
}

std::string Label(const Cell& c, const std::string& key) {
  auto it = c.labels.find(key);
  return it == c.labels.end() ? "" : it->second;
}

std::string Coord(const Cell& c, const std::string& key) {
  auto it = c.coords.find(key);
  return it == c.coords.end() ? "" : it->second;
}

// bpb, ppl, acc, acc_norm, acc_bytes, chrf, chrf++, then the others by name.
int MetricRank(const std::string& m) {
  static const std::vector<std::string> order = {"bpb",       "ppl",  "acc",   "acc_norm",
                                                 "acc_bytes", "chrf", "chrf++"};
  auto it = std::find(order.begin(), order.end(), m);
  return it == order.end() ? static_cast<int>(order.size()) : static_cast<int>(it - order.begin());
}

int RoleRank(const std::string& role) {
  if (role == "held_in") return 0;
  if (role == "held_out") return 1;
  if (role == "general") return 2;
  if (role == "task") return 4;  // named tasks (instruct_en-fr) after the languages
  return 3;
}

std::string RoleTitle(const std::string& role) {
  if (role == "held_in") return "held-in";
  if (role == "held_out") return "held-out";
  return role;
}

}  // namespace

// --- Shared with the plots (report_internal.h) ------------------------------------------

std::string Sanitize(const std::string& name) {
  std::string out;
  for (char c : name) {
    out +=
        (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.') ? c : '_';
  }
  while (!out.empty() && out.back() == '_') out.pop_back();
  return out;
}

std::optional<double> Number(const json& j) {
  if (j.is_number()) return j.get<double>();
  return std::nullopt;
}

std::optional<double> Mean(const std::vector<double>& v) {
  if (v.empty()) return std::nullopt;
  double s = 0;
  for (double x : v) s += x;
  return s / static_cast<double>(v.size());
}

const Row* BaselineRow(const Report& r) {
  for (const Row& row : r.rows) {
    if (row.baseline) return &row;
  }
  return nullptr;
}

// The row's perplexity metric on each language of `role`: language → mean over its tasks.
std::map<std::string, double> RoleValues(const Report& r,
                                         const std::map<std::string, NameInfo>& names,
                                         const Row& row, const std::string& role,
                                         const std::set<std::string>* only) {
  std::map<std::string, std::vector<double>> per;
  for (const auto& [name, value] : row.metrics) {
    auto it = names.find(name);
    if (it == names.end() || it->second.metric != r.perplexity_metric || it->second.task == "all")
      continue;
    if (it->second.task != it->second.language)
      continue;  // a named task (instruct_en-fr), not the language
    auto lang = std::find_if(r.languages.begin(), r.languages.end(),
                             [&](const Language& l) { return l.code == it->second.language; });
    if (lang == r.languages.end() || lang->role != role) continue;
    if (only != nullptr && only->count(lang->code) == 0) continue;
    per[lang->code].push_back(value);
  }
  std::map<std::string, double> out;
  for (const auto& [code, v] : per) out[code] = *Mean(v);
  return out;
}

std::set<std::string> TargetLanguages(const Report& r, const Row& row) {
  std::set<std::string> out;
  for (const std::string& t : row.target) {
    for (const Language& l : r.languages) {
      if (l.family == t || l.code == t) out.insert(l.code);
    }
  }
  return out;
}

const Cell* FindCell(const ReportInput& in, const std::string& name_or_id) {
  if (name_or_id.empty()) return nullptr;
  for (const Cell& c : in.cells) {
    if (c.job_name == name_or_id || c.job_id == name_or_id) return &c;
  }
  return nullptr;
}

namespace {

class Builder {
 public:
  Builder(const ReportInput& in, const ReportOptions& opt) : in_(in), opt_(opt) {}

  Report Build() {
    r_.experiment = in_.experiment;
    r_.revision = in_.revision;
    r_.notes = in_.notes;
    r_.cells = static_cast<int>(in_.cells.size());
    for (const Cell& c : in_.cells) ++r_.states[c.state.empty() ? "UNSUBMITTED" : c.state];
    // Trials early stopping ended, with the values they were judged on (both objectives of
    // a Pareto rule): they are no rows, their evals are skipped.
    for (const Cell& c : in_.cells) {
      if (c.kind == "train" && absl::StartsWith(c.reason, "stopped early"))
        r_.notes.push_back(absl::StrCat(c.job_name, ": ", c.reason));
    }
    MakeRows();
    MakeLanguages();
    MakeTargets();
    MakeColumns();
    FillValues();
    MakeSummary();
    AddPlots(in_, names_, &r_);
    return std::move(r_);
  }

 private:
  // --- Rows ------------------------------------------------------------------------------

  void MakeRows() {
    std::vector<Row> rows;
    std::vector<int> baselines;
    for (const Cell& c : in_.cells) {
      if (c.kind != "eval") continue;
      Row row;
      row.job_name = c.job_name;
      row.job_id = c.job_id;
      row.stage = c.stage;
      row.state = c.state.empty() ? "UNSUBMITTED" : c.state;
      row.reason = c.reason;
      row.title = Label(c, "report.row");
      if (row.title.empty()) {
        row.title = absl::StartsWith(c.job_name, "eval-") ? c.job_name.substr(5) : c.job_name;
      }
      row.group = Label(c, "report.group");
      std::string alpha = Label(c, "report.alpha");
      if (alpha.empty()) alpha = Coord(c, "alpha");
      double a;
      if (!alpha.empty()) {
        if (absl::SimpleAtod(alpha, &a) && std::isfinite(a)) {
          row.alpha = a;
        } else {
          r_.notes.push_back(
              absl::StrCat(c.job_name, ": alpha '", alpha, "' is not a number; not a sweep point"));
        }
      }
      row.range = Label(c, "report.range");
      if (row.range.empty()) row.range = Coord(c, "range");
      const std::string table = Label(c, "report.table");
      row.in_table = table.empty() ? !row.alpha.has_value() : table == "true";
      const std::string base = Label(c, "report.baseline");
      if (base == "true") baselines.push_back(static_cast<int>(rows.size()));
      // The metrics: the last point of each name, then what the results file adds.
      const std::string job = c.metrics_job.empty() ? c.job_id : c.metrics_job;
      if (auto it = in_.points.find(job); it != in_.points.end()) {
        std::map<std::string, int64_t> step;
        for (const Point& p : it->second) {
          auto s = step.find(p.name);
          if (s != step.end() && s->second > p.step) continue;
          step[p.name] = p.step;
          row.metrics[p.name] = p.value;
          Note(p.name, p.language, p.type);
        }
      }
      if (auto it = in_.results.find(c.job_name); it != in_.results.end()) {
        const json& res = it->second;
        if (res.contains("checkpoint") && res["checkpoint"].is_object() &&
            res["checkpoint"].contains("sha256") && res["checkpoint"]["sha256"].is_string()) {
          row.checkpoint_sha256 = res["checkpoint"]["sha256"].get<std::string>();
        }
        if (res.contains("tasks") && res["tasks"].is_array()) {
          for (const json& t : res["tasks"]) {
            if (!t.is_object() || !t.contains("name") || !t["name"].is_string()) continue;
            const std::string task = t["name"];
            const std::string lang = t.value("language", std::string());
            const std::string type = t.value("type", std::string());
            if (!t.contains("metrics") || !t["metrics"].is_object()) continue;
            for (const auto& [m, v] : t["metrics"].items()) {
              const std::string name = absl::StrCat(m, "/", task);
              Note(name, lang, type);
              if (!row.metrics.count(name) && v.is_number()) row.metrics[name] = v.get<double>();
            }
          }
        }
      }
      if (row.state == "SUCCEEDED" && row.metrics.empty()) {
        r_.notes.push_back(absl::StrCat(
            c.job_name, " succeeded but no metric point or readable results file was found"));
      }
      rows.push_back(std::move(row));
    }
    if (baselines.empty()) {
      for (size_t i = 0; i < rows.size(); ++i) {
        if (rows[i].stage == "eval-base") baselines.push_back(static_cast<int>(i));
      }
    }
    if (baselines.size() > 1) {
      std::vector<std::string> names;
      for (int i : baselines) names.push_back(rows[i].job_name);
      r_.notes.push_back(absl::StrCat("several baseline candidates (", absl::StrJoin(names, ", "),
                                      "); using ", rows[baselines[0]].job_name));
    }
    if (!baselines.empty()) {
      rows[baselines[0]].baseline = true;
      rows[baselines[0]].in_table = true;
      baseline_title_ = rows[baselines[0]].title;
      r_.baseline = baseline_title_;
    } else if (!rows.empty()) {
      r_.notes.push_back(
          "no baseline row (label report.baseline: \"true\" or a stage named eval-base): no "
          "deltas, no acquisition or forgetting");
    }
    // Order: the baseline, then table rows by group (first appearance), then sweep points
    // by range (first appearance) and alpha.
    std::vector<std::string> groups, ranges;
    for (const Row& row : rows) {
      if (row.in_table && std::find(groups.begin(), groups.end(), row.group) == groups.end())
        groups.push_back(row.group);
      if (!row.in_table && std::find(ranges.begin(), ranges.end(), row.range) == ranges.end())
        ranges.push_back(row.range);
    }
    auto index = [](const std::vector<std::string>& v, const std::string& s) {
      return static_cast<int>(std::find(v.begin(), v.end(), s) - v.begin());
    };
    std::vector<size_t> order(rows.size());
    for (size_t i = 0; i < rows.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      const Row& x = rows[a];
      const Row& y = rows[b];
      if (x.in_table != y.in_table) return x.in_table;
      if (x.in_table) {
        if (x.baseline != y.baseline) return x.baseline;
        return index(groups, x.group) < index(groups, y.group);
      }
      if (x.range != y.range) return index(ranges, x.range) < index(ranges, y.range);
      return x.alpha.value_or(0) < y.alpha.value_or(0);
    });
    for (size_t i : order) r_.rows.push_back(std::move(rows[i]));
  }

  void Note(const std::string& name, const std::string& language, const std::string& type) {
    const size_t slash = name.find('/');
    if (slash == std::string::npos) return;
    NameInfo& info = names_[name];
    info.metric = name.substr(0, slash);
    info.task = name.substr(slash + 1);
    if (info.language.empty()) info.language = language;
    if (info.type.empty()) info.type = type;
  }

  // --- Languages -------------------------------------------------------------------------

  void MakeLanguages() {
    // A perplexity task named after its language needs no label to say so.
    for (auto& [name, info] : names_) {
      if (info.language.empty() && (info.metric == "ppl" || info.metric == "bpb") &&
          info.task != "all") {
        info.language = info.task;
      }
    }
    std::vector<std::string> seen;  // languages of the metrics, in name order
    for (const auto& [name, info] : names_) {
      if (!info.language.empty() && info.task != "all" &&
          std::find(seen.begin(), seen.end(), info.language) == seen.end()) {
        seen.push_back(info.language);
      }
    }
    if (!in_.corpus_languages.empty()) {
      r_.roles_from_corpus = true;
      r_.languages = in_.corpus_languages;
      for (const std::string& code : seen) {
        if (!Find(code)) r_.languages.push_back({code, "", "other", ""});
      }
    } else {
      // Families from cells whose matrix has both axes, in cell order.
      for (const Cell& c : in_.cells) {
        const std::string lang = Coord(c, "language"), family = Coord(c, "family");
        if (lang.empty() || Find(lang)) continue;
        if (family.empty()) continue;
        r_.languages.push_back({lang, family, lang == "en" ? "general" : "held_in", ""});
      }
      for (const std::string& code : seen) {
        if (!Find(code))
          r_.languages.push_back({code, "", code == "en" ? "general" : "held_in", ""});
      }
    }
    const std::vector<std::string> labelled = OverrideRoles();
    RolesSource(labelled, !r_.languages.empty());
    for (const Language& l : r_.languages) {
      if (!l.family.empty() &&
          std::find(families_.begin(), families_.end(), l.family) == families_.end()) {
        families_.push_back(l.family);
      }
    }
    r_.families = families_;
  }

  // The header's "Languages (...)" and, without a corpus manifest, a note saying what was
  // assumed (only what no label set).
  void RolesSource(const std::vector<std::string>& labelled, bool any_language) {
    std::vector<std::string> keys;
    for (const std::string& role : labelled) keys.push_back("report." + role);
    std::string list = keys.empty() ? "" : keys.back();
    if (keys.size() > 1) {
      list = absl::StrCat(absl::StrJoin(keys.begin(), keys.end() - 1, ", "), " and ", keys.back());
    }
    const std::string labels =
        keys.empty() ? "" : absl::StrCat("the ", list, " label", keys.size() > 1 ? "s" : "");
    if (r_.roles_from_corpus) {
      r_.roles_source = labels.empty() ? "from the corpus manifest"
                                       : absl::StrCat("from the corpus manifest and ", labels);
      return;
    }
    auto has = [&](const char* role) {
      return std::find(labelled.begin(), labelled.end(), role) != labelled.end();
    };
    std::vector<std::string> assumed;
    if (!has("held_in")) assumed.push_back("every language but en held-in");
    if (!has("general")) assumed.push_back("en general");
    if (labels.empty()) {
      r_.roles_source = "assumed: no corpus manifest";
    } else {
      r_.roles_source = absl::StrCat("from ", labels);
      if (!assumed.empty())
        absl::StrAppend(&r_.roles_source, "; assumed: ", absl::StrJoin(assumed, ", "));
    }
    if (any_language && !assumed.empty()) {
      r_.notes.push_back(
          absl::StrCat("no corpus manifest: ", absl::StrJoin(assumed, ", "),
                       labels.empty() ? "" : absl::StrCat(" (", labels, " set the rest)"),
                       "; labels report.held_in, report.held_out and report.general "
                       "set roles"));
    }
  }

  // `report.held_in` / `report.held_out` / `report.general` labels (comma-separated codes, on
  // any cell, e.g. the corpus stage): the languages a study teaches may be fewer than its
  // corpus marks held-in (DeltaMoE trains on ru and uk of a shared corpus), and a study without
  // a corpus manifest names its roles this way. A label names that role's languages exactly:
  // the others that had the role become "other". Returns the roles a label set.
  std::vector<std::string> OverrideRoles() {
    std::vector<std::string> labelled;
    for (const char* role : {"held_in", "held_out", "general"}) {
      const std::string key = absl::StrCat("report.", role);
      for (const Cell& c : in_.cells) {
        auto it = c.labels.find(key);
        if (it == c.labels.end()) continue;
        std::vector<std::string> codes;
        for (absl::string_view code : absl::StrSplit(it->second, ',', absl::SkipWhitespace())) {
          codes.emplace_back(absl::StripAsciiWhitespace(code));
        }
        for (Language& l : r_.languages) {
          const bool listed = std::find(codes.begin(), codes.end(), l.code) != codes.end();
          if (listed)
            l.role = role;
          else if (l.role == role)
            l.role = "other";
        }
        for (const std::string& code : codes) {
          if (!Find(code)) r_.languages.push_back({code, "", role, ""});
        }
        r_.notes.push_back(absl::StrCat(RoleTitle(role), " languages from the ", key, " label of ",
                                        c.job_name, ": ", absl::StrJoin(codes, ", ")));
        labelled.push_back(role);
        break;
      }
    }
    return labelled;
  }

  // --- Targets ---------------------------------------------------------------------------

  bool IsFamily(const std::string& s) const {
    return std::find(families_.begin(), families_.end(), s) != families_.end();
  }

  // A row's target (docs/report.md "Targets"): the cell's report.target label, else a matrix
  // coordinate that names a family of the study, else the report.target labels of the cells
  // it reads from (transitively, stopping at a cell with the label: a soup of two labelled
  // experts has both targets).
  std::vector<std::string> TargetOf(const Cell& cell, std::string* from) const {
    auto split = [](const std::string& text) {
      std::vector<std::string> out;
      for (absl::string_view t : absl::StrSplit(text, absl::ByAnyChar(",+ "), absl::SkipEmpty()))
        out.emplace_back(t);
      return out;
    };
    if (const std::string label = Label(cell, "report.target"); !label.empty()) {
      *from = "label report.target";
      return split(label);
    }
    std::vector<std::pair<std::string, std::string>> coords(cell.coords.begin(), cell.coords.end());
    std::stable_partition(coords.begin(), coords.end(),
                          [](const auto& kv) { return kv.first == "family"; });
    for (const auto& [axis, value] : coords) {
      if (IsFamily(value)) {
        *from = absl::StrCat("matrix ", axis, "=", value);
        return {value};
      }
    }
    std::vector<std::string> out, sources;
    std::set<const Cell*> seen = {&cell};
    std::vector<const Cell*> queue = {&cell};
    for (size_t i = 0; i < queue.size() && i < 10000; ++i) {
      for (const std::string& need : queue[i]->needs) {
        const Cell* up = FindCell(in_, need);
        if (up == nullptr || !seen.insert(up).second) continue;
        const std::string label = Label(*up, "report.target");
        if (label.empty()) {
          queue.push_back(up);
          continue;
        }
        sources.push_back(up->job_name);
        for (const std::string& t : split(label)) {
          if (std::find(out.begin(), out.end(), t) == out.end()) out.push_back(t);
        }
      }
    }
    if (!out.empty()) *from = absl::StrCat("report.target of ", absl::StrJoin(sources, ", "));
    return out;
  }

  void MakeTargets() {
    std::vector<std::string> untargeted;
    bool any = false;
    for (Row& row : r_.rows) {
      const Cell* cell = FindCell(in_, row.job_name);
      if (cell == nullptr || row.baseline) continue;
      std::string from;
      for (const std::string& t : TargetOf(*cell, &from)) {
        if (IsFamily(t) || Find(t) != nullptr) {
          row.target.push_back(t);
        } else {
          r_.notes.push_back(absl::StrCat(row.title, ": target '", t, "' (", from,
                                          ") names no family or language of the study"));
        }
      }
      if (!row.target.empty()) row.target_from = from;
      any |= !row.target.empty();
      if (row.target.empty() && row.in_table) untargeted.push_back(row.title);
    }
    if (!untargeted.empty() && (any || families_.size() > 1)) {
      r_.notes.push_back(absl::StrCat(
          "no target (label report.target, or a matrix coordinate naming a family): ",
          absl::StrJoin(untargeted, ", "),
          "; acquisition and transfer of these rows are over every held-in and held-out language"));
    }
  }

  const Language* Find(const std::string& code) const {
    for (const Language& l : r_.languages) {
      if (l.code == code) return &l;
    }
    return nullptr;
  }

  int LanguageRank(const std::string& code) const {
    for (size_t i = 0; i < r_.languages.size(); ++i) {
      if (r_.languages[i].code == code) return static_cast<int>(i);
    }
    return static_cast<int>(r_.languages.size());
  }

  int FamilyRank(const std::string& family) const {
    auto it = std::find(families_.begin(), families_.end(), family);
    return static_cast<int>(it - families_.begin());
  }

  // --- Columns ---------------------------------------------------------------------------

  bool Selected(const std::string& name, const NameInfo& info) const {
    if (opt_.metrics.empty())
      return info.metric == r_.perplexity_metric || info.metric == "acc" || info.metric == "chrf";
    for (const std::string& sel : opt_.metrics) {
      if (sel == "all") return true;
      if (sel.find('/') != std::string::npos ? Glob(sel, name) : Glob(sel, info.metric))
        return true;
    }
    return false;
  }

  void MakeColumns() {
    bool bpb = false, ppl = false;
    for (const auto& [name, info] : names_) {
      bpb |= info.metric == "bpb" && info.task != "all";
      ppl |= info.metric == "ppl" && info.task != "all";
    }
    r_.perplexity_metric = bpb ? "bpb" : ppl ? "ppl" : "";
    std::vector<Column> columns;
    std::map<std::string, size_t> by_key;
    for (const auto& [name, info] : names_) {
      if (info.task == "all" || !Selected(name, info)) continue;
      const Language* lang = Find(info.language);
      Column col;
      col.metric = info.metric;
      col.language = info.language;
      col.family = lang != nullptr ? lang->family : "";
      col.role = lang != nullptr ? lang->role : "other";
      // A perplexity task named other than its language (instruct_en-fr on en) measures a
      // skill, not the language: a column group of its own, out of acquisition and forgetting.
      if ((info.metric == "bpb" || info.metric == "ppl") && !info.language.empty() &&
          info.task != info.language) {
        col.role = "task";
      }
      col.lower_is_better = LowerIsBetter(info.metric);
      const bool family_column = opt_.by_family && !col.family.empty() &&
                                 (col.role == "held_in" || col.role == "held_out");
      if (family_column) {
        col.key = absl::StrCat(info.metric, "/", col.family, "/", col.role);
        col.title = absl::StrCat(col.family, " ", RoleTitle(col.role));
        col.language.clear();
      } else {
        col.key = name;
        col.title = info.task;
      }
      auto it = by_key.find(col.key);
      if (it != by_key.end()) {
        columns[it->second].names.push_back(name);
        continue;
      }
      col.names.push_back(name);
      by_key[col.key] = columns.size();
      columns.push_back(std::move(col));
    }
    // Per metric: a group per family (its held-in, then its held-out languages), then the
    // held-in and held-out languages of no family, the general language, others, tasks.
    const int nf = static_cast<int>(families_.size());
    std::stable_sort(columns.begin(), columns.end(), [&](const Column& a, const Column& b) {
      auto key = [&](const Column& c) {
        const bool family_role = c.role == "held_in" || c.role == "held_out";
        const int group = family_role ? (c.family.empty() ? nf : FamilyRank(c.family))
                                      : nf + 1 + RoleRank(c.role);
        return std::make_tuple(MetricOrder(c), c.metric, group, RoleRank(c.role),
                               c.language.empty() ? -1 : LanguageRank(c.language), c.title);
      };
      return key(a) < key(b);
    });
    r_.columns = SelectColumns(std::move(columns));
  }

  // The metric's place: the first --metric selector that picks it, else the default order.
  int MetricOrder(const Column& c) const {
    for (size_t i = 0; i < opt_.metrics.size(); ++i) {
      const std::string& sel = opt_.metrics[i];
      if (sel == "all") break;
      bool match = false;
      for (const std::string& name : c.names)
        match |= sel.find('/') != std::string::npos ? Glob(sel, name) : Glob(sel, c.metric);
      if (match) return static_cast<int>(i);
    }
    return static_cast<int>(opt_.metrics.size()) + MetricRank(c.metric);
  }

  // --columns: the columns each selector picks, in the selectors' order.
  std::vector<Column> SelectColumns(std::vector<Column> columns) {
    if (opt_.columns.empty()) return columns;
    std::vector<Column> out;
    std::vector<bool> taken(columns.size(), false);
    for (const std::string& sel : opt_.columns) {
      bool any = false;
      for (size_t i = 0; i < columns.size(); ++i) {
        const Column& c = columns[i];
        const bool match = sel == c.key || sel == c.title || sel == c.language || sel == c.family ||
                           sel == RoleTitle(c.role) || sel == c.role || Glob(sel, c.key);
        if (!match) continue;
        any = true;
        if (!taken[i]) out.push_back(c);
        taken[i] = true;
      }
      if (!any) r_.notes.push_back(absl::StrCat("--columns: '", sel, "' selects no column"));
    }
    return out;
  }

  // --- Values ----------------------------------------------------------------------------

  static std::optional<double> ColumnValue(const Row& row, const Column& col) {
    std::vector<double> v;
    for (const std::string& n : col.names) {
      auto it = row.metrics.find(n);
      if (it == row.metrics.end()) return std::nullopt;  // a family mean needs all its languages
      v.push_back(it->second);
    }
    return Mean(v);
  }

  const Row* BaselineRow() const { return report::BaselineRow(r_); }

  void FillValues() {
    for (Row& row : r_.rows) {
      for (const Column& col : r_.columns) {
        Value v;
        v.value = ColumnValue(row, col);
        row.values[col.key] = v;
      }
    }
    const Row* base = BaselineRow();
    for (const Column& col : r_.columns) {
      std::optional<double> b = base != nullptr ? base->values.at(col.key).value : std::nullopt;
      std::optional<double> best;
      for (Row& row : r_.rows) {
        Value& v = row.values[col.key];
        if (v.value && b) v.delta = *v.value - *b;
        if (!row.in_table || !v.value) continue;
        if (!best || (col.lower_is_better ? *v.value < *best : *v.value > *best)) best = *v.value;
      }
      if (!best) continue;
      for (Row& row : r_.rows) {
        Value& v = row.values[col.key];
        if (row.in_table && v.value &&
            std::fabs(*v.value - *best) <= 1e-12 * std::max(1.0, std::fabs(*best)))
          v.best = true;
      }
    }
  }

  // --- Acquisition and forgetting --------------------------------------------------------

  std::map<std::string, double> RoleValues(const Row& row, const std::string& role,
                                           const std::set<std::string>* only = nullptr) const {
    return report::RoleValues(r_, names_, row, role, only);
  }

  // Mean over the role's languages (those in `only` when given) of sign·(row − base), over
  // languages both have.
  std::optional<double> MeanDelta(const Row& row, const Row& base, const std::string& role,
                                  double sign, const std::set<std::string>* only = nullptr) const {
    const auto r = RoleValues(row, role, only), b = RoleValues(base, role, only);
    std::vector<double> d;
    for (const auto& [code, v] : r) {
      auto it = b.find(code);
      if (it != b.end()) d.push_back(sign * (v - it->second));
    }
    return Mean(d);
  }

  // The codes of the role's languages (in `only` when given), in language order.
  std::vector<std::string> Codes(const std::string& role, const std::set<std::string>* only) const {
    std::vector<std::string> out;
    for (const Language& l : r_.languages) {
      if (l.role == role && (only == nullptr || only->count(l.code))) out.push_back(l.code);
    }
    return out;
  }

  void MakeSummary() {
    const Row* base = BaselineRow();
    if (base == nullptr || r_.perplexity_metric.empty()) return;
    // Families with held-in languages: a column group each when there are several.
    std::map<std::string, std::set<std::string>> family_langs;
    for (const Language& l : r_.languages) {
      if (!l.family.empty() && (l.role == "held_in" || l.role == "held_out"))
        family_langs[l.family].insert(l.code);
    }
    int taught = 0;
    for (const auto& [family, langs] : family_langs)
      taught += Codes("held_in", &langs).empty() ? 0 : 1;
    r_.family_groups = taught > 1;
    for (const Row& row : r_.rows) {
      if (!row.in_table) continue;
      Summary s;
      s.row = row.title;
      s.baseline = row.baseline;
      s.target = absl::StrJoin(row.target, "+");
      const std::set<std::string> target = TargetLanguages(r_, row);
      const std::set<std::string>* only = target.empty() ? nullptr : &target;
      s.acquisition = MeanDelta(row, *base, "held_in", -1, only);
      s.transfer = MeanDelta(row, *base, "held_out", -1, only);
      s.forgetting = MeanDelta(row, *base, "general", +1);
      s.held_in = Codes("held_in", only);
      s.held_out = Codes("held_out", only);
      if (r_.family_groups) {
        for (const auto& [family, langs] : family_langs) {
          s.families[family] = {MeanDelta(row, *base, "held_in", -1, &langs),
                                MeanDelta(row, *base, "held_out", -1, &langs)};
        }
      }
      r_.summary.push_back(s);
    }
    for (Summary& s : r_.summary) {
      if (!s.acquisition || !s.forgetting) continue;
      bool dominated = false;
      for (const Summary& o : r_.summary) {
        if (&o == &s || !o.acquisition || !o.forgetting) continue;
        if (*o.acquisition >= *s.acquisition && *o.forgetting <= *s.forgetting &&
            (*o.acquisition > *s.acquisition || *o.forgetting < *s.forgetting)) {
          dominated = true;
          break;
        }
      }
      s.pareto = !dominated;
    }
  }

  const ReportInput& in_;
  const ReportOptions& opt_;
  Report r_;
  std::map<std::string, NameInfo> names_;
  std::vector<std::string> families_;
  std::string baseline_title_;
};

}  // namespace

bool LowerIsBetter(const std::string& metric) {
  return metric == "ppl" || metric == "bpb" || absl::EndsWith(metric, "loss");
}

std::map<std::string, std::string> CoordsFromName(const std::string& job_name) {
  std::map<std::string, std::string> out;
  const size_t open = job_name.find('[');
  if (open == std::string::npos || job_name.back() != ']') return out;
  const std::string inner = job_name.substr(open + 1, job_name.size() - open - 2);
  size_t at = 0;
  while (at <= inner.size()) {
    size_t comma = inner.find(',', at);
    if (comma == std::string::npos) comma = inner.size();
    const std::string part = inner.substr(at, comma - at);
    const size_t eq = part.find('=');
    if (eq != std::string::npos && eq > 0) {
      out[part.substr(0, eq)] = part.substr(eq + 1);
    } else if (!out.empty()) {
      out.rbegin()->second += "," + part;  // a value that held a comma
    }
    at = comma + 1;
  }
  return out;
}

std::string MemoizedFrom(const std::string& reason) {
  const std::string kPrefix = "memoized from ";
  if (!absl::StartsWith(reason, kPrefix)) return "";
  std::string id = reason.substr(kPrefix.size());
  const size_t end = id.find_first_of(" ,;");
  if (end != std::string::npos) id.resize(end);
  return id;
}

std::vector<Language> CorpusLanguages(const json& manifest, std::string* error) {
  auto fail = [&](const std::string& what) {
    *error = what;
    return std::vector<Language>{};
  };
  if (!manifest.is_object()) return fail("not a JSON object");
  if (manifest.value("format", std::string()) != "stemma.corpus/1") {
    return fail(absl::StrCat("format: expected \"stemma.corpus/1\", got ",
                             manifest.contains("format") ? manifest["format"].dump() : "none"));
  }
  if (!manifest.contains("languages") || !manifest["languages"].is_array())
    return fail("languages: missing or not a list");
  std::vector<Language> out;
  for (size_t i = 0; i < manifest["languages"].size(); ++i) {
    const json& l = manifest["languages"][i];
    const std::string at = absl::StrCat("languages[", i, "]");
    if (!l.is_object() || !l.contains("code") || !l["code"].is_string() ||
        l["code"].get<std::string>().empty()) {
      return fail(absl::StrCat(at, ".code: missing"));
    }
    Language lang;
    lang.code = l["code"];
    lang.family =
        l.contains("family") && l["family"].is_string() ? l["family"].get<std::string>() : "";
    lang.name = l.contains("name") && l["name"].is_string() ? l["name"].get<std::string>() : "";
    const std::string role =
        l.contains("role") && l["role"].is_string() ? l["role"].get<std::string>() : "";
    if (role == "held_in" || role == "held_out") {
      lang.role = role;
    } else if (role == "base") {
      lang.role = "general";
    } else {
      return fail(absl::StrCat(at, ".role: '", role, "' is not held_in, held_out or base"));
    }
    out.push_back(std::move(lang));
  }
  error->clear();
  return out;
}

namespace {
int Decimals(double scale) {
  const double a = std::fabs(scale);
  if (a >= 1000) return 0;
  if (a >= 100) return 1;
  if (a >= 10) return 2;
  return 3;
}
}  // namespace

std::string FormatNumber(double v) {
  if (!std::isfinite(v)) return std::isnan(v) ? "nan" : (v > 0 ? "inf" : "-inf");
  if (std::fabs(v) >= 1e6) return absl::StrFormat("%.4g", v);
  return absl::StrFormat("%.*f", Decimals(v), v);
}

std::string FormatDelta(double delta, double scale) {
  if (!std::isfinite(delta)) return FormatNumber(delta);
  std::string s = absl::StrFormat("%+.*f", Decimals(scale), delta);
  if (s == "-0" || s.find_first_not_of("-0.") == std::string::npos) s[0] = '+';  // no "-0.000"
  return s;
}

Report BuildReport(const ReportInput& input, const ReportOptions& options) {
  return Builder(input, options).Build();
}

}  // namespace stemma::cli::report
