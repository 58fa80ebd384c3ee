// The encoder interface's entry points, each through a plan (include/posenc/core/encoder.h).
#include "posenc/core/encoder.h"

#include <torch/torch.h>

namespace posenc {

EncodingPlan PositionalEncodingImpl::plan(const PlanRequest& request) {
  EncodingPlan plan(request);
  contribute(plan, request);
  return plan;
}

at::Tensor PositionalEncodingImpl::add(const at::Tensor& x, const Positions& positions) {
  PlanRequest request(positions);
  request.device = x.device();  // the table built where x is, not in host memory and copied
  auto p = plan(request);
  const auto& rows = p.prefix_embedding();
  return p.apply_additive(x, rows.defined() ? rows.size(0) : 0);
}

std::pair<at::Tensor, at::Tensor> PositionalEncodingImpl::rotate(const at::Tensor& q,
                                                                 const at::Tensor& k,
                                                                 const Positions& q_positions,
                                                                 const Positions& k_positions) {
  return plan(PlanRequest{q_positions, k_positions, k_positions, q.device()}).apply_rotary(q, k);
}

at::Tensor PositionalEncodingImpl::bias(const Positions& q_positions, const Positions& k_positions,
                                        const at::Tensor& q, int64_t heads) {
  PlanRequest request{q_positions, k_positions, k_positions};
  if (q.defined()) request.device = q.device();
  return plan(request).materialize_bias(heads, q);
}

Description PositionalEncodingImpl::describe(const Positions& /*positions*/,
                                             const DescribeOptions& /*options*/) {
  return {};
}

Restore PositionalEncodingImpl::adapt(const Extent& /*extent*/) {
  return [] {};
}

}  // namespace posenc
