// Internal: the text drawing shared by the charts (src/train/plot.cpp) and the tool's heatmaps
// (src/cli/heatmap.cpp): one ink, one font, numbers to 3 significant digits.
#pragma once

#include <opencv2/imgproc.hpp>
#include <sstream>
#include <string>

namespace posenc::draw {

inline const cv::Scalar kInk(30, 30, 30);
constexpr int kFont = cv::FONT_HERSHEY_SIMPLEX;

/// 3 significant digits: 0.000123, 1.5, 1.23e+04.
inline std::string format_number(double v) {
  std::ostringstream out;
  out.precision(3);
  out << v;
  return out.str();
}

/// Text with its baseline at `at`; center: `at` is the middle of the text, not its left end.
inline void put_text(cv::Mat& image, const std::string& text, cv::Point at, double scale,
                     bool center = false) {
  if (center) {
    int baseline = 0;
    at.x -= cv::getTextSize(text, kFont, scale, 1, &baseline).width / 2;
  }
  cv::putText(image, text, at, kFont, scale, kInk, 1, cv::LINE_AA);
}

}  // namespace posenc::draw
