// Encoders for real timestamps (positions on one axis, float64 seconds; gaps kept, never rounded
// to indices; the origin is subtracted in float64 before any other arithmetic, so epoch seconds
// lose nothing):
//   time_sinusoidal  x + [sin(omega_i (t - t0)), cos(omega_i (t - t0))], periods log-spaced over
//                    [t_min, t_max] (posenc/functional/time.h); interleaved or concat layout
//   time2vec         x + [w_0 tau + phi_0, sin(w_i tau + phi_i)], tau = (t - t0) / time_scale,
//                    w and phi learned (Kazemi et al. 2019, "Time2Vec")
//   calendar         x + W f(t), f the Informer calendar features of UTC time (hour, weekday,
//                    day, day of year, month, ...), W a learned [F -> D] map without bias, as
//                    Informer's TimeFeatureEmbedding (Zhou et al. 2021)
// Rotary and ALiBi encodings over real time are `rope` (with min_period / max_period) and `alibi`
// (with slope_scale per second) on timestamp positions.
#pragma once

#include <torch/arg.h>
#include <torch/nn/modules/linear.h>

#include "posenc/core/encoder.h"
#include "posenc/functional/sinusoidal.h"

namespace posenc {

struct TimeSinusoidalOptions {
  explicit TimeSinusoidalOptions(int64_t dim = 64) : dim_(dim) {}
  /// Embedding width D (even). From the model.
  TORCH_ARG(int64_t, dim);
  /// Shortest period, in the timestamps' unit (default 1).
  TORCH_ARG(double, t_min) = 1.0;
  /// Longest period (default 10000).
  TORCH_ARG(double, t_max) = 10000.0;
  /// Origin t0 subtracted first (default 0).
  TORCH_ARG(double, origin) = 0.0;
  /// kInterleaved (default) or kConcat.
  TORCH_ARG(SinusoidalLayout, layout) = SinusoidalLayout::kInterleaved;
};

class TimeSinusoidalImpl : public PositionalEncodingImpl {
 public:
  explicit TimeSinusoidalImpl(TimeSinusoidalOptions options = TimeSinusoidalOptions());
  void reset();
  std::string type() const override { return "time_sinusoidal"; }
  void contribute(EncodingPlan& plan, const PlanRequest& request) override;
  /// [N, D] or [B, N, D] float64.
  at::Tensor table(const Positions& positions) const;
  Description describe(const Positions& positions, const DescribeOptions& options) override;

  TimeSinusoidalOptions options;
};
TORCH_MODULE(TimeSinusoidal);

struct Time2VecOptions {
  explicit Time2VecOptions(int64_t dim = 64) : dim_(dim) {}
  /// Embedding width D (>= 2). From the model.
  TORCH_ARG(int64_t, dim);
  /// Origin t0 (default 0).
  TORCH_ARG(double, origin) = 0.0;
  /// tau = (t - t0) / time_scale (default 1).
  TORCH_ARG(double, time_scale) = 1.0;
};

class Time2VecImpl : public PositionalEncodingImpl {
 public:
  explicit Time2VecImpl(Time2VecOptions options = Time2VecOptions());
  void reset();
  std::string type() const override { return "time2vec"; }
  void contribute(EncodingPlan& plan, const PlanRequest& request) override;
  /// [N, D] or [B, N, D] float32, differentiable in omega and phi.
  at::Tensor encode(const Positions& positions) const;
  Description describe(const Positions& positions, const DescribeOptions& options) override;

  Time2VecOptions options;
  torch::Tensor omega, phi;  ///< [D] each
};
TORCH_MODULE(Time2Vec);

struct CalendarOptions {
  explicit CalendarOptions(int64_t dim = 64) : dim_(dim) {}
  /// Embedding width D. From the model.
  TORCH_ARG(int64_t, dim);
  /// Features (default hour, weekday, day, yearday, month: Informer's "h" frequency set).
  TORCH_ARG(std::vector<std::string>, features) = std::vector<std::string>{"hour", "weekday", "day",
                                                                           "yearday", "month"};
};

class CalendarImpl : public PositionalEncodingImpl {
 public:
  explicit CalendarImpl(CalendarOptions options = CalendarOptions());
  void reset();
  std::string type() const override { return "calendar"; }
  void contribute(EncodingPlan& plan, const PlanRequest& request) override;
  /// The raw features [N, F] or [B, N, F] (float64).
  at::Tensor features(const Positions& positions) const;
  Description describe(const Positions& positions, const DescribeOptions& options) override;

  CalendarOptions options;
  torch::nn::Linear projection{nullptr};
};
TORCH_MODULE(Calendar);

}  // namespace posenc
