// Heatmap rendering with OpenCV; see heatmap.h. All panels share one colour scale so heads can
// be compared; the colour bar shows that scale's minimum, middle and maximum.
#include "heatmap.h"

#include <torch/torch.h>

#include <cstdio>
#include <fstream>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#include <sstream>
#include <tuple>

#include "posenc/io/durable_file.h"
#include "text.h"

namespace posenc::draw {

namespace {

void put_vertical_text(cv::Mat& image, const std::string& text, cv::Point center) {
  int baseline = 0;
  auto size = cv::getTextSize(text, kFont, 0.5, 1, &baseline);
  cv::Mat strip(size.height + baseline + 4, size.width + 4, CV_8UC3, cv::Scalar(255, 255, 255));
  cv::putText(strip, text, {2, size.height + 1}, kFont, 0.5, kInk, 1, cv::LINE_AA);
  cv::Mat rotated;
  cv::rotate(strip, rotated, cv::ROTATE_90_COUNTERCLOCKWISE);
  int x = center.x - rotated.cols / 2, y = center.y - rotated.rows / 2;
  x = std::max(0, std::min(x, image.cols - rotated.cols));
  y = std::max(0, std::min(y, image.rows - rotated.rows));
  rotated.copyTo(image(cv::Rect(x, y, rotated.cols, rotated.rows)));
}

// values [rows, cols] -> BGR image of size `size`, scaled to [lo, hi].
cv::Mat colour(const at::Tensor& values, double lo, double hi, cv::Size size) {
  auto v = values.to(torch::kFloat32).contiguous();
  const int rows = static_cast<int>(v.size(0)), cols = static_cast<int>(v.size(1));
  cv::Mat m(rows, cols, CV_32F, v.data_ptr<float>());
  cv::Mat scaled;
  const double span = hi > lo ? hi - lo : 1.0;
  m.convertTo(scaled, CV_8U, 255.0 / span, -lo * 255.0 / span);
  cv::Mat coloured, big;
  cv::applyColorMap(scaled, coloured, cv::COLORMAP_VIRIDIS);
  cv::resize(coloured, big, size, 0, 0, cv::INTER_NEAREST);
  return big;
}

// Tick labels: the figure's own (every row / column), else indices thinned to about 5.
void draw_ticks(cv::Mat& image, cv::Rect area, int64_t rows, int64_t cols,
                const std::vector<std::string>& row_labels,
                const std::vector<std::string>& col_labels) {
  auto ticks = [](int64_t n, const std::vector<std::string>& labels) {
    std::vector<std::pair<int64_t, std::string>> out;
    if (static_cast<int64_t>(labels.size()) == n) {
      for (int64_t i = 0; i < n; ++i) out.emplace_back(i, labels[static_cast<size_t>(i)]);
      return out;
    }
    const int64_t step = std::max<int64_t>(1, (n + 4) / 5);
    for (int64_t i = 0; i < n; i += step) out.emplace_back(i, std::to_string(i));
    if (out.back().first != n - 1) out.emplace_back(n - 1, std::to_string(n - 1));
    return out;
  };
  for (const auto& [c, label] : ticks(cols, col_labels)) {
    const int x = area.x + static_cast<int>((c + 0.5) * area.width / cols);
    cv::line(image, {x, area.y + area.height}, {x, area.y + area.height + 4}, kInk);
    put_text(image, label, {x, area.y + area.height + 17}, 0.38, true);
  }
  for (const auto& [r, label] : ticks(rows, row_labels)) {
    const int y = area.y + static_cast<int>((r + 0.5) * area.height / rows);
    cv::line(image, {area.x - 4, y}, {area.x, y}, kInk);
    put_text(image, label, {area.x - 8 - text_width(label, 0.38), y + 4}, 0.38);
  }
}

// Each cell's value, in dark ink on light cells and white on dark ones.
void annotate_cells(cv::Mat& image, cv::Rect area, const at::Tensor& values, double lo, double hi) {
  auto v = values.to(torch::kFloat64).contiguous();
  const int64_t rows = v.size(0), cols = v.size(1);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const double value = v[r][c].item<double>();
      const double shade = hi > lo ? (value - lo) / (hi - lo) : 0.5;
      const int x = area.x + static_cast<int>((c + 0.5) * area.width / cols);
      const int y = area.y + static_cast<int>((r + 0.5) * area.height / rows) + 4;
      char text[16];
      std::snprintf(text, sizeof(text), "%.2f", value);
      const cv::Scalar ink = shade > 0.6 ? kInk : cv::Scalar(255, 255, 255);
      cv::putText(image, text, {x - text_width(text, 0.35) / 2, y}, kFont, 0.35, ink, 1,
                  cv::LINE_AA);
    }
  }
}

}  // namespace

void write_heatmap_png(const Figure& figure, const std::string& path) {
  TORCH_CHECK(!figure.panels.empty(), "plot: nothing to draw");
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (const auto& p : figure.panels) {
    TORCH_CHECK(p.values.dim() == 2 && p.values.numel() > 0,
                "plot: each panel must be a non-empty [rows, cols] matrix, got ", p.values.sizes());
    lo = std::min(lo, p.values.min().item<double>());
    hi = std::max(hi, p.values.max().item<double>());
  }
  if (figure.range) std::tie(lo, hi) = *figure.range;
  const int n = static_cast<int>(figure.panels.size());
  const int grid_cols = n <= 4 ? n : static_cast<int>(std::ceil(std::sqrt(n)));
  const int grid_rows = (n + grid_cols - 1) / grid_cols;
  const int panel_w = n == 1 ? 640 : std::max(180, 720 / grid_cols);
  const int panel_h = n == 1 ? 480 : panel_w;
  const int margin_l = 70, margin_t = 60, gap_x = 50, gap_y = 60, bar_w = 20, margin_r = 110;
  const int width = margin_l + grid_cols * panel_w + (grid_cols - 1) * gap_x + margin_r;
  const int height = margin_t + grid_rows * panel_h + (grid_rows - 1) * gap_y + 60;
  cv::Mat image(height, width, CV_8UC3, cv::Scalar(255, 255, 255));
  put_text(image, figure.title, {width / 2, 28}, 0.6, true);
  for (int i = 0; i < n; ++i) {
    const auto& p = figure.panels[i];
    const int gx = i % grid_cols, gy = i / grid_cols;
    cv::Rect area(margin_l + gx * (panel_w + gap_x), margin_t + gy * (panel_h + gap_y), panel_w,
                  panel_h);
    colour(p.values, lo, hi, area.size()).copyTo(image(area));
    cv::rectangle(image, area, kInk);
    draw_ticks(image, area, p.values.size(0), p.values.size(1), figure.row_ticks, figure.col_ticks);
    if (figure.annotate) annotate_cells(image, area, p.values, lo, hi);
    if (!p.title.empty())
      put_text(image, p.title, {area.x + area.width / 2, area.y - 8}, 0.45, true);
  }
  const int plot_bottom = margin_t + grid_rows * panel_h + (grid_rows - 1) * gap_y;
  const int plot_right = margin_l + grid_cols * panel_w + (grid_cols - 1) * gap_x;
  put_text(image, figure.x_label, {(margin_l + plot_right) / 2, plot_bottom + 45}, 0.5, true);
  put_vertical_text(image, figure.y_label, {14, (margin_t + plot_bottom) / 2});
  // colour bar: top = hi, bottom = lo
  cv::Rect bar(plot_right + 25, margin_t, bar_w, plot_bottom - margin_t);
  auto gradient = torch::linspace(hi, lo, 256, torch::kFloat64).unsqueeze(1);
  colour(gradient, lo, hi, bar.size()).copyTo(image(bar));
  cv::rectangle(image, bar, kInk);
  // round values on the bar (1-2-5 steps; 0 printed as 0, never as rounding noise)
  auto [step, ticks] = draw::nice_ticks(lo, hi, 5);
  for (double v : ticks) {
    const int y = bar.y + static_cast<int>((hi - v) / (hi > lo ? hi - lo : 1.0) * bar.height);
    cv::line(image, {bar.x + bar_w, y}, {bar.x + bar_w + 4, y}, kInk, 1);
    put_text(image, draw::format_tick(v, step), {bar.x + bar_w + 7, y + 4}, 0.4);
  }

  std::vector<uchar> png;
  TORCH_CHECK(cv::imencode(".png", image, png), "plot: PNG encoding failed");
  try {  // durable, atomic, and never over a device, FIFO or link (posenc/io/durable_file.h)
    write_file_atomically(path, std::string(png.begin(), png.end()));
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "plot: ", e.what_without_backtrace());
  }
}

}  // namespace posenc::draw
