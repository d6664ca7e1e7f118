// Inline-SVG drawing for the run report (train/run_report.h): line plots with
// axes and per-point tooltips, and a stacked bar of a step's stages.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace kestrel::train::report {

struct Series {
  std::string name;                             // the metric key
  std::vector<std::pair<int64_t, double>> pts;  // (step, value), ascending steps
};

// An <svg> line plot of the series (one colour each, a legend when several).
std::string line_plot(const std::string& id, const std::vector<Series>& series);

// A horizontal stacked bar of (stage, seconds), with a legend and the total.
std::string stage_bar(const std::vector<std::pair<std::string, double>>& stages);

std::string html_escape(const std::string& s);
std::string fmt_value(double v);  // %.17g: what metrics.jsonl holds, round-trip exact
std::string fmt_short(double v);  // %.4g for labels

}  // namespace kestrel::train::report
