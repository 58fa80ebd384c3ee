// Line charts with OpenCV; see posenc/train/line_chart.h.
#include "posenc/train/line_chart.h"

#include <c10/util/Exception.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#include <sstream>

#include "../draw/text.h"
#include "posenc/core/errors.h"
#include "posenc/io/durable_file.h"

namespace posenc::train {
namespace {

// Margins: y tick labels right-aligned left of the frame, the legend in a row above it (off the
// data), x tick labels and the axis title below.
constexpr int kWidth = 520, kHeight = 390, kLeft = 64, kRight = 24, kTop = 58, kBottom = 50;
const cv::Scalar kGrid(225, 225, 225);
using draw::format_number;
using draw::format_tick;
using draw::kInk;
using draw::nice_ticks;
using draw::put_text;
using draw::text_width;
// Tableau-like colours (BGR): ten strong ones, then their light variants and black, so a
// comparison of up to 16 runs never repeats a colour.
const std::vector<cv::Scalar> kColours = {
    {180, 119, 31},  {14, 127, 255},  {44, 160, 44},   {40, 39, 214},
    {189, 103, 148}, {75, 86, 140},   {194, 119, 227}, {127, 127, 127},
    {34, 189, 188},  {207, 190, 23},  {0, 0, 0},       {232, 199, 174},
    {120, 187, 255}, {138, 223, 152}, {150, 152, 255}, {213, 176, 197}};
// A legend wider than the frame moves from the row above it into a column on its right.
constexpr int kLegendLine = 24, kLegendGap = 10, kLegendRow = 18;

cv::Mat draw_panel(const ChartPanel& panel) {
  int row_width = 0, widest = 0;  // the legend as one row, and its widest entry
  for (const auto& s : panel.series) {
    row_width += text_width(s.name, 0.42) + kLegendLine + kLegendGap + 10;
    widest = std::max(widest, text_width(s.name, 0.42));
  }
  const bool legend_column = row_width > kWidth - kLeft - kRight;
  const int column = legend_column ? widest + kLegendLine + 2 * kLegendGap : 0;
  const int height = std::max<int>(
      kHeight, legend_column ? kTop + 8 + kLegendRow * static_cast<int>(panel.series.size()) : 0);
  cv::Mat image(height, kWidth + column, CV_8UC3, cv::Scalar(255, 255, 255));
  double x0 = std::numeric_limits<double>::infinity(), x1 = -x0, y0 = x0, y1 = -x0;
  auto fx = [&](double x) { return panel.log_x ? std::log2(x) : x; };
  for (const auto& s : panel.series) {
    for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
      if (!std::isfinite(s.y[i]) || !std::isfinite(fx(s.x[i]))) continue;
      x0 = std::min(x0, fx(s.x[i]));
      x1 = std::max(x1, fx(s.x[i]));
      y0 = std::min(y0, s.y[i]);
      y1 = std::max(y1, s.y[i]);
    }
  }
  put_text(image, panel.title, {kWidth / 2, 22}, 0.55, true);
  if (!std::isfinite(x0)) {
    put_text(image, "(no data)", {kWidth / 2, kHeight / 2}, 0.5, true);
    return image;
  }
  if (x1 == x0) x1 = x0 + 1;
  if (y1 == y0) y1 = y0 + 1;
  // y: the frame spans whole tick steps, so the top and bottom lines carry round labels
  auto [y_step, y_ticks] = nice_ticks(y0, y1, 5);
  y0 = std::floor(y0 / y_step) * y_step;
  y1 = std::ceil(y1 / y_step) * y_step;
  std::tie(y_step, y_ticks) = nice_ticks(y0, y1, 6);
  const int w = kWidth - kLeft - kRight, h = height - kTop - kBottom;
  auto px = [&](double x) { return kLeft + static_cast<int>((fx(x) - x0) / (x1 - x0) * w); };
  auto py = [&](double y) { return kTop + h - static_cast<int>((y - y0) / (y1 - y0) * h); };
  for (double y : y_ticks) {
    cv::line(image, {kLeft, py(y)}, {kLeft + w, py(y)}, kGrid, 1);
    const auto label = format_tick(y, y_step);
    put_text(image, label, {std::max(2, kLeft - 6 - text_width(label, 0.42)), py(y) + 4}, 0.42);
  }
  // x: round values (log scale: powers of two)
  std::vector<std::pair<double, std::string>> x_ticks;  // (position on the axis, label)
  if (panel.log_x) {
    for (double e = std::ceil(x0 - 1e-9); e <= x1 + 1e-9; e += 1)
      x_ticks.emplace_back(e,
                           std::exp2(e) >= 1 && std::exp2(e) < 1e6
                               ? std::to_string(std::llround(std::exp2(e)))  // 1024, not 1.02e+03
                               : format_number(std::exp2(e)));
  } else {
    auto [x_step, values] = nice_ticks(x0, x1, 5);
    for (double v : values) x_ticks.emplace_back(v, format_tick(v, x_step));
  }
  for (const auto& [xv, label] : x_ticks) {
    const int at = kLeft + static_cast<int>((xv - x0) / (x1 - x0) * w);
    cv::line(image, {at, kTop + h}, {at, kTop + h + 4}, kInk, 1);
    const int half = text_width(label, 0.42) / 2;
    put_text(image, label, {std::clamp(at, half + 2, kWidth - half - 2), kTop + h + 18}, 0.42,
             true);
  }
  cv::rectangle(image, {kLeft, kTop}, {kLeft + w, kTop + h}, kInk, 1);
  put_text(image, panel.x_label, {kLeft + w / 2, height - 10}, 0.45, true);
  put_text(image, panel.y_label, {4, kTop - 24}, 0.42);
  int legend_right = kLeft + w;  // legend entries right to left, above the frame
  for (size_t k = panel.series.size(); k-- > 0;) {
    const auto& s = panel.series[k];
    const auto colour =
        kColours[static_cast<size_t>(s.colour >= 0 ? s.colour : static_cast<int>(k)) %
                 kColours.size()];
    std::vector<cv::Point> points;
    for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
      if (std::isfinite(s.y[i])) points.emplace_back(px(s.x[i]), py(s.y[i]));
    }
    if (points.size() > 1) cv::polylines(image, points, false, colour, 2, cv::LINE_AA);
    for (const auto& p : points) cv::circle(image, p, points.size() < 30 ? 3 : 1, colour, -1);
    if (legend_column) {  // top to bottom in series order, right of the frame
      const int x = kLeft + w + kRight + kLegendGap, y = kTop + kLegendRow * static_cast<int>(k);
      cv::line(image, {x, y + 8}, {x + kLegendLine - 4, y + 8}, colour, 2);
      put_text(image, s.name, {x + kLegendLine, y + 12}, 0.42);
      continue;
    }
    const int label_width = text_width(s.name, 0.42);
    const int x = legend_right - label_width;
    put_text(image, s.name, {x, kTop - 8}, 0.42);
    cv::line(image, {x - 24, kTop - 12}, {x - 4, kTop - 12}, colour, 2);
    legend_right = x - 34;
  }
  return image;
}

}  // namespace

void plot_panels(const std::string& path, const std::vector<ChartPanel>& panels) {
  TORCH_CHECK(!panels.empty(), "plot: no panels for '", path, "'");
  std::vector<cv::Mat> images;
  int tallest = 0;
  for (const auto& panel : panels) {
    images.push_back(draw_panel(panel));
    tallest = std::max(tallest, images.back().rows);
  }
  for (auto& image : images)  // a tall legend column makes its panel taller: pad the others
    if (image.rows < tallest)
      cv::copyMakeBorder(image, image, 0, tallest - image.rows, 0, 0, cv::BORDER_CONSTANT,
                         cv::Scalar(255, 255, 255));
  cv::Mat joined;
  cv::hconcat(images, joined);
  std::vector<uchar> png;
  TORCH_CHECK(cv::imencode(".png", joined, png), "plot: PNG encoding failed for '", path, "'");
  write_file_atomically(path, std::string(png.begin(), png.end()));
}

}  // namespace posenc::train
