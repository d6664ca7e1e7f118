#include "train/run_report_svg.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace kestrel::train::report {

namespace {

const char* const kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf",
                               "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#393b79", "#637939"};
constexpr int kW = 560, kH = 220, kLeft = 64, kRight = 12, kTop = 12, kBottom = 34;

std::string num(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", v);
  return b;
}

// About `n` round tick values covering [lo, hi].
std::vector<double> ticks(double lo, double hi, int n) {
  const double span = hi - lo;
  const double raw = span / std::max(1, n);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0})
    if (m * mag >= raw) {
      step = m * mag;
      break;
    }
  std::vector<double> out;
  for (double t = std::ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) out.push_back(std::abs(t) < step * 1e-9 ? 0 : t);
  return out;
}

// Axis labels: plain digits up to a million (throughput reads 30000, not 3e+04).
std::string fmt_tick(double t) {
  char b[32];
  std::snprintf(b, sizeof b, std::abs(t) >= 1e4 && std::abs(t) < 1e6 ? "%.0f" : "%.4g", t);
  return b;
}

std::string pct(double p) {
  char b[32];
  std::snprintf(b, sizeof b, p < 0.1 ? "&lt;0.1%%" : "%.1f%%", p);
  return b;
}

}  // namespace

std::string html_escape(const std::string& s) {
  std::string o;
  o.reserve(s.size());
  for (char c : s) switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      default: o += c;
    }
  return o;
}

std::string fmt_value(double v) {
  char b[40];
  std::snprintf(b, sizeof b, "%.17g", v);
  return b;
}

std::string fmt_short(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.4g", v);
  return b;
}

std::string line_plot(const std::string& id, const std::vector<Series>& series) {
  double x0 = 1e300, x1 = -1e300, y0 = 1e300, y1 = -1e300;
  for (const Series& s : series)
    for (const auto& [x, y] : s.pts) {
      if (!std::isfinite(y)) continue;
      x0 = std::min(x0, double(x));
      x1 = std::max(x1, double(x));
      y0 = std::min(y0, y);
      y1 = std::max(y1, y);
    }
  if (x0 > x1) return "";
  if (x1 == x0) x1 = x0 + 1;
  if (y1 == y0) {
    const double pad = y0 == 0 ? 1 : std::abs(y0) * 0.1;
    y0 -= pad;
    y1 += pad;
  } else {
    const double pad = (y1 - y0) * 0.05;
    y0 -= pad;
    y1 += pad;
  }
  const double pw = kW - kLeft - kRight, ph = kH - kTop - kBottom;
  auto X = [&](double x) { return kLeft + (x - x0) / (x1 - x0) * pw; };
  auto Y = [&](double y) { return kTop + (1 - (y - y0) / (y1 - y0)) * ph; };
  std::string o = "<svg class=\"plot\" id=\"plot-" + id + "\" xmlns=\"http://www.w3.org/2000/svg\" width=\"" +
                  std::to_string(kW) + "\" height=\"" + std::to_string(kH) + "\" viewBox=\"0 0 " + std::to_string(kW) +
                  " " + std::to_string(kH) + "\" role=\"img\">\n";
  o += "<rect x=\"" + std::to_string(kLeft) + "\" y=\"" + std::to_string(kTop) + "\" width=\"" + num(pw) +
       "\" height=\"" + num(ph) + "\" fill=\"#fafafa\" stroke=\"#ccc\"/>\n";
  for (double t : ticks(y0, y1, 4)) {
    o += "<line x1=\"" + std::to_string(kLeft) + "\" x2=\"" + num(kLeft + pw) + "\" y1=\"" + num(Y(t)) + "\" y2=\"" +
         num(Y(t)) + "\" stroke=\"#e4e4e4\"/>";
    o += "<text x=\"" + std::to_string(kLeft - 6) + "\" y=\"" + num(Y(t) + 4) +
         "\" text-anchor=\"end\" font-size=\"11\">" + fmt_tick(t) + "</text>\n";
  }
  for (double t : ticks(x0, x1, 6)) {
    if (t != std::floor(t)) continue;  // steps are integers
    o += "<text x=\"" + num(X(t)) + "\" y=\"" + std::to_string(kH - kBottom + 16) +
         "\" text-anchor=\"middle\" font-size=\"11\">" + fmt_short(t) + "</text>\n";
  }
  o += "<text x=\"" + num(kLeft + pw / 2) + "\" y=\"" + std::to_string(kH - 4) +
       "\" text-anchor=\"middle\" font-size=\"11\" fill=\"#555\">step</text>\n";
  for (size_t si = 0; si < series.size(); ++si) {
    const Series& s = series[si];
    const char* color = kColors[si % (sizeof kColors / sizeof kColors[0])];
    std::string path;
    for (const auto& [x, y] : s.pts) {
      if (!std::isfinite(y)) continue;
      path += (path.empty() ? "M" : " L") + num(X(double(x))) + " " + num(Y(y));
    }
    o += "<path d=\"" + path + "\" fill=\"none\" stroke=\"" + color + "\" stroke-width=\"1.6\"/>\n";
    const bool dots = s.pts.size() <= 400;  // beyond that the line alone reads better
    for (const auto& [x, y] : s.pts) {
      if (!std::isfinite(y)) continue;
      o += "<circle class=\"pt\" data-key=\"" + html_escape(s.name) + "\" data-step=\"" + std::to_string(x) +
           "\" data-value=\"" + fmt_value(y) + "\" cx=\"" + num(X(double(x))) + "\" cy=\"" + num(Y(y)) + "\" r=\"" +
           (dots ? "2.4" : "0") + "\" fill=\"" + color + "\"><title>" + html_escape(s.name) + " at step " +
           std::to_string(x) + ": " + fmt_short(y) + "</title></circle>";
    }
    o += "\n";
    if (series.size() > 1)
      o += "<text x=\"" + num(kLeft + 8) + "\" y=\"" + num(kTop + 14 + 13 * double(si)) + "\" font-size=\"11\" fill=\"" +
           color + "\">" + html_escape(s.name) + "</text>\n";
  }
  return o + "</svg>\n";
}

std::string stage_bar(const std::vector<std::pair<std::string, double>>& stages) {
  double total = 0;
  for (const auto& st : stages) total += std::max(0.0, st.second);
  if (total <= 0) return "";
  const int w = 900, bar = 34, per_row = 3, legend_rows = int((stages.size() + per_row - 1) / per_row);
  const int h = bar + 20 + 18 * legend_rows;
  std::string o = "<svg class=\"timeline\" id=\"timeline\" xmlns=\"http://www.w3.org/2000/svg\" width=\"" +
                  std::to_string(w) + "\" height=\"" + std::to_string(h) + "\" role=\"img\">\n";
  double x = 0;
  for (size_t i = 0; i < stages.size(); ++i) {
    const auto& [name, secs] = stages[i];
    const double sw = std::max(0.0, secs) / total * w;
    const char* color = kColors[i % (sizeof kColors / sizeof kColors[0])];
    o += "<rect class=\"stage\" data-stage=\"" + html_escape(name) + "\" data-seconds=\"" + fmt_value(secs) +
         "\" x=\"" + num(x) + "\" y=\"0\" width=\"" + num(sw) + "\" height=\"" + std::to_string(bar) + "\" fill=\"" +
         color + "\" stroke=\"#fff\"><title>" + html_escape(name) + ": " + fmt_short(secs) + " s</title></rect>\n";
    x += sw;
    const int lx = int(i % per_row) * (w / per_row), ly = bar + 16 + 18 * int(i / per_row);
    o += "<rect x=\"" + std::to_string(lx) + "\" y=\"" + std::to_string(ly - 10) + "\" width=\"10\" height=\"10\" fill=\"" +
         color + "\"/><text x=\"" + std::to_string(lx + 14) + "\" y=\"" + std::to_string(ly) + "\" font-size=\"12\">" +
         html_escape(name) + " " + fmt_short(secs) + " s (" + pct(100 * secs / total) + ")</text>\n";
  }
  return o + "</svg>\n";
}

}  // namespace kestrel::train::report
