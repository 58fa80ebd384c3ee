// Progress bar and clock text; see progress.h.
#include "progress.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <iomanip>
#include <iostream>
#include <sstream>

namespace posenc::train {

std::string clock_text(double seconds) {
  const auto total = static_cast<int64_t>(std::max(0.0, seconds));
  std::ostringstream out;
  if (total >= 3600) out << total / 3600 << ":" << std::setw(2) << std::setfill('0');
  out << (total / 60) % 60 << ":" << std::setw(2) << std::setfill('0') << total % 60;
  return out.str();
}

void ProgressBar::update(int64_t step, int64_t epoch, int64_t epochs, double loss, double metric,
                         const std::string& metric_name) {
  if (quiet_) return;
  const double seconds = elapsed();
  const auto now_decile = (step * 10) / std::max<int64_t>(1, total_);
  if (!tty_ && now_decile == last_decile_ && step != total_) return;
  if (tty_ && seconds - last_draw_ < 0.2 && step != total_) return;
  last_decile_ = now_decile;
  last_draw_ = seconds;
  const double rate = static_cast<double>(step - start_) / std::max(1e-9, seconds);
  const double eta = static_cast<double>(total_ - step) / std::max(1e-9, rate);
  constexpr int kCells = 24;
  const int filled = static_cast<int>(kCells * step / std::max<int64_t>(1, total_));
  std::ostringstream line;
  line << name_ << " epoch " << epoch + 1 << "/" << epochs << " [" << std::string(filled, '#')
       << std::string(kCells - filled, '.') << "] " << step << "/" << total_ << " " << std::fixed
       << std::setprecision(1) << rate << " it/s ETA " << clock_text(eta) << " loss "
       << std::setprecision(4) << loss;
  if (std::isfinite(metric)) line << " " << metric_name << " " << std::setprecision(3) << metric;
  if (tty_) {
    std::cerr << "\r" << line.str() << "\033[K" << std::flush;
  } else {
    std::cerr << line.str() << "\n";
  }
}
void ProgressBar::message(const std::string& text) {
  if (quiet_) return;
  if (tty_) std::cerr << "\r\033[K";
  std::cerr << text << "\n";
}
void ProgressBar::finish() {
  if (!quiet_ && tty_) std::cerr << "\n";
}

double ProgressBar::elapsed() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - begin_).count();
}

}  // namespace posenc::train
