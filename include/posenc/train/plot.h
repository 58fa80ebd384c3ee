// Line charts for training curves and comparisons (OpenCV drawing, PNG written atomically).
// Panels side by side, each with its own axes, ticks, and a legend; NaN points are skipped;
// log_x for context-length sweeps.
#pragma once

#include <string>
#include <vector>

namespace posenc::train {

struct Series {
  std::string name;
  std::vector<double> x, y;
};

struct Panel {
  std::string title, x_label, y_label;
  std::vector<Series> series;
  bool log_x = false;
};

/// Draws the panels into one PNG at `path` (temp file + rename); errors name the path.
void plot_panels(const std::string& path, const std::vector<Panel>& panels);
/// Writes `text` to `path` atomically (temp file in the same folder, then rename).
void write_file_atomically(const std::string& path, const std::string& text);

}  // namespace posenc::train
