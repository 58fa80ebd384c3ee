// Line charts with OpenCV; see posenc/train/plot.h.
#include "posenc/train/plot.h"

#include <c10/util/Exception.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#include <sstream>

#include "../draw/text.h"

namespace posenc::train {
namespace {

constexpr int kWidth = 520, kHeight = 380, kLeft = 70, kRight = 20, kTop = 40, kBottom = 50;
const cv::Scalar kGrid(225, 225, 225);
using draw::format_number;
using draw::kInk;
using draw::put_text;
// Tableau-like colours (BGR).
const std::vector<cv::Scalar> kColours = {{180, 119, 31},  {14, 127, 255},  {44, 160, 44},
                                          {40, 39, 214},   {189, 103, 148}, {75, 86, 140},
                                          {194, 119, 227}, {127, 127, 127}, {34, 189, 188}};

cv::Mat draw_panel(const Panel& panel) {
  cv::Mat image(kHeight, kWidth, CV_8UC3, cv::Scalar(255, 255, 255));
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
  const double pad = 0.05 * (y1 - y0);
  y0 -= pad;
  y1 += pad;
  const int w = kWidth - kLeft - kRight, h = kHeight - kTop - kBottom;
  auto px = [&](double x) { return kLeft + static_cast<int>((fx(x) - x0) / (x1 - x0) * w); };
  auto py = [&](double y) { return kTop + h - static_cast<int>((y - y0) / (y1 - y0) * h); };
  for (int i = 0; i <= 4; ++i) {
    const double y = y0 + (y1 - y0) * i / 4.0;
    cv::line(image, {kLeft, py(y)}, {kLeft + w, py(y)}, kGrid, 1);
    put_text(image, format_number(y), {4, py(y) + 4}, 0.42);
    const double xv = x0 + (x1 - x0) * i / 4.0;
    const double label = panel.log_x ? std::exp2(xv) : xv;
    const int at = kLeft + static_cast<int>((xv - x0) / (x1 - x0) * w);
    put_text(image, format_number(label), {at, kTop + h + 16}, 0.42, true);
  }
  cv::rectangle(image, {kLeft, kTop}, {kLeft + w, kTop + h}, kInk, 1);
  put_text(image, panel.x_label, {kLeft + w / 2, kHeight - 10}, 0.45, true);
  put_text(image, panel.y_label, {kLeft + 4, kTop - 6}, 0.42);
  for (size_t k = 0; k < panel.series.size(); ++k) {
    const auto& s = panel.series[k];
    const auto colour = kColours[k % kColours.size()];
    std::vector<cv::Point> points;
    for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
      if (std::isfinite(s.y[i])) points.emplace_back(px(s.x[i]), py(s.y[i]));
    }
    if (points.size() > 1) cv::polylines(image, points, false, colour, 2, cv::LINE_AA);
    for (const auto& p : points) cv::circle(image, p, points.size() < 30 ? 3 : 1, colour, -1);
    const int ly = kTop + 14 + 16 * static_cast<int>(k);
    cv::line(image, {kLeft + w - 150, ly - 4}, {kLeft + w - 130, ly - 4}, colour, 2);
    put_text(image, s.name, {kLeft + w - 125, ly}, 0.42);
  }
  return image;
}

}  // namespace

namespace {
std::string folder_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}
}  // namespace

void write_file_atomically(const std::string& path, const std::string& contents,
                           const std::string& keep_previous) {
  struct stat info {};
  if (::lstat(path.c_str(), &info) == 0) {
    TORCH_CHECK(S_ISREG(info.st_mode), "'", path,
                "' exists and is not a regular file (a link, FIFO, device or folder); refusing to "
                "replace it");
  }
  const std::string temp = path + ".tmp";
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  TORCH_CHECK(fd >= 0, "cannot write '", temp, "': ", std::strerror(errno));
  const char* data = contents.data();
  size_t left = contents.size();
  int error = 0;
  while (left > 0 && error == 0) {
    const ssize_t written = ::write(fd, data, left);
    if (written < 0 && errno == EINTR) continue;
    if (written <= 0) {
      error = written < 0 ? errno : EIO;
      break;
    }
    data += written;
    left -= static_cast<size_t>(written);
  }
  if (error == 0 && ::fsync(fd) != 0) error = errno;
  if (::close(fd) != 0 && error == 0) error = errno;
  if (error != 0) {
    ::unlink(temp.c_str());
    TORCH_CHECK(false, "cannot write '", path, "': ", std::strerror(error));
  }
  if (!keep_previous.empty() && ::lstat(path.c_str(), &info) == 0) {
    ::unlink(keep_previous.c_str());
    if (::link(path.c_str(), keep_previous.c_str()) != 0) {
      const int why = errno;
      ::unlink(temp.c_str());
      TORCH_CHECK(false, "cannot keep '", path, "' as '", keep_previous, "': ", std::strerror(why));
    }
  }
  if (std::rename(temp.c_str(), path.c_str()) != 0) {
    const int why = errno;
    ::unlink(temp.c_str());
    TORCH_CHECK(false, "cannot move '", temp, "' to '", path, "': ", std::strerror(why));
  }
  const int dir = ::open(folder_of(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {  // the rename is durable once the folder is
    ::fsync(dir);
    ::close(dir);
  }
}

void plot_panels(const std::string& path, const std::vector<Panel>& panels) {
  TORCH_CHECK(!panels.empty(), "plot: no panels for '", path, "'");
  std::vector<cv::Mat> images;
  for (const auto& panel : panels) images.push_back(draw_panel(panel));
  cv::Mat joined;
  cv::hconcat(images, joined);
  std::vector<uchar> png;
  TORCH_CHECK(cv::imencode(".png", joined, png), "plot: PNG encoding failed for '", path, "'");
  write_file_atomically(path, std::string(png.begin(), png.end()));
}

}  // namespace posenc::train
