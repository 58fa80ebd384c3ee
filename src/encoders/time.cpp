// Timestamp encoders; contracts in posenc/encoders/time.h.
#include "posenc/encoders/time.h"

#include <torch/torch.h>

#include <cmath>

#include "posenc/encoders/sinusoidal.h"
#include "posenc/functional/time.h"

namespace posenc {

// ---- time_sinusoidal ----------------------------------------------------------------------------

TimeSinusoidalImpl::TimeSinusoidalImpl(TimeSinusoidalOptions options_)
    : options(std::move(options_)) {
  reset();
}

void TimeSinusoidalImpl::reset() {
  TORCH_CHECK(options.dim() > 0 && options.dim() % 2 == 0,
              "time_sinusoidal: dim must be positive and even, got ", options.dim());
  time_periods(options.t_min(), options.t_max(), options.dim() / 2);  // validates the range
  TORCH_CHECK(std::isfinite(options.origin()), "time_sinusoidal: origin must be finite");
}

at::Tensor TimeSinusoidalImpl::table(const Positions& positions) const {
  positions.check_num_axes("time_sinusoidal", 1);
  auto omega = 2 * M_PI /
               time_periods(options.t_min(), options.t_max(), options.dim() / 2)
                   .to(positions.coords().device());
  auto angles = (positions.axis(0).to(torch::kFloat64) - options.origin()).unsqueeze(-1) * omega;
  if (options.layout() == SinusoidalLayout::kConcat)
    return torch::cat({angles.sin(), angles.cos()}, -1);
  return torch::stack({angles.sin(), angles.cos()}, -1).flatten(-2);
}

void TimeSinusoidalImpl::contribute(EncodingPlan& plan, const PlanRequest& request) {
  plan.add_embedding(type(), table(request.queries).to(request.device));
}

Description TimeSinusoidalImpl::describe(const Positions& positions, const DescribeOptions&) {
  return {{"periods", time_periods(options.t_min(), options.t_max(), options.dim() / 2)},
          {"table", table(positions)}};
}

// ---- time2vec
// -------------------------------------------------------------------------------------

Time2VecImpl::Time2VecImpl(Time2VecOptions options_) : options(std::move(options_)) { reset(); }

void Time2VecImpl::reset() {
  TORCH_CHECK(options.dim() >= 2, "time2vec: dim must be >= 2, got ", options.dim());
  TORCH_CHECK(options.time_scale() > 0, "time2vec: time_scale must be positive, got ",
              options.time_scale());
  omega = register_parameter("omega", torch::randn({options.dim()}));
  phi = register_parameter("phi", torch::rand({options.dim()}) * 2 * M_PI);
}

at::Tensor Time2VecImpl::encode(const Positions& positions) const {
  positions.check_num_axes("time2vec", 1);
  // tau in float64 from the raw timestamps, then float32 for the learned part
  auto tau = ((positions.axis(0).to(torch::kFloat64) - options.origin()) / options.time_scale())
                 .to(omega.device(), omega.scalar_type())  // positions may be on the host
                 .unsqueeze(-1);
  auto z = tau * omega + phi;  // [.., N, D]
  return torch::cat({z.narrow(-1, 0, 1), z.narrow(-1, 1, options.dim() - 1).sin()}, -1);
}

void Time2VecImpl::contribute(EncodingPlan& plan, const PlanRequest& request) {
  plan.add_embedding(type(), encode(request.queries));
}

Description Time2VecImpl::describe(const Positions& positions, const DescribeOptions&) {
  return {{"table", encode(positions).detach()}};
}

// ---- calendar ---------------------------------------------------------------------------------

CalendarImpl::CalendarImpl(CalendarOptions options_) : options(std::move(options_)) { reset(); }

void CalendarImpl::reset() {
  TORCH_CHECK(options.dim() > 0, "calendar: dim must be positive, got ", options.dim());
  calendar_features(torch::zeros({1}, torch::kFloat64), options.features());  // validates names
  projection = register_module(
      "projection",
      torch::nn::Linear(
          torch::nn::LinearOptions(static_cast<int64_t>(options.features().size()), options.dim())
              .bias(false)));
}

at::Tensor CalendarImpl::features(const Positions& positions) const {
  positions.check_num_axes("calendar", 1);
  return calendar_features(positions.axis(0), options.features());
}

void CalendarImpl::contribute(EncodingPlan& plan, const PlanRequest& request) {
  auto f = features(request.queries).to(projection->weight.options());
  plan.add_embedding(type(), projection->forward(f));
}

Description CalendarImpl::describe(const Positions& positions, const DescribeOptions&) {
  auto f = features(positions);
  return {{"features", f},
          {"table", projection->forward(f.to(projection->weight.scalar_type())).detach()}};
}

}  // namespace posenc
