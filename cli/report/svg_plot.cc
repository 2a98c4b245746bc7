#include "cli/report/svg_plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace stemma::cli::report {
namespace {

// Colour-blind-safe enough to tell ten lines apart (Tableau 10).
constexpr const char* kPalette[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
                                    "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"};

std::string Num(double v) { return absl::StrFormat("%.2f", v); }

struct Range {
  double lo = 0, hi = 1;
  bool any = false;
  void Add(double v) {
    if (!std::isfinite(v)) return;
    if (!any) {
      lo = hi = v;
      any = true;
    } else {
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
  }
};

}  // namespace

const char* PaletteColor(int i) {
  constexpr int n = sizeof(kPalette) / sizeof(kPalette[0]);
  return kPalette[((i % n) + n) % n];
}

std::string XmlEscape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        // Control characters are not allowed in XML 1.0 text.
        if (static_cast<unsigned char>(c) < 0x20 && c != '\n' && c != '\t') {
          out += ' ';
        } else {
          out += c;
        }
    }
  }
  return out;
}

std::vector<double> NiceTicks(double lo, double hi, int count) {
  if (!std::isfinite(lo) || !std::isfinite(hi)) return {0, 1};
  if (hi < lo) std::swap(lo, hi);
  if (hi == lo) {
    const double d = lo != 0 ? std::fabs(lo) * 0.1 : 1.0;
    lo -= d;
    hi += d;
  }
  count = std::max(count, 1);
  const double raw = (hi - lo) / count;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double norm = raw / mag;
  const double nice = norm < 1.5 ? 1 : norm < 3 ? 2 : norm < 7 ? 5 : 10;
  const double step = nice * mag;
  const double start = std::floor(lo / step + 1e-9) * step;
  const double end = std::ceil(hi / step - 1e-9) * step;
  std::vector<double> ticks;
  for (int i = 0; i <= 100; ++i) {
    double t = start + i * step;
    if (t > end + step * 1e-6) break;
    if (std::fabs(t) < step * 1e-9) t = 0;  // no "-0"
    ticks.push_back(t);
  }
  if (ticks.size() < 2) ticks.push_back(ticks.empty() ? lo : ticks.back() + step);
  return ticks;
}

std::string TickText(double value, double step) {
  if (std::fabs(value) >= 1e6 || (value != 0 && std::fabs(value) < 1e-4)) {
    return absl::StrFormat("%.3g", value);
  }
  int decimals = 0;
  if (step > 0 && step < 1) {
    decimals = std::min(8, static_cast<int>(std::ceil(-std::log10(step) - 1e-9)));
    // A step of 0.25 needs two decimals, not one.
    const double scaled = step * std::pow(10.0, decimals);
    if (std::fabs(scaled - std::round(scaled)) > 1e-6) ++decimals;
  }
  return absl::StrFormat("%.*f", decimals, value);
}

namespace {

// About how wide `text` is in a sans-serif font of `size` px (a generous mean advance, so
// that a label's box holds it in the fonts browsers pick).
double TextWidth(const std::string& text, double size) {
  int glyphs = 0;
  for (unsigned char c : text) glyphs += (c & 0xC0) != 0x80 ? 1 : 0;
  return glyphs * size * 0.62;
}

// A legend entry's text: cut at 40 characters (not inside a UTF-8 sequence).
std::string LegendName(const std::string& name) {
  if (name.size() <= 40) return name;
  size_t cut = 39;
  while (cut > 0 && (static_cast<unsigned char>(name[cut]) & 0xC0) == 0x80) --cut;
  return name.substr(0, cut) + "…";
}

struct Box {
  double x0 = 0, y0 = 0, x1 = 0, y1 = 0;
  bool Overlaps(const Box& o) const { return x0 < o.x1 && o.x0 < x1 && y0 < o.y1 && o.y0 < y1; }
};

// Where a plot's panel lies in the picture and how data maps onto it.
struct Frame {
  double W = 0, H = 0;          // the picture
  double left = 0, top = 0;     // the panel's corner
  double pw = 0, ph = 0;        // the panel's size
  std::vector<double> xt, yt;   // tick values, the first and last bound the axes
  double xstep = 1, ystep = 1;  // between ticks
  bool has_data = false;        // any finite point
  bool legend = false;          // a named series: the legend right of the panel
  double legend_w = 0;          // its width (the longest name's)
  double px(double x) const {
    const double x0 = xt.front(), x1 = xt.back();
    return left + (x1 > x0 ? (x - x0) / (x1 - x0) : 0.5) * pw;
  }
  double py(double y) const {
    const double y0 = yt.front(), y1 = yt.back();
    return top + ph - (y1 > y0 ? (y - y0) / (y1 - y0) : 0.5) * ph;
  }
};

// The panel and the axes' ranges and ticks: the data's range (finite points and the
// reference lines) with a margin so that points do not sit on the frame.
Frame Layout(const SvgPlot& plot) {
  Frame f;
  f.W = std::max(plot.width, 200);
  f.H = std::max(plot.height, 150);
  int entries = 0;
  for (const auto& s : plot.series) {
    if (s.name.empty()) continue;
    f.legend = true;
    ++entries;
    f.legend_w = std::max(f.legend_w, TextWidth(LegendName(s.name), 12) + 24 + 16);
  }
  f.left = 72;
  f.top = plot.title.empty() ? 16 : 40;
  // The legend lies right of the panel, inside the picture: the picture grows to hold its
  // widest name and every entry.
  const double right = f.legend ? std::max(170.0, f.legend_w) : 24, bottom = 52;
  f.W = std::ceil(std::max(f.W, f.left + 390 + right));
  if (f.legend) f.H = std::ceil(std::max(f.H, f.top + 8 + 18.0 * entries + 10));
  f.pw = f.W - f.left - right;
  f.ph = f.H - f.top - bottom;
  Range xr, yr;
  for (const auto& s : plot.series) {
    const size_t n = std::min(s.x.size(), s.y.size());
    for (size_t i = 0; i < n; ++i) {
      if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i])) continue;
      xr.Add(s.x[i]);
      yr.Add(s.y[i]);
    }
  }
  f.has_data = xr.any;
  if (plot.y_reference) yr.Add(*plot.y_reference);
  if (plot.x_reference) xr.Add(*plot.x_reference);
  if (!plot.x_integer && xr.hi > xr.lo) {
    const double pad = (xr.hi - xr.lo) * 0.04;
    xr.lo -= pad;
    xr.hi += pad;
  }
  if (yr.hi > yr.lo) {
    const double pad = (yr.hi - yr.lo) * 0.04;
    yr.lo -= pad;
    yr.hi += pad;
  }
  f.xt = NiceTicks(xr.lo, xr.hi, plot.x_integer ? 8 : 6);
  if (plot.x_integer) {
    // Whole numbers only: a step of at least one.
    const double step = std::max(1.0, std::round(f.xt.size() > 1 ? f.xt[1] - f.xt[0] : 1));
    const double lo = std::floor(xr.lo), hi = std::ceil(xr.hi);
    f.xt.clear();
    for (double t = std::floor(lo / step) * step; t <= hi + 1e-9 && f.xt.size() < 200; t += step)
      f.xt.push_back(t);
    if (f.xt.size() < 2) f.xt.push_back(f.xt.back() + step);
  }
  f.yt = NiceTicks(yr.lo, yr.hi, 5);
  f.xstep = f.xt.size() > 1 ? f.xt[1] - f.xt[0] : 1;
  f.ystep = f.yt.size() > 1 ? f.yt[1] - f.yt[0] : 1;
  return f;
}

// Title, grid, frame, tick labels, axis labels, reference lines and the "no data" note.
void AppendAxes(const SvgPlot& plot, const Frame& f, std::string* out) {
  const double left = f.left, top = f.top, pw = f.pw, ph = f.ph;
  if (!plot.title.empty()) {
    absl::StrAppend(out, "<text x=\"", Num(left + pw / 2),
                    "\" y=\"22\" text-anchor=\"middle\" font-size=\"14\" "
                    "font-weight=\"bold\">",
                    XmlEscape(plot.title), "</text>\n");
  }
  absl::StrAppend(out, "<g class=\"axes\" stroke=\"#dddddd\" stroke-width=\"1\">\n");
  for (double t : f.xt)
    absl::StrAppend(out, "<line x1=\"", Num(f.px(t)), "\" y1=\"", Num(top), "\" x2=\"",
                    Num(f.px(t)), "\" y2=\"", Num(top + ph), "\"/>\n");
  for (double t : f.yt)
    absl::StrAppend(out, "<line x1=\"", Num(left), "\" y1=\"", Num(f.py(t)), "\" x2=\"",
                    Num(left + pw), "\" y2=\"", Num(f.py(t)), "\"/>\n");
  absl::StrAppend(out, "</g>\n");
  absl::StrAppend(out, "<rect x=\"", Num(left), "\" y=\"", Num(top), "\" width=\"", Num(pw),
                  "\" height=\"", Num(ph),
                  "\" fill=\"none\" stroke=\"#333333\" stroke-width=\"1\"/>\n");
  absl::StrAppend(out, "<g class=\"ticks\" fill=\"#333333\">\n");
  for (double t : f.xt) {
    absl::StrAppend(out, "<text x=\"", Num(f.px(t)), "\" y=\"", Num(top + ph + 16),
                    "\" text-anchor=\"middle\">", XmlEscape(TickText(t, f.xstep)), "</text>\n");
  }
  for (double t : f.yt) {
    absl::StrAppend(out, "<text x=\"", Num(left - 6), "\" y=\"", Num(f.py(t) + 4),
                    "\" text-anchor=\"end\">", XmlEscape(TickText(t, f.ystep)), "</text>\n");
  }
  absl::StrAppend(out, "</g>\n");
  absl::StrAppend(out, "<text class=\"xlabel\" x=\"", Num(left + pw / 2), "\" y=\"", Num(f.H - 12),
                  "\" text-anchor=\"middle\">", XmlEscape(plot.x_label), "</text>\n");
  absl::StrAppend(out, "<text class=\"ylabel\" x=\"16\" y=\"", Num(top + ph / 2),
                  "\" text-anchor=\"middle\" transform=\"rotate(-90 16 ", Num(top + ph / 2), ")\">",
                  XmlEscape(plot.y_label), "</text>\n");
  if (plot.y_reference) {
    absl::StrAppend(out, "<line class=\"reference\" x1=\"", Num(left), "\" y1=\"",
                    Num(f.py(*plot.y_reference)), "\" x2=\"", Num(left + pw), "\" y2=\"",
                    Num(f.py(*plot.y_reference)),
                    "\" stroke=\"#777777\" stroke-dasharray=\"2 3\"/>\n");
  }
  if (plot.x_reference) {
    absl::StrAppend(out, "<line class=\"reference\" x1=\"", Num(f.px(*plot.x_reference)),
                    "\" y1=\"", Num(top), "\" x2=\"", Num(f.px(*plot.x_reference)), "\" y2=\"",
                    Num(top + ph), "\" stroke=\"#777777\" stroke-dasharray=\"2 3\"/>\n");
  }
  if (!f.has_data) {
    absl::StrAppend(out, "<text x=\"", Num(left + pw / 2), "\" y=\"", Num(top + ph / 2),
                    "\" text-anchor=\"middle\" fill=\"#777777\">no data</text>\n");
  }
}

// One series: its line (broken where a value is missing), markers and point labels.
void AppendSeries(const SvgSeries& s, const char* color, const Frame& f, std::string* out) {
  absl::StrAppend(out, "<g class=\"series\" data-name=\"", XmlEscape(s.name), "\">\n");
  const size_t n = std::min(s.x.size(), s.y.size());
  if (s.line) {
    std::string d;
    bool pen_down = false;
    for (size_t i = 0; i < n; ++i) {
      if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i])) {
        pen_down = false;  // a gap where a value is missing
        continue;
      }
      absl::StrAppend(&d, pen_down ? " L" : (d.empty() ? "M" : " M"), Num(f.px(s.x[i])), " ",
                      Num(f.py(s.y[i])));
      pen_down = true;
    }
    if (!d.empty()) {
      absl::StrAppend(out, "<path d=\"", d, "\" fill=\"none\" stroke=\"", color,
                      "\" stroke-width=\"2\"", s.dashed ? " stroke-dasharray=\"6 4\"" : "", "/>\n");
    }
  }
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i])) continue;
    if (s.markers) {
      absl::StrAppend(out, "<circle cx=\"", Num(f.px(s.x[i])), "\" cy=\"", Num(f.py(s.y[i])),
                      "\" r=\"3.5\" fill=\"", color, "\"/>\n");
    }
  }
  absl::StrAppend(out, "</g>\n");
}

// The box of a label of width w beside (px, py) at distance d in direction (dx, dy).
Box LabelBox(double px, double py, double w, double h, double d, int dx, int dy) {
  Box b;
  const double ax = px + dx * d, ay = py + dy * d;
  b.x0 = dx > 0 ? ax : dx < 0 ? ax - w : ax - w / 2;
  b.y0 = dy < 0 ? ay - h : dy > 0 ? ay : ay - h / 2;
  b.x1 = b.x0 + w;
  b.y1 = b.y0 + h;
  return b;
}

// Distance from (x, y) to the nearest point of the box (0 inside it).
double BoxDistance(const Box& b, double x, double y) {
  const double dx = std::clamp(x, b.x0, b.x1) - x, dy = std::clamp(y, b.y0, b.y1) - y;
  return std::sqrt(dx * dx + dy * dy);
}

// Point labels: each goes where it overlaps no other label and no point, nearest to its own
// point, and not nearer to another point than to its own (a reader pairs a label with the
// nearest point). One that had to move away from its point gets a leader line. With no free
// place left, the least crowded one is taken.
void AppendLabels(const SvgPlot& plot, const Frame& f, std::string* out) {
  struct Mark {
    double x, y;
  };
  std::vector<Mark> marks;
  std::vector<Box> taken;
  for (const auto& s : plot.series) {
    if (!s.markers) continue;
    for (size_t i = 0; i < std::min(s.x.size(), s.y.size()); ++i) {
      if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i])) continue;
      const double px = f.px(s.x[i]), py = f.py(s.y[i]);
      marks.push_back({px, py});
      taken.push_back({px - 4, py - 4, px + 4, py + 4});
    }
  }
  constexpr double kFont = 11, kHeight = 13;
  const Box panel{f.left + 2, f.top + 2, f.left + f.pw - 2, f.top + f.ph - 2};
  std::string text;
  for (const auto& s : plot.series) {
    for (size_t i = 0; i < std::min({s.x.size(), s.y.size(), s.labels.size()}); ++i) {
      if (s.labels[i].empty() || !std::isfinite(s.x[i]) || !std::isfinite(s.y[i])) continue;
      const double px = f.px(s.x[i]), py = f.py(s.y[i]);
      const double w = TextWidth(s.labels[i], kFont);
      // A cost per place: overlaps first, then other points nearer than its own, then distance.
      auto cost = [&](const Box& b) {
        double c = BoxDistance(b, px, py);
        for (const Box& t : taken) c += b.Overlaps(t) ? 1000 : 0;
        for (const Mark& m : marks) {
          if ((m.x != px || m.y != py) && BoxDistance(b, m.x, m.y) < BoxDistance(b, px, py) - 1)
            c += 40;
        }
        return c;
      };
      Box best = LabelBox(px, py, w, kHeight, 5, 1, -1);
      double best_cost = -1;
      for (double y0 = panel.y0; y0 + kHeight <= panel.y1; y0 += 2) {
        for (double x0 = panel.x0; x0 + w <= panel.x1; x0 += 3) {
          const Box b{x0, y0, x0 + w, y0 + kHeight};
          if (best_cost >= 0 && BoxDistance(b, px, py) >= best_cost) continue;
          const double c = cost(b);
          if (best_cost < 0 || c < best_cost) {
            best = b;
            best_cost = c;
          }
        }
      }
      taken.push_back(best);
      if (BoxDistance(best, px, py) > 9) {
        // A leader line from the point to the nearest point of the label's box.
        const double lx = std::clamp(px, best.x0, best.x1), ly = std::clamp(py, best.y0, best.y1);
        absl::StrAppend(&text, "<line class=\"leader\" x1=\"", Num(px), "\" y1=\"", Num(py),
                        "\" x2=\"", Num(lx), "\" y2=\"", Num(ly),
                        "\" stroke=\"#777777\" stroke-width=\"1\"/>\n");
      }
      // The text is anchored at the box's side that faces the point, so that whatever the
      // font's true width, the label ends (or starts) where it was placed beside its point.
      const char* anchor = best.x1 <= px + 1 ? "end" : best.x0 >= px - 1 ? "start" : "middle";
      const double tx = anchor[0] == 'e'   ? best.x1
                        : anchor[0] == 's' ? best.x0
                                           : (best.x0 + best.x1) / 2;
      absl::StrAppend(&text, "<text x=\"", Num(tx), "\" y=\"", Num(best.y1 - 3),
                      "\" text-anchor=\"", anchor, "\" font-size=\"11\" fill=\"#333333\">",
                      XmlEscape(s.labels[i]), "</text>\n");
    }
  }
  if (!text.empty()) absl::StrAppend(out, "<g class=\"labels\">\n", text, "</g>\n");
}

// The legend right of the panel: one entry per named series, names cut at 40 characters.
void AppendLegend(const SvgPlot& plot, const Frame& f, std::string* out) {
  absl::StrAppend(out, "<g class=\"legend\">\n");
  double ly = f.top + 8;
  for (size_t si = 0; si < plot.series.size(); ++si) {
    const SvgSeries& s = plot.series[si];
    if (s.name.empty()) continue;
    const char* color = PaletteColor(s.color >= 0 ? s.color : static_cast<int>(si));
    const double lx = f.left + f.pw + 12;
    if (s.line) {
      absl::StrAppend(out, "<line x1=\"", Num(lx), "\" y1=\"", Num(ly), "\" x2=\"", Num(lx + 18),
                      "\" y2=\"", Num(ly), "\" stroke=\"", color, "\" stroke-width=\"2\"",
                      s.dashed ? " stroke-dasharray=\"6 4\"" : "", "/>\n");
    }
    if (s.markers)
      absl::StrAppend(out, "<circle cx=\"", Num(lx + 9), "\" cy=\"", Num(ly),
                      "\" r=\"3.5\" fill=\"", color, "\"/>\n");
    const std::string name = LegendName(s.name);
    absl::StrAppend(out, "<text x=\"", Num(lx + 24), "\" y=\"", Num(ly + 4), "\">", XmlEscape(name),
                    "</text>\n");
    ly += 18;
    if (ly > f.H - 10) break;
  }
  absl::StrAppend(out, "</g>\n");
}

}  // namespace

std::string RenderSvg(const SvgPlot& plot, bool standalone) {
  const Frame f = Layout(plot);
  std::string out = absl::StrCat(
      "<svg", standalone ? " xmlns=\"http://www.w3.org/2000/svg\"" : "", " class=\"plot\" width=\"",
      f.W, "\" height=\"", f.H, "\" viewBox=\"0 0 ", f.W, " ", f.H, "\" role=\"img\" aria-label=\"",
      XmlEscape(plot.title), "\" font-family=\"sans-serif\" font-size=\"12\">\n");
  absl::StrAppend(&out, "<title>", XmlEscape(plot.title), "</title>\n");
  absl::StrAppend(&out, "<rect x=\"0\" y=\"0\" width=\"", f.W, "\" height=\"", f.H,
                  "\" fill=\"#ffffff\"/>\n");
  AppendAxes(plot, f, &out);
  for (size_t si = 0; si < plot.series.size(); ++si) {
    const SvgSeries& s = plot.series[si];
    AppendSeries(s, PaletteColor(s.color >= 0 ? s.color : static_cast<int>(si)), f, &out);
  }
  AppendLabels(plot, f, &out);
  if (f.legend) AppendLegend(plot, f, &out);
  absl::StrAppend(&out, "</svg>\n");
  return out;
}

}  // namespace stemma::cli::report
