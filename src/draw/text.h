// Internal: the text drawing shared by the charts (src/train/line_chart.cpp) and the tool's
// heatmaps (src/draw/heatmap.cpp): one ink, one font, numbers to 3 significant digits.
#pragma once

#include <cmath>
#include <opencv2/imgproc.hpp>
#include <sstream>
#include <string>
#include <vector>

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

/// Round tick values inside [lo, hi]: multiples of a 1-2-5 step (..., 0.1, 0.2, 0.5, 1, 2, ...)
/// chosen so that about `count` of them fit (Heckbert's "nice numbers", Graphics Gems 1990).
/// Returns {step, ticks}; a value within a millionth of a step of 0 is exactly 0.
inline std::pair<double, std::vector<double>> nice_ticks(double lo, double hi, int count = 5) {
  if (!(hi > lo) || !std::isfinite(lo) || !std::isfinite(hi)) return {1.0, {lo}};
  const double raw = (hi - lo) / std::max(1, count - 1);
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  double step = 10 * magnitude;
  for (double m : {1.0, 2.0, 5.0}) {
    if (m * magnitude >= raw) {
      step = m * magnitude;
      break;
    }
  }
  std::vector<double> ticks;
  for (double k = std::ceil(lo / step - 1e-9); k * step <= hi + step * 1e-9; k += 1) {
    const double v = k * step;
    ticks.push_back(std::abs(v) < step * 1e-6 ? 0.0 : v);
  }
  return {step, ticks};
}

/// A tick label: as many decimals as the step needs (0.25 -> "0.25", 2000 -> "2000"), scientific
/// notation only for very large or small steps.
inline std::string format_tick(double v, double step) {
  std::ostringstream out;
  if (v == 0) return "0";
  if (step >= 1e-3 && step < 1e6) {
    const int decimals = std::max(0, static_cast<int>(std::ceil(-std::log10(step) - 1e-9)));
    out.setf(std::ios::fixed);
    out.precision(decimals);
  } else {
    out.precision(2);
  }
  out << v;
  return out.str();
}

/// Width in pixels of `text` at `scale`.
inline int text_width(const std::string& text, double scale) {
  int baseline = 0;
  return cv::getTextSize(text, kFont, scale, 1, &baseline).width;
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
