// forecast: predict the next `horizon` readings of a real series from its last `context` ones.
// The series keeps its real gaps (and optionally loses readings at random, drop_probability,
// simulating sensor loss), so consecutive readings are unevenly spaced. The model sees the
// context readings and, for the horizon, only *where* to predict:
//   positions = time:  (t_n - t_0) / time_unit  real elapsed time, gaps visible
//             = index: n                        the reading's index, gaps invisible
// Split by time: the first train_fraction of readings train, the rest evaluate (windows every
// eval_stride readings). Values are normalized with the training part's mean and std; the
// loss is MSE in normalized units; MAE is reported in the data's units, beside the persistence
// baseline (the last observed value repeated), mae_last. With center_windows (default true) each
// window's context mean is subtracted from its inputs and added back to the predictions (instance
// normalization, as RevIN, Kim et al. 2022), so a series that drifts past the training range
// (CO2's trend) is forecast relative to its recent level.
//
// Keys (task): file, time_column, value_column, context (48), horizon (12), positions (time |
//              index), time_unit (3600 s), drop_probability (0), train_fraction (0.8),
//              eval_stride (horizon), eval_batch (256), center_windows (true)
#include <torch/torch.h>

#include "common.h"
#include "tasks.h"
#include "timeseries/csv_series.h"

namespace posenc::train {
namespace {

class ForecastTask : public Task {
 public:
  explicit ForecastTask(const nlohmann::json& config, uint64_t seed) {
    ConfigReader task(config.at("task"), "task");
    task.allow("type");
    const auto file = resolve_data_path(task.string("file", ""));
    const auto time_column = task.string("time_column", "date");
    const auto value_column = task.string("value_column", "");
    context_ = task.integer("context", 48);
    horizon_ = task.integer("horizon", 12);
    const auto mode = task.string("positions", "time");
    time_unit_ = task.number("time_unit", 3600.0);
    const double drop = task.number("drop_probability", 0.0);
    const double train_fraction = task.number("train_fraction", 0.8);
    const int64_t stride = task.integer("eval_stride", horizon_);
    eval_batch_ = task.integer("eval_batch", 256);
    center_ = task.boolean("center_windows", true);
    task.finish();
    TORCH_CHECK(!file.empty() && !value_column.empty(),
                "task: 'file' and 'value_column' are required for forecast");
    TORCH_CHECK(mode == "time" || mode == "index",
                "task: positions must be 'time' or 'index', got '", mode, "'");
    TORCH_CHECK(context_ <= kMaxContextTokens && horizon_ <= kMaxContextTokens - context_,
                "task: context + horizon is ", context_, " + ", horizon_,
                " tokens; the context limit is ", kMaxContextTokens);
    TORCH_CHECK(context_ > 0 && horizon_ > 0 && stride > 0 && time_unit_ > 0,
                "task: context, horizon, eval_stride and time_unit must be > 0");
    TORCH_CHECK(train_fraction > 0 && train_fraction < 1,
                "task: train_fraction must be in (0, 1), got ", train_fraction);
    use_time_ = mode == "time";

    auto series =
        timeseries::load_csv(file, time_column, {value_column}, timeseries::OrderPolicy::kSort,
                             timeseries::MissingPolicy::kDropRow);
    if (drop > 0) {
      torch::manual_seed(seed);  // the same readings are lost in every run of this config
      series = timeseries::drop_readings(series, drop);
    }
    const int64_t n = series.times.size(0);
    const int64_t split = static_cast<int64_t>(static_cast<double>(n) * train_fraction);
    const int64_t window = context_ + horizon_;
    TORCH_CHECK(split >= window && n - split >= window, "task: ", file, " has ", n,
                " readings; both parts of the split need a window of ", window);
    timeseries::Series train_part{series.times.narrow(0, 0, split),
                                  series.values.narrow(0, 0, split), series.columns};
    stats_ = timeseries::fit_normalization(train_part);
    auto normalized = timeseries::normalize(series, stats_);
    times_ = normalized.times;
    values_ = normalized.values;  // [N, 1]
    train_starts_ = torch::arange(split - window + 1, torch::kLong);
    eval_starts_ = torch::arange(split, n - window + 1, stride, torch::kLong);

    ConfigReader model(config.at("model"), "model");
    auto t = transformer_options(model);
    model.finish();
    model_ = Forecaster(ForecasterOptions(1, t), encoder_from(config, "encoder", t));
    auto observed = torch::zeros({window}, torch::kBool);
    observed.narrow(0, 0, context_).fill_(true);
    observed_ = observed;
  }

  std::shared_ptr<torch::nn::Module> model() override { return model_.ptr(); }
  int64_t train_size() const override { return train_starts_.size(0); }
  std::string metric_name() const override { return "mae"; }

  at::Tensor train_loss(const at::Tensor& indices, double* metric) override {
    auto [prediction, target] = predict(train_starts_.index_select(0, indices));
    *metric = std::numeric_limits<double>::quiet_NaN();
    return torch::mse_loss(prediction, target);
  }

  Metrics evaluate() override {
    double squared = 0, absolute = 0, persistence = 0;
    const int64_t count = eval_starts_.size(0);
    const double scale = stats_.std[0].item<double>();
    for (int64_t begin = 0, batch = 0; begin < count; begin += eval_batch_, ++batch) {
      if (!ranks_.mine(batch)) continue;
      auto starts = eval_starts_.narrow(0, begin, std::min(eval_batch_, count - begin));
      auto [prediction, target] = predict(starts);
      auto last = on_device(window_values(starts)).select(1, context_ - 1).unsqueeze(1);  // [b,1,1]
      squared += (prediction - target).pow(2).sum().item<double>();
      absolute += (prediction - target).abs().sum().item<double>();
      persistence += (last - target).abs().sum().item<double>();
    }
    const auto sums = ranks_.total({squared, absolute, persistence});
    squared = sums[0];
    absolute = sums[1];
    persistence = sums[2];
    const double values = static_cast<double>(count * horizon_);
    return {{"loss", squared / values},
            {"mae", absolute / values * scale},
            {"mae_last", persistence / values * scale}};
  }

 private:
  at::Tensor window_index(const at::Tensor& starts) const {
    return starts.view({-1, 1}) + torch::arange(context_ + horizon_, torch::kLong);  // [b, W]
  }
  at::Tensor window_values(const at::Tensor& starts) const {
    auto index = window_index(starts);
    return values_.index_select(0, index.flatten()).view({index.size(0), index.size(1), -1});
  }

  // -> (prediction, target) over the horizon, [b, horizon, 1] each, normalized units.
  std::pair<at::Tensor, at::Tensor> predict(const at::Tensor& starts) {
    auto index = window_index(starts);
    const int64_t b = index.size(0), w = index.size(1);
    auto values = on_device(window_values(starts));
    Positions positions = Positions::sequence(w, 0.0, "time");
    if (use_time_) {
      auto times = times_.index_select(0, index.flatten()).view({b, w});
      auto elapsed = (times - times.select(1, 0).unsqueeze(1)) / time_unit_;  // float64
      positions = Positions(elapsed.unsqueeze(-1), {"time"});
    }
    auto level = center_ ? values.narrow(1, 0, context_).mean(1, true)  // [b, 1, C]
                         : torch::zeros({b, 1, values.size(2)}, values.options());
    auto prediction =
        model_(values - level, on_device(observed_).expand({b, w}), positions) + level;
    return {prediction.narrow(1, context_, horizon_), values.narrow(1, context_, horizon_)};
  }

  int64_t context_, horizon_, eval_batch_;
  double time_unit_;
  bool use_time_, center_;
  timeseries::Normalization stats_;
  at::Tensor times_, values_, train_starts_, eval_starts_, observed_;
  Forecaster model_{nullptr};
};

}  // namespace

std::unique_ptr<Task> make_forecast(const nlohmann::json& config) {
  const uint64_t seed = config.value("seed", uint64_t{0});
  return std::make_unique<ForecastTask>(config, seed);
}

}  // namespace posenc::train
