// Training logs: metrics.csv rows (kept across --resume) and the comparison report of
// `posenc compare` (results.md, results.csv, results.png). Internal to the trainer.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "posenc/train/trainer.h"

namespace posenc::train {

using LogRow = std::vector<std::pair<std::string, double>>;

class TrainingLog {
 public:
  TrainingLog() = default;
  void add(const LogRow& row);
  /// The values of one column over the rows (NaN where a row has none).
  std::vector<double> column(const std::string& name) const;
  /// CSV with a header; missing values are empty cells. Written atomically.
  void write_csv(const std::string& path) const;
  /// Reads rows back, keeping those with step <= max_step (a resumed run rewrites the rest).
  void read_csv(const std::string& path, int64_t max_step);

 private:
  std::vector<std::string> columns_;
  std::vector<LogRow> rows_;
};

}  // namespace posenc::train
