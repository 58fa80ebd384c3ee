// Autograd for a linear layer and for the MLP linear -> GELU -> linear as one node each; the
// math, what they save and their contract in include/posenc/kernels/linear.h. The products are
// posenc's own (kernels/cpu/linear_gemm.h: the bias as the forward's start, dx written, db with
// dW over the same chunks of dy) where this CPU level has them and they take the output width,
// else ATen's (at::addmm_out, at::mm: MKL's sgemm on CPU; the bias-gradient ATen's sum over rows,
// as AddmmBackward's); under create_graph ATen's differentiable ops. The GELU passes are posenc's
// (posenc/kernels/gelu.h).
#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include <cstring>

#include "../cpu/linear_gemm_cpu.h"
#include "posenc/kernels/gelu.h"
#include "posenc/kernels/linear.h"

namespace posenc {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// x [..., K] -> [M, K] (a view; contiguous x only)
at::Tensor rows_of(const at::Tensor& x) { return x.view({-1, x.size(-1)}); }

// [..., K] -> [..., N]
std::vector<int64_t> output_shape(const at::Tensor& x, int64_t n) {
  auto shape = x.sizes().vec();
  shape.back() = n;
  return shape;
}

// out [M, N] contiguous float32: every row = bias [N] (what addmm's broadcast copy_ writes).
void fill_rows_with_bias(at::Tensor& out, const at::Tensor& bias) {
  const int64_t m = out.size(0), n = out.size(1);
  float* dst = out.data_ptr<float>();
  const float* b = bias.data_ptr<float>();
  for (int64_t i = 0; i < m; ++i) std::memcpy(dst + i * n, b, static_cast<size_t>(n) * 4);
}

// out [..., N] = x [..., K] weight^T + bias: posenc's own product starting from the bias where it
// takes N (linear_gemm.h), else the bias rows, then MKL accumulating into them (addmm_out with
// self = out takes no copy; beta = 1 leaves no zeroing pass to MKL).
at::Tensor linear_forward(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  auto out = at::empty(output_shape(x, weight.size(0)), x.options());
  auto out_rows = rows_of(out);
  if (out_rows.numel() == 0) return out;
  if (detail::linear_gemm_takes(weight.size(0))) {
    detail::linear_forward_own(rows_of(x), weight, bias, out_rows);
    return out;
  }
  fill_rows_with_bias(out_rows, bias);
  at::addmm_out(out_rows, out_rows, rows_of(x), weight.t());
  return out;
}

// dy as float32 rows [M, N] (a gradient of another layout, an expanded one from a mean, is made
// contiguous first)
at::Tensor gradient_rows(const at::Tensor& dy, int64_t n) {
  const auto g = dy.is_contiguous() ? dy : dy.contiguous();
  return g.view({-1, n});
}

// dx_rows [M, K] = dy_rows [M, N] weight [N, K]: posenc's own product (written, no zeroing pass)
// where it takes K and no graph is recorded, else MKL's (at::mm).
at::Tensor input_gradient(const at::Tensor& dy_rows, const at::Tensor& weight) {
  if (at::GradMode::is_enabled() || !detail::linear_gemm_takes(weight.size(1)))
    return at::mm(dy_rows, weight);
  auto dx = at::empty({dy_rows.size(0), weight.size(1)}, dy_rows.options());
  detail::linear_input_grad_own(dy_rows, weight, dx);
  return dx;
}

// dW = dy^T x [N, K] in the weight's own layout where need_dw, db = the sum over dy's rows where
// need_db: posenc's own pass computing both over the same chunks of dy (linear_gemm.h) where it
// takes K and no graph is recorded, else MKL's product (at::mm) and ATen's sum.
void weight_gradients(const at::Tensor& dy_rows, const at::Tensor& x_rows, bool need_dw,
                      bool need_db, at::Tensor& dw, at::Tensor& db) {
  if (need_dw && !at::GradMode::is_enabled() && detail::linear_gemm_takes(x_rows.size(1))) {
    dw = at::empty({dy_rows.size(1), x_rows.size(1)}, dy_rows.options());
    if (need_db) db = at::empty({dy_rows.size(1)}, dy_rows.options());
    detail::linear_weight_grad_own(dy_rows, x_rows, dw, need_db ? &db : nullptr);
    return;
  }
  if (need_dw) dw = at::mm(dy_rows.t(), x_rows);
  if (need_db) db = dy_rows.sum(0);
}

// The three gradients of y = x W^T + b from dy_rows [M, N] and x_rows [M, K]; those not needed
// left undefined. dW as dy^T x: [N, K] in the weight's own layout.
variable_list linear_gradients(AutogradContext* ctx, const at::Tensor& dy_rows,
                               const at::Tensor& x_rows, const at::Tensor& weight,
                               const at::Tensor& x_like, size_t first_input) {
  at::Tensor dx, dw, db;
  if (ctx->needs_input_grad(first_input)) dx = input_gradient(dy_rows, weight).view(x_like.sizes());
  weight_gradients(dy_rows, x_rows, ctx->needs_input_grad(first_input + 1),
                   ctx->needs_input_grad(first_input + 2), dw, db);
  return {dx, dw, db};
}

class LinearFunction : public torch::autograd::Function<LinearFunction> {
 public:
  // x [..., K] contiguous, weight [N, K], bias [N] -> [..., N]
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& bias) {
    ctx->save_for_backward({x, weight});
    return linear_forward(x, weight, bias);
  }
  static variable_list backward(AutogradContext* ctx, const variable_list& grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& x = saved[0];
    const auto& weight = saved[1];
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor(), at::Tensor()};
    const auto dy = gradient_rows(grads[0], weight.size(0));
    return linear_gradients(ctx, dy, rows_of(x), weight, x, 0);
  }
};

class MlpGeluFunction : public torch::autograd::Function<MlpGeluFunction> {
 public:
  // x [..., D] contiguous; w1 [F, D], b1 [F], w2 [E, F], b2 [E] -> [..., E]
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w1,
                            const at::Tensor& b1, const at::Tensor& w2, const at::Tensor& b2) {
    at::Tensor h, a;  // [..., F]
    if (detail::linear_gemm_takes(w1.size(0)) && x.numel() > 0) {
      // the own product with the GELU applied to its rows while they are in cache
      h = at::empty(output_shape(x, w1.size(0)), x.options());
      a = at::empty_like(h);
      auto h_rows = rows_of(h), a_rows = rows_of(a);
      detail::linear_forward_own(rows_of(x), w1, b1, h_rows, &a_rows);
    } else {
      h = linear_forward(x, w1, b1);
      a = gelu_forward_cpu(h);
    }
    ctx->save_for_backward({x, w1, w2, h, a, b1});
    return linear_forward(a, w2, b2);
  }
  static variable_list backward(AutogradContext* ctx, const variable_list& grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &x = saved[0], &w1 = saved[1], &w2 = saved[2], &h = saved[3], &a = saved[4],
               &b1 = saved[5];
    if (!grads[0].defined()) return variable_list(5);
    const auto dy = gradient_rows(grads[0], w2.size(0));  // [M, E]
    // Under create_graph (grad mode on inside the backward) the gradients must carry their graph
    // to x, w1, b1 and w2, also through h and a, which this node saved without one: h and a are
    // recomputed from the saved inputs (whose graph is kept) by differentiable ATen ops.
    const bool graph = at::GradMode::is_enabled();
    const auto h_rows = graph ? at::addmm(b1, rows_of(x), w1.t()) : rows_of(h);
    const auto a_rows = graph ? at::gelu(h_rows) : rows_of(a);
    // fc2's weight and bias; fc2's input gradient da = dy W2 [M, F]
    at::Tensor dw2, db2;
    weight_gradients(dy, a_rows, ctx->needs_input_grad(3), ctx->needs_input_grad(4), dw2, db2);
    const bool need_below =
        ctx->needs_input_grad(0) || ctx->needs_input_grad(1) || ctx->needs_input_grad(2);
    if (!need_below) return {at::Tensor(), at::Tensor(), at::Tensor(), dw2, db2};
    // dh = da * gelu'(h): ATen's differentiable gelu_backward under create_graph; else the own
    // product da = dy W2 multiplying its rows by gelu'(h) while they are in cache, or MKL's da
    // and the fused pass in place over it
    at::Tensor dh;
    if (graph) {
      dh = at::gelu_backward(input_gradient(dy, w2), h_rows);
    } else if (detail::linear_gemm_takes(w2.size(1))) {
      dh = at::empty({dy.size(0), w2.size(1)}, dy.options());
      detail::linear_input_grad_own(dy, w2, dh, &h_rows);
    } else {
      dh = input_gradient(dy, w2);
      gelu_backward_cpu_out(dh, h_rows, dh);
    }
    auto below = linear_gradients(ctx, dh, rows_of(x), w1, x, 0);
    return {below[0], below[1], below[2], dw2, db2};
  }
};

bool float_cpu(const at::Tensor& t) {
  return t.defined() && t.device().is_cpu() && t.scalar_type() == at::kFloat;
}

}  // namespace

bool linear_fused_supported(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  // N, K > 0: the node's [M, K] and [M, N] row views (view(-1, 0)) do not exist for 0 features
  return float_cpu(x) && float_cpu(weight) && float_cpu(bias) && x.dim() >= 1 &&
         weight.dim() == 2 && weight.size(0) > 0 && weight.size(1) > 0 && bias.dim() == 1 &&
         weight.size(1) == x.size(-1) && bias.size(0) == weight.size(0) && weight.is_contiguous() &&
         bias.is_contiguous() && !at::autocast::is_autocast_enabled(at::kCPU);
}

at::Tensor linear_reference(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  return at::linear(x, weight, bias);
}

at::Tensor linear_fused(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  if (!linear_fused_supported(x, weight, bias)) return linear_reference(x, weight, bias);
  return LinearFunction::apply(x.is_contiguous() ? x : x.contiguous(), weight, bias);
}

at::Tensor mlp_gelu_reference(const at::Tensor& x, const at::Tensor& w1, const at::Tensor& b1,
                              const at::Tensor& w2, const at::Tensor& b2) {
  return at::linear(gelu_fused(at::linear(x, w1, b1)), w2, b2);
}

at::Tensor mlp_gelu_fused(const at::Tensor& x, const at::Tensor& w1, const at::Tensor& b1,
                          const at::Tensor& w2, const at::Tensor& b2) {
  const bool fits = linear_fused_supported(x, w1, b1) && float_cpu(w2) && float_cpu(b2) &&
                    w2.dim() == 2 && w2.size(1) == w1.size(0) &&
                    linear_fused_supported(x.new_empty({0, w2.size(1)}), w2, b2);
  if (!fits) return mlp_gelu_reference(x, w1, b1, w2, b2);
  const auto xc = x.is_contiguous() ? x : x.contiguous();
  if (!gelu_fused_supported(xc)) return mlp_gelu_reference(x, w1, b1, w2, b2);
  return MlpGeluFunction::apply(xc, w1, b1, w2, b2);
}

}  // namespace posenc
