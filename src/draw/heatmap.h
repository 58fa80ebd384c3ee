// Heatmaps for `posenc plot` and the trainer's two-way tables: matrices drawn with the viridis
// colour map, labelled axes, a colour bar with its range, one panel per matrix (e.g. per
// attention head, per run). Written as PNG, atomically.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace posenc::draw {

struct HeatmapPanel {
  at::Tensor values;  ///< [rows, cols]
  std::string title;
};

struct Figure {
  std::string title;
  std::string x_label;
  std::string y_label;
  std::vector<HeatmapPanel> panels;
  /// Tick labels for every row / column (empty: indices 0..n-1, thinned to about 5).
  std::vector<std::string> row_ticks, col_ticks;
  /// The colour scale; unset: the panels' min and max.
  std::optional<std::pair<double, double>> range;
  /// Print each cell's value in it (for small tables).
  bool annotate = false;
};

/// Renders the figure and writes it to `path` (temp file + rename).
void write_heatmap_png(const Figure& figure, const std::string& path);

}  // namespace posenc::draw
