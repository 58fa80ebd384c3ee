// Line charts for training curves and comparisons (OpenCV drawing, PNG written atomically by
// posenc/io/durable_file.h).
// Panels side by side, each with its own axes, ticks, and a legend; NaN points are skipped;
// log_x for context-length sweeps.
#pragma once

#include <string>
#include <vector>

namespace posenc::train {

struct Series {
  std::string name;
  std::vector<double> x, y;
  /// Index into the palette; -1: the series' position in its panel. A comparison gives each run
  /// its own, so a run has one colour in every panel.
  int colour = -1;
};

struct ChartPanel {
  std::string title, x_label, y_label;
  std::vector<Series> series;
  bool log_x = false;
};

/// Draws the panels into one PNG at `path` (temp file + rename); errors name the path.
void plot_panels(const std::string& path, const std::vector<ChartPanel>& panels);
}  // namespace posenc::train
