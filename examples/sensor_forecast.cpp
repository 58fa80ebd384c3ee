// Example (a time-series user): forecasting a timestamped sensor CSV with positions in real time.
// Seattle's hourly temperatures (vega-datasets, unpacked by scripts/setup.sh) are read with their
// timestamps; 20% of the readings are dropped at random (sensor loss), so consecutive readings
// are unevenly spaced. The forecaster sees 24 readings and predicts the next 6 from *when* they
// are: positions are elapsed hours since the window's first reading, not reading indices.
// Three encoders of real time through one interface: time_sinusoidal (additive, periods from
// 1 hour to a week), calendar (hour-of-day / day-of-week features of the absolute timestamp) and
// RoPE over time (rotary, periods 1 hour .. 1 week).
//
//   ./build/examples/example_sensor_forecast [STEPS] [CSV]
#include <torch/torch.h>

#include <iomanip>
#include <iostream>

#include "posenc/posenc.h"
#include "timeseries/csv_series.h"

using namespace posenc;

namespace {

constexpr int64_t kContext = 24, kHorizon = 6, kWindow = kContext + kHorizon, kDim = 32;

struct Windows {
  at::Tensor values;  ///< [B, W, 1] normalized
  at::Tensor hours;   ///< [B, W] float64: hours since the window's first reading
  at::Tensor epoch;   ///< [B, W] float64: absolute UTC seconds (for calendar features)
};

Windows windows(const timeseries::Series& s, const at::Tensor& starts) {
  auto index = starts.view({-1, 1}) + torch::arange(kWindow, torch::kLong);
  auto times = s.times.index_select(0, index.flatten()).view(index.sizes());
  auto values = s.values.index_select(0, index.flatten()).view({index.size(0), kWindow, 1});
  return {values, (times - times.select(1, 0).unsqueeze(1)) / 3600.0, times};
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t steps = argc > 1 ? std::stoll(argv[1]) : 400;
  const std::string csv =
      argc > 2 ? argv[2]
               : std::string(getenv("HOME")) + "/.cache/posenc/data/vega/seattle-temps.csv";
  use_all_cores();
  torch::manual_seed(0);
  auto series = timeseries::load_csv(csv, "date", {"temp"});
  series = timeseries::drop_readings(series, 0.2);  // sensor loss: real gaps
  const int64_t n = series.times.size(0), split = n * 4 / 5;
  timeseries::Series train_part{series.times.narrow(0, 0, split), series.values.narrow(0, 0, split),
                                series.columns};
  const auto stats = timeseries::fit_normalization(train_part);
  series = timeseries::normalize(series, stats);
  auto train_starts = torch::arange(split - kWindow + 1, torch::kLong);
  auto test_starts = torch::arange(split, n - kWindow + 1, kHorizon, torch::kLong);
  auto observed = torch::arange(kWindow).lt(kContext);  // [W] true for the context

  std::vector<std::pair<std::string, PositionalEncoding>> encoders{
      {"time_sinusoidal",
       as_encoding(TimeSinusoidal(TimeSinusoidalOptions(kDim).t_min(1).t_max(168)))},
      {"calendar", as_encoding(Calendar(CalendarOptions(kDim)))},
      {"rope_time", as_encoding(Rope(RopeOptions(kDim / 2).frequencies(
                        RopeFrequencyOptions::periods(1, 168))))}};
  for (auto& [name, encoder] : encoders) {
    torch::manual_seed(0);
    Forecaster model(ForecasterOptions(1, TransformerOptions(kDim, 2, 2).mlp_ratio(2)), encoder);
    torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(3e-3));
    // calendar reads absolute timestamps (hour of day); the others elapsed hours
    auto positions_of = [&name](const Windows& w) {
      const auto& t = name == "calendar" ? w.epoch : w.hours;
      return Positions(t.unsqueeze(-1), {"time"});
    };
    for (int64_t step = 0; step < steps; ++step) {
      auto pick = torch::randint(train_starts.size(0), {64}, torch::kLong);
      auto w = windows(series, train_starts.index_select(0, pick));
      auto prediction = model(w.values, observed.expand({64, kWindow}), positions_of(w));
      auto loss = torch::mse_loss(prediction.narrow(1, kContext, kHorizon),
                                  w.values.narrow(1, kContext, kHorizon));
      optimizer.zero_grad();
      loss.backward();
      optimizer.step();
    }
    torch::NoGradGuard no_grad;
    model->eval();
    auto w = windows(series, test_starts);
    const int64_t b = test_starts.size(0);
    auto prediction = model(w.values, observed.expand({b, kWindow}), positions_of(w));
    auto target = w.values.narrow(1, kContext, kHorizon);
    const double scale = stats.std[0].item<double>();
    const double mae =
        (prediction.narrow(1, kContext, kHorizon) - target).abs().mean().item<double>() * scale;
    const double last =
        (w.values.select(1, kContext - 1).unsqueeze(1) - target).abs().mean().item<double>() *
        scale;
    std::cout << std::left << std::setw(16) << name << " after " << steps << " steps: MAE "
              << std::fixed << std::setprecision(2) << mae << " degF over the next " << kHorizon
              << " readings (repeating the last reading: " << last << ")\n";
  }
  return 0;
}
