// A small hand-written SVG plot: one panel with axes, "nice" ticks, axis labels, a title, a
// legend, and series drawn as lines and/or points (optionally labelled). No plotting library
// and no script: the output is static markup that a browser or an image viewer draws as is.
// Pure functions; thread-compatible.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace stemma::cli::report {

struct SvgSeries {
  std::string name;                 // legend entry ("" = none)
  std::vector<double> x, y;         // same length; non-finite points are skipped
  std::vector<std::string> labels;  // optional text beside each point (empty or one per point)
  bool line = true;                 // join the points in order
  bool markers = true;              // a circle at every point
  bool dashed = false;
  int color = -1;  // palette index; -1: the series' position
};

struct SvgPlot {
  std::string title;
  std::string x_label;
  std::string y_label;
  std::vector<SvgSeries> series;
  int width = 640;
  int height = 400;
  bool x_integer = false;             // integer ticks only (layers, steps)
  std::optional<double> y_reference;  // a dotted horizontal line (e.g. asymmetry 1)
  std::optional<double> x_reference;  // a dotted vertical line (e.g. forgetting 0)
};

// The plot as an <svg> element. `standalone` adds the XML namespace (a .svg file); inline
// in HTML it is left out, so the page names no URL at all. Text is XML-escaped. A plot
// without one finite point still renders (axes over [0, 1] and "no data").
std::string RenderSvg(const SvgPlot& plot, bool standalone);

// About `count` round tick values covering [lo, hi] (steps of 1, 2 or 5 times a power of
// ten), ascending; lo == hi gets a range around the value.
std::vector<double> NiceTicks(double lo, double hi, int count);

// A tick's text: as few decimals as the step needs ("0.25", "1000", "1e+06" for huge).
std::string TickText(double value, double step);

// The colour of palette index i (cycles).
const char* PaletteColor(int i);

// "&", "<", ">", quotes escaped for XML text and attributes.
std::string XmlEscape(const std::string& text);

}  // namespace stemma::cli::report
