// Factorized space-time learned tables; see posenc/encoders/learned_spacetime.h.
#include "posenc/encoders/learned_spacetime.h"

#include <torch/torch.h>

#include "posenc/encoders/sinusoidal.h"

namespace posenc {

LearnedSpacetimeImpl::LearnedSpacetimeImpl(LearnedSpacetimeOptions options_)
    : options(std::move(options_)) {
  reset();
}

void LearnedSpacetimeImpl::reset() {
  TORCH_CHECK(options.frames() > 0 && options.grid_height() > 0 && options.grid_width() > 0,
              "learned_spacetime: frames and grid must be positive, got ", options.frames(), " x ",
              options.grid_height(), "x", options.grid_width());
  TORCH_CHECK(options.dim() > 0, "learned_spacetime: dim must be positive, got ", options.dim());
  spatial = register_parameter(
      "spatial", torch::randn({options.grid_height() * options.grid_width(), options.dim()}) *
                     options.init_std());
  temporal = register_parameter(
      "temporal", torch::randn({options.frames(), options.dim()}) * options.init_std());
}

at::Tensor LearnedSpacetimeImpl::lookup(const Positions& positions) const {
  positions.check_num_axes("learned_spacetime", 3);
  TORCH_CHECK(!positions.batched(), "learned_spacetime: batched positions are not supported");
  const auto& c = positions.coords();
  TORCH_CHECK(at::equal(c, c.round()), "learned_spacetime: positions must be integers");
  auto t = c.select(1, 0).to(torch::kLong), h = c.select(1, 1).to(torch::kLong),
       w = c.select(1, 2).to(torch::kLong);
  if (c.size(0) > 0) {
    TORCH_CHECK(c.min().item<double>() >= 0, "learned_spacetime: positions must be >= 0");
    TORCH_CHECK(t.max().item<int64_t>() < options.frames(), "learned_spacetime: frame ",
                t.max().item<int64_t>(), " is past the temporal table (frames=", options.frames(),
                ")");
    TORCH_CHECK(h.max().item<int64_t>() < options.grid_height() &&
                    w.max().item<int64_t>() < options.grid_width(),
                "learned_spacetime: patch (", h.max().item<int64_t>(), ", ",
                w.max().item<int64_t>(), ") is outside the ", options.grid_height(), "x",
                options.grid_width(), " spatial table");
  }
  const auto device = spatial.device();  // the positions may be on the host
  return spatial.index_select(0, (h * options.grid_width() + w).to(device)) +
         temporal.index_select(0, t.to(device));
}

void LearnedSpacetimeImpl::contribute(EncodingPlan& plan, const PlanRequest& request) {
  plan.add_embedding(type(), lookup(request.queries));
}

Description LearnedSpacetimeImpl::describe(const Positions& positions, const DescribeOptions&) {
  return {{"table", lookup(positions).detach()}};
}

}  // namespace posenc
