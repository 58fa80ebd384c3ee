// Heatmaps for `posenc plot`: matrices drawn with the viridis colour map, labelled axes, a colour
// bar with its range, one panel per matrix (e.g. per attention head). Written as PNG, atomically.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

namespace posenc::cli {

struct Panel {
  at::Tensor values;  ///< [rows, cols]
  std::string title;
};

struct Figure {
  std::string title;
  std::string x_label;
  std::string y_label;
  std::vector<Panel> panels;
};

/// Renders the figure and writes it to `path` (temp file + rename).
void write_heatmap_png(const Figure& figure, const std::string& path);

}  // namespace posenc::cli
