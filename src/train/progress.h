// Progress on stderr: a one-line bar (redrawn in place on a terminal, a line every 10% else)
// and h:mm:ss clock text. Internal to the trainer.
#pragma once

#include <chrono>
#include <string>

namespace posenc::train {

/// Seconds as [h:]mm:ss.
std::string clock_text(double seconds);

// A one-line progress bar on stderr (redrawn in place on a terminal, a line every 10% else).
class ProgressBar {
 public:
  ProgressBar(std::string name, int64_t total, int64_t start, bool quiet)
      : name_(std::move(name)),
        total_(total),
        start_(start),
        quiet_(quiet),
        tty_(isatty(fileno(stderr)) != 0),
        begin_(std::chrono::steady_clock::now()) {}

  void update(int64_t step, int64_t epoch, int64_t epochs, double loss, double metric,
              const std::string& metric_name);
  void message(const std::string& text);
  void finish();

 private:
  double elapsed() const;
  std::string name_;
  int64_t total_, start_;
  bool quiet_, tty_;
  std::chrono::steady_clock::time_point begin_;
  int64_t last_decile_ = -1;
  double last_draw_ = -1;
};

}  // namespace posenc::train
