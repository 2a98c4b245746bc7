// The report's plots (docs/report.md): built from the finished table (report_model.cc) and
// the study's metric points and analysis files. SVG drawing is svg_plot.cc's.
#include <algorithm>
#include <cmath>
#include <set>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cli/report/report_internal.h"

namespace stemma::cli::report {
namespace {

using nlohmann::json;

class PlotBuilder {
 public:
  PlotBuilder(const ReportInput& in, const std::map<std::string, NameInfo>& names, Report& r)
      : in_(in), names_(names), r_(r) {}

  void MakePlots() {
    AcquisitionPlot();
    LossPlots();
    AlphaPlots();
    AnalysisPlots();
  }

 private:
  std::string PmTitle() const {
    return r_.perplexity_metric == "bpb" ? "bits per byte" : "perplexity";
  }

  void AcquisitionPlot() {
    Plot p;
    p.file = "acquisition_forgetting.svg";
    p.caption = absl::StrCat(
        "Acquisition (mean ", r_.perplexity_metric,
        " gain over the baseline on the held-in languages of each row's target, higher is "
        "better) against forgetting (general-language ",
        r_.perplexity_metric,
        " change, lower is better), one point per row; the dashed line is the Pareto front.");
    if (BaselineRow() == nullptr) {
      p.omitted = "no baseline row";
    } else if (r_.perplexity_metric.empty()) {
      p.omitted = "no perplexity or bits-per-byte metric";
    }
    SvgSeries points, front;
    points.name = "rows";
    points.line = false;
    front.name = "Pareto front";
    front.markers = false;
    front.dashed = true;
    front.color = 2;
    std::vector<std::pair<double, double>> f;
    int non_baseline = 0;
    for (const Summary& s : r_.summary) {
      if (!s.acquisition || !s.forgetting) continue;
      non_baseline += s.baseline ? 0 : 1;
      points.x.push_back(*s.forgetting);
      points.y.push_back(*s.acquisition);
      points.labels.push_back(s.row);
      if (s.pareto) f.emplace_back(*s.forgetting, *s.acquisition);
    }
    if (p.omitted.empty() && non_baseline == 0) {
      p.omitted = "no row besides the baseline has both held-in and general-language values yet";
    }
    std::sort(f.begin(), f.end());
    front.markers = f.size() == 1;  // a front of one point has no line to draw
    for (const auto& [x, y] : f) {
      front.x.push_back(x);
      front.y.push_back(y);
    }
    p.svg.title = "Acquisition vs forgetting";
    p.svg.x_label =
        absl::StrCat("forgetting: general ", r_.perplexity_metric, " − baseline (lower is better)");
    p.svg.y_label = absl::StrCat("acquisition: target held-in ", r_.perplexity_metric, " gain");
    p.svg.series = {points, front};
    p.svg.x_reference = 0.0;
    // Room for a label per row beside its point.
    if (points.labels.size() > 6) {
      p.svg.width = 820;
      p.svg.height = 520;
    }
    p.svg.y_reference = 0.0;
    r_.plots.push_back(std::move(p));
  }

  // True when a train cell reads (transitively) the output of another train cell: continued
  // pretraining, drawn apart from the model it continues.
  bool Continues(const Cell& cell) const {
    std::set<const Cell*> seen = {&cell};
    std::vector<const Cell*> queue = {&cell};
    for (size_t i = 0; i < queue.size() && i < 10000; ++i) {
      for (const std::string& need : queue[i]->needs) {
        const Cell* up = FindCell(in_, need);
        if (up == nullptr || !seen.insert(up).second) continue;
        if (up->kind == "train") return true;
        queue.push_back(up);
      }
    }
    return false;
  }

  // A train cell's name in a legend: its report.row label, else the title of the eval row
  // that reads it (when one does), else the cell's name.
  std::string TrainName(const Cell& cell) const {
    if (auto it = cell.labels.find("report.row"); it != cell.labels.end() && !it->second.empty())
      return it->second;
    std::vector<std::string> titles;
    for (const Cell& c : in_.cells) {
      if (c.kind != "eval") continue;
      const bool reads = std::any_of(c.needs.begin(), c.needs.end(), [&](const std::string& n) {
        return n == cell.job_name || (!cell.job_id.empty() && n == cell.job_id);
      });
      if (!reads) continue;
      for (const Row& row : r_.rows) {
        if (row.job_name == c.job_name &&
            std::find(titles.begin(), titles.end(), row.title) == titles.end())
          titles.push_back(row.title);
      }
    }
    return titles.size() == 1 ? titles[0] : cell.job_name;
  }

  // Training loss by step: the models trained from scratch (or from an init) in
  // loss_curves.svg, continued pretraining in loss_cpt.svg, each on its own step axis.
  void LossPlots() {
    std::vector<const Cell*> roots, continued;
    for (const Cell& c : in_.cells) {
      if (c.kind == "train") (Continues(c) ? continued : roots).push_back(&c);
    }
    if (!roots.empty()) {
      LossPlot("loss_curves.svg", roots,
               continued.empty() ? "Training loss by step of every train cell."
                                 : "Training loss by step of the models trained before "
                                   "continued pretraining (the base).",
               "Training loss");
    }
    if (!continued.empty()) {
      LossPlot("loss_cpt.svg", continued,
               "Continued-pretraining loss by step, one line per run, named by its row.",
               "Continued pretraining loss");
    }
  }

  void LossPlot(const std::string& file, const std::vector<const Cell*>& cells,
                const std::string& caption, const std::string& title) {
    Plot p;
    p.file = file;
    p.caption = caption;
    p.svg.title = title;
    p.svg.x_label = "step";
    p.svg.y_label = "loss";
    p.svg.x_integer = true;
    for (const Cell* c : cells) {
      const std::string job = c->metrics_job.empty() ? c->job_id : c->metrics_job;
      auto it = in_.points.find(job);
      if (it == in_.points.end()) continue;
      std::vector<std::pair<int64_t, double>> pts;
      for (const Point& pt : it->second) {
        if (pt.name == "loss") pts.emplace_back(pt.step, pt.value);
      }
      if (pts.empty()) continue;
      std::stable_sort(pts.begin(), pts.end(),
                       [](const auto& a, const auto& b) { return a.first < b.first; });
      SvgSeries s;
      s.name = TrainName(*c);
      s.markers = pts.size() < 40;
      for (const auto& [step, v] : pts) {
        s.x.push_back(static_cast<double>(step));
        s.y.push_back(v);
      }
      p.svg.series.push_back(std::move(s));
    }
    if (p.svg.series.empty()) {
      p.omitted =
          absl::StrCat("none of the ", cells.size(), " train cells has reported a loss yet");
    }
    r_.plots.push_back(std::move(p));
  }

  // The mean of the row's perplexity metric over the role's languages; nullopt unless every
  // language of that role that any row reports is there (a partial mean would mislead).
  std::optional<double> RoleMean(const Row& row, const std::string& role, size_t expected) const {
    const auto v = RoleValues(row, role);
    if (v.empty() || v.size() < expected) return std::nullopt;
    std::vector<double> x;
    for (const auto& [code, value] : v) x.push_back(value);
    return Mean(x);
  }

  void AlphaPlots() {
    std::vector<std::string> ranges;
    size_t held_in = 0, general = 0;
    for (const Row& row : r_.rows) {
      if (!row.alpha) continue;
      if (std::find(ranges.begin(), ranges.end(), row.range) == ranges.end())
        ranges.push_back(row.range);
      held_in = std::max(held_in, RoleValues(row, "held_in").size());
      general = std::max(general, RoleValues(row, "general").size());
    }
    if (ranges.empty()) return;  // the study has no sweep
    for (const auto& [role, file, what] : {std::tuple<std::string, std::string, std::string>{
                                               "held_in", "alpha_held_in.svg", "held-in mean"},
                                           {"general", "alpha_general.svg", "general-language"}}) {
      Plot p;
      p.file = file;
      p.caption =
          absl::StrCat(what, " ", r_.perplexity_metric,
                       " of the interpolated model θ(α) against α, one line per layer range.");
      p.svg.title = absl::StrCat("Interpolation: ", what, " ", r_.perplexity_metric, " vs α");
      p.svg.x_label = "α";
      p.svg.y_label = absl::StrCat(what, " ", PmTitle());
      if (ranges.empty()) {
        p.omitted = "no eval cell has an α (label report.alpha or matrix axis alpha)";
      } else if (r_.perplexity_metric.empty()) {
        p.omitted = "no perplexity or bits-per-byte metric";
      }
      const size_t expected = role == "held_in" ? held_in : general;
      for (size_t i = 0; i < ranges.size() && p.omitted.empty(); ++i) {
        SvgSeries s;
        s.name = ranges[i].empty() ? "all layers" : ranges[i];
        for (const Row& row : r_.rows) {
          if (!row.alpha || row.range != ranges[i]) continue;
          std::optional<double> v = RoleMean(row, role, expected);
          if (!v) continue;
          s.x.push_back(*row.alpha);
          s.y.push_back(*v);
        }
        if (!s.x.empty()) p.svg.series.push_back(std::move(s));
      }
      if (p.omitted.empty() && p.svg.series.empty()) {
        p.omitted = absl::StrCat("no sweep point has ", what, " values yet");
      }
      r_.plots.push_back(std::move(p));
    }
  }

  // Files of one output, each with the suffix its cell needs when there are several.
  std::vector<std::pair<const AnalysisFile*, std::string>> Files(const std::string& output) const {
    std::vector<const AnalysisFile*> files;
    for (const AnalysisFile& f : in_.analyses) {
      if (f.output == output && f.content.is_object()) files.push_back(&f);
    }
    std::vector<std::pair<const AnalysisFile*, std::string>> out;
    for (const AnalysisFile* f : files)
      out.emplace_back(f, files.size() > 1 ? "-" + Sanitize(f->cell) : "");
    return out;
  }

  // A plot over decoder layers (integer x axis).
  static Plot LayerPlot(std::string file, std::string caption, std::string title,
                        std::string y_label) {
    Plot p;
    p.file = std::move(file);
    p.caption = std::move(caption);
    p.svg.title = std::move(title);
    p.svg.x_label = "layer";
    p.svg.y_label = std::move(y_label);
    p.svg.x_integer = true;
    return p;
  }
  // Plots that cannot be drawn, listed with the reason.
  void Omit(std::initializer_list<const char*> files, const std::string& caption,
            const std::string& reason) {
    for (const char* file : files) {
      Plot p;
      p.file = file;
      p.caption = caption;
      p.omitted = reason;
      r_.plots.push_back(std::move(p));
    }
  }
  // Whether an analyze cell of the study asks for `output` (mask, routing, drift,
  // alignment); a cell whose analyses are not known counts as asking for every one.
  bool StudyHas(const std::string& output) const {
    for (const Cell& c : in_.cells) {
      if (c.kind != "analyze") continue;
      if (c.analyses.empty() ||
          std::find(c.analyses.begin(), c.analyses.end(), output) != c.analyses.end())
        return true;
    }
    return false;
  }
  std::string MissingReason(const std::string& output, const std::string& file) const {
    int analyze = 0;
    for (const Cell& c : in_.cells) analyze += c.kind == "analyze" ? 1 : 0;
    if (analyze == 0) return "the experiment has no analyze cells";
    return absl::StrCat("no ", file, " was read (analyze output `", output,
                        "`: not produced yet, not asked for, or not readable here)");
  }

  void AnalysisPlots() {
    LapePlots();
    RoutingPlots();
    AlignmentPlot();
    DriftPlots();
  }

  // LAPE neurons per layer and language.
  void LapePlots() {
    auto masks = Files("mask");
    if (masks.empty() && !StudyHas("mask")) return;
    if (masks.empty()) {
      Plot p;
      p.file = "lape_neurons.svg";
      p.caption = "Language-specific (LAPE) neurons per layer and language.";
      p.omitted = MissingReason("mask", "neuron_mask.json");
      r_.plots.push_back(std::move(p));
    }
    for (const auto& [f, suffix] : masks) {
      Plot p;
      p.file = absl::StrCat("lape_neurons", suffix, ".svg");
      const json& m = f->content;
      std::string method = m.contains("params") && m["params"].is_object()
                               ? m["params"].value("method", std::string())
                               : "";
      p.caption = absl::StrCat("Language-specific neurons per layer and language (",
                               method.empty() ? "mask" : method, ", ", f->cell, ").");
      p.svg.title = absl::StrCat("Neurons per layer (", f->cell, ")");
      p.svg.x_label = "layer";
      p.svg.y_label = "neurons";
      p.svg.x_integer = true;
      if (m.contains("counts") && m["counts"].is_object()) {
        for (const auto& [lang, counts] : m["counts"].items()) {
          if (!counts.is_array()) continue;
          SvgSeries s;
          s.name = lang;
          for (size_t l = 0; l < counts.size(); ++l) {
            s.x.push_back(static_cast<double>(l));
            s.y.push_back(Number(counts[l]).value_or(NAN));
          }
          p.svg.series.push_back(std::move(s));
        }
      }
      if (p.svg.series.empty()) p.omitted = absl::StrCat(f->path, " has no `counts` per language");
      r_.plots.push_back(std::move(p));
    }
  }

  // Routing: JSD and entropy by layer.
  void RoutingPlots() {
    auto routing = Files("routing");
    if (routing.empty() && !StudyHas("routing")) return;
    if (routing.empty())
      Omit({"routing_jsd.svg", "routing_entropy.svg"}, "Routing by layer.",
           MissingReason("routing", "routing.json"));
    for (const auto& [f, suffix] : routing) {
      const json& j = f->content;
      Plot jsd = LayerPlot(
          absl::StrCat("routing_jsd", suffix, ".svg"),
          absl::StrCat(
              "Mean Jensen-Shannon divergence between the languages' expert usage, by MoE layer (",
              f->cell, ")."),
          absl::StrCat("Routing JSD by layer (", f->cell, ")"), "mean JSD (nats)");
      Plot entropy = LayerPlot(
          absl::StrCat("routing_entropy", suffix, ".svg"),
          absl::StrCat("Entropy of each language's expert usage, by MoE layer (", f->cell, ")."),
          absl::StrCat("Routing entropy by layer (", f->cell, ")"), "entropy (nats)");
      SvgSeries mean;
      mean.name = "mean JSD";
      std::map<std::string, SvgSeries> per_lang;
      std::vector<std::string> langs;
      if (j.contains("layers") && j["layers"].is_array()) {
        for (const json& layer : j["layers"]) {
          if (!layer.is_object()) continue;
          const double l = Number(layer.value("layer", json())).value_or(NAN);
          if (auto v = Number(layer.value("mean_jsd", json()))) {
            mean.x.push_back(l);
            mean.y.push_back(*v);
          }
          if (layer.contains("entropy") && layer["entropy"].is_object()) {
            for (const auto& [lang, h] : layer["entropy"].items()) {
              if (!per_lang.count(lang)) langs.push_back(lang);
              SvgSeries& s = per_lang[lang];
              s.name = lang;
              s.x.push_back(l);
              s.y.push_back(Number(h).value_or(NAN));
            }
          }
        }
      }
      if (!mean.x.empty()) jsd.svg.series.push_back(mean);
      for (const std::string& lang : langs) entropy.svg.series.push_back(per_lang[lang]);
      if (jsd.svg.series.empty()) jsd.omitted = absl::StrCat(f->path, " has no layers[].mean_jsd");
      if (entropy.svg.series.empty())
        entropy.omitted = absl::StrCat(f->path, " has no layers[].entropy");
      r_.plots.push_back(std::move(jsd));
      r_.plots.push_back(std::move(entropy));
    }
  }

  // Cross-lingual alignment by layer: one line per alignment cell (before and after
  // fine-tuning), the mean over its language pairs.
  void AlignmentPlot() {
    auto alignment = Files("alignment");
    if (alignment.empty() && !StudyHas("alignment")) return;
    if (alignment.empty()) {
      Omit({"alignment.svg"}, "Cross-lingual alignment by layer.",
           MissingReason("alignment", "alignment.json"));
    } else {
      std::set<std::string> pairs;
      for (const auto& [f, suffix] : alignment) {
        const json& j = f->content;
        if (j.contains("languages") && j["languages"].is_array()) {
          std::vector<std::string> langs;
          for (const json& l : j["languages"]) {
            if (l.is_string()) langs.push_back(l.get<std::string>());
          }
          pairs.insert(absl::StrJoin(langs, "–"));
        }
      }
      Plot p = LayerPlot(
          "alignment.svg",
          absl::StrCat(
              "Cross-lingual alignment by layer: mean cosine between the mean hidden states of "
              "parallel sentences (",
              pairs.empty() ? "pairs" : absl::StrJoin(pairs, ", "), "), one line per checkpoint."),
          "Alignment by layer", "mean cosine");
      for (const auto& [f, suffix] : alignment) {
        const json& j = f->content;
        if (!j.contains("mean_cosine") || !j["mean_cosine"].is_array()) continue;
        SvgSeries s;
        s.name = f->cell;
        for (size_t l = 0; l < j["mean_cosine"].size(); ++l) {
          s.x.push_back(static_cast<double>(l));
          s.y.push_back(Number(j["mean_cosine"][l]).value_or(NAN));
        }
        p.svg.series.push_back(std::move(s));
      }
      if (p.svg.series.empty()) p.omitted = "no alignment.json read has `mean_cosine` per layer";
      r_.plots.push_back(std::move(p));
    }
  }

  // Drift: down vs gate/up by layer, and the asymmetry.
  void DriftPlots() {
    auto drift = Files("drift");
    if (drift.empty() && !StudyHas("drift")) return;
    if (drift.empty())
      Omit({"drift.svg", "drift_asymmetry.svg"}, "Weight drift by layer.",
           MissingReason("drift", "drift.json"));
    for (const auto& [f, suffix] : drift) {
      const json& j = f->content;
      Plot rel =
          LayerPlot(absl::StrCat("drift", suffix, ".svg"),
                    absl::StrCat("Relative weight change ‖Δ‖/‖W‖ by layer of the MLP's down, gate "
                                 "and up projections (",
                                 f->cell, ")."),
                    absl::StrCat("Weight drift by layer (", f->cell, ")"), "relative change");
      Plot asym = LayerPlot(absl::StrCat("drift_asymmetry", suffix, ".svg"),
                            absl::StrCat("Drift asymmetry down / mean(gate, up) by layer; above "
                                         "the dotted line the down projection moved more (",
                                         f->cell, ")."),
                            absl::StrCat("Drift asymmetry by layer (", f->cell, ")"),
                            "down / mean(gate, up)");
      asym.svg.y_reference = 1.0;
      SvgSeries down, gate, up, a, masked;
      down.name = "down";
      gate.name = "gate";
      up.name = "up";
      a.name = "all neurons";
      masked.name = "masked neurons";
      if (j.contains("layers") && j["layers"].is_array()) {
        for (const json& layer : j["layers"]) {
          if (!layer.is_object()) continue;
          const double l = Number(layer.value("layer", json())).value_or(NAN);
          for (auto [s, key] :
               {std::pair{&down, "down"}, {&gate, "gate"}, {&up, "up"}, {&a, "asymmetry"}}) {
            if (!layer.contains(key)) continue;
            s->x.push_back(l);
            s->y.push_back(Number(layer[key]).value_or(NAN));
          }
          if (layer.contains("masked") && layer["masked"].is_object() &&
              layer["masked"].contains("asymmetry")) {
            masked.x.push_back(l);
            masked.y.push_back(Number(layer["masked"]["asymmetry"]).value_or(NAN));
          }
        }
      }
      for (SvgSeries* s : {&down, &gate, &up}) {
        if (!s->x.empty()) rel.svg.series.push_back(*s);
      }
      for (SvgSeries* s : {&a, &masked}) {
        if (!s->x.empty()) asym.svg.series.push_back(*s);
      }
      if (rel.svg.series.empty())
        rel.omitted = absl::StrCat(f->path, " has no layers[].down/gate/up");
      if (asym.svg.series.empty())
        asym.omitted = absl::StrCat(f->path, " has no layers[].asymmetry");
      r_.plots.push_back(std::move(rel));
      r_.plots.push_back(std::move(asym));
    }
  }

  const Row* BaselineRow() const { return report::BaselineRow(r_); }
  std::map<std::string, double> RoleValues(const Row& row, const std::string& role) const {
    return report::RoleValues(r_, names_, row, role);
  }

  const ReportInput& in_;
  const std::map<std::string, NameInfo>& names_;
  Report& r_;
};

}  // namespace

void AddPlots(const ReportInput& in, const std::map<std::string, NameInfo>& names, Report* r) {
  PlotBuilder(in, names, *r).MakePlots();
}

}  // namespace stemma::cli::report
