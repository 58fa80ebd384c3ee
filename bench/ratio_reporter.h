// Google Benchmark reporter shared by the benches: prints the usual console table, keeps each
// case's real time, and at the end prints a markdown table of ratios between cases run in this
// same process (so both sides of a ratio saw the same machine state). With
// --benchmark_repetitions=R a case's time is the median of its R runs (on a shared machine, add
// --benchmark_enable_random_interleaving=true so every case sees the same mix of load).
#pragma once

#include <benchmark/benchmark.h>

#include <algorithm>
#include <functional>
#include <iomanip>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "posenc/kernels/cpu_capability.h"

namespace posenc::bench {

class RatioReporter : public benchmark::ConsoleReporter {
 public:
  /// `ratios` is called at the end with this reporter; it calls row() for each line.
  explicit RatioReporter(std::function<void(RatioReporter&)> ratios) : ratios_(std::move(ratios)) {}

  void ReportRuns(const std::vector<Run>& runs) override {
    for (const auto& run : runs)
      if (run.run_type == Run::RT_Iteration)
        times_[run.benchmark_name()].push_back(run.GetAdjustedRealTime());
    ConsoleReporter::ReportRuns(runs);
  }

  void Finalize() override {
    ConsoleReporter::Finalize();
    // the fused CPU kernels' level (POSENC_CPU_CAPABILITY=scalar|avx2|avx512 chooses one)
    std::cout << "\nCPU kernels: " << posenc::cpu_capability_description() << "\n";
    std::cout << "\n| ratio (same process) | value | goal |\n|---|---|---|\n";
    ratios_(*this);
  }

  /// Real time of the first case whose name starts with `prefix`, the median of its repetitions
  /// (the upper one of an even count; 0 when none ran).
  double time(const std::string& prefix) const {
    for (const auto& [name, values] : times_)
      if (name.rfind(prefix, 0) == 0) {
        std::vector<double> sorted = values;
        std::sort(sorted.begin(), sorted.end());
        return sorted[sorted.size() / 2];
      }
    return 0.0;
  }

  /// A share as a percentage.
  void percent(const std::string& what, double share, const std::string& goal) const {
    std::cout << "| " << std::left << std::setw(48) << what << " | " << std::right << std::fixed
              << std::setprecision(3) << std::setw(6) << 100.0 * share << "% | " << goal << " |\n";
  }

  /// A plain number with its unit (GB/s).
  void value(const std::string& what, double number, const std::string& unit) const {
    std::cout << "| " << std::left << std::setw(48) << what << " | " << std::right << std::fixed
              << std::setprecision(2) << std::setw(6) << number << " " << unit << " | |\n";
  }

  void row(const std::string& what, double ratio, const std::string& goal) const {
    std::cout << "| " << std::left << std::setw(48) << what << " | " << std::right << std::fixed
              << std::setprecision(2) << std::setw(6) << ratio << "x | " << goal << " |\n";
  }

 private:
  std::function<void(RatioReporter&)> ratios_;
  std::map<std::string, std::vector<double>> times_;
};

/// Runs the registered benchmarks with a RatioReporter.
inline int run_with_ratios(int argc, char** argv, std::function<void(RatioReporter&)> ratios) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  RatioReporter reporter(std::move(ratios));
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}

}  // namespace posenc::bench
