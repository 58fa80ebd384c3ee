// Glue from tensors to the raw CUDA kernels (include/posenc/kernels/{rope_cuda,attention_cuda}.h),
// compiled only when the LibTorch has CUDA (POSENC_HAS_CUDA_GLUE). Contracts are the public ones
// (posenc/kernels/rope.h, attention.h); the references rope_apply / attention_reference are the
// specification. Launches go to the current stream of the inputs' device.
//   rope:      q [B, N, Hq, Dh], k [B, N, Hk, Dh] (last dim contiguous), cos/sin [N, F] | [B, N, F]
//   attention: q [B, Nq, H, D], k [B, Nk, H, D], v [B, Nk, H, Dv] -> [B, Nq, H, Dv]
// Attention's backward has no CUDA kernel yet: it recomputes attention_reference on the device
// (materialized [H, Nq, Nk] bias) and differentiates that.
#include "cuda_glue.h"

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/torch.h>

#include <limits>

#include "posenc/functional/relative.h"
#include "posenc/kernels/attention_cuda.h"
#include "posenc/kernels/rope_cuda.h"

namespace posenc::detail {

namespace {

cuda::Storage storage_of(at::ScalarType dtype, const char* who) {
  switch (dtype) {
    case at::kFloat:
      return cuda::Storage::kFloat32;
    case at::kBFloat16:
      return cuda::Storage::kBFloat16;
    case at::kHalf:
      return cuda::Storage::kFloat16;
    default:
      TORCH_CHECK(false, who, ": the CUDA kernel takes float32, bfloat16 or float16, got ", dtype);
  }
  return cuda::Storage::kFloat32;
}

void check_launch(cudaError_t err, const char* who) {
  TORCH_CHECK(err == cudaSuccess, who, ": CUDA kernel launch failed: ", cudaGetErrorString(err));
}

bool cuda_dtype(at::ScalarType dtype) {
  return dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf;
}

}  // namespace

void rope_rotate_cuda(const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& outputs,
                      const at::Tensor& cos_in, const at::Tensor& sin_in, RopeLayout layout,
                      bool inverse) {
  TORCH_CHECK(!inputs.empty() && inputs.size() <= 2 && inputs.size() == outputs.size(),
              "rope_fused (CUDA): need 1 or 2 inputs and as many outputs, got ", inputs.size(),
              " and ", outputs.size());
  const auto& first = inputs[0];
  TORCH_CHECK(cos_in.sizes() == sin_in.sizes(),
              "rope_fused: cos and sin shapes differ: ", cos_in.sizes(), " vs ", sin_in.sizes());
  TORCH_CHECK(cos_in.dim() == 2 || cos_in.dim() == 3,
              "rope_fused: cos/sin must be [N, F] or [B, N, F], got ", cos_in.sizes());
  const char* names[] = {"q", "k"};
  for (size_t i = 0; i < inputs.size(); ++i) {
    const auto& x = inputs[i];
    const auto& y = outputs[i];
    TORCH_CHECK(x.dim() == 4, "rope_fused: ", names[i], " must be [B, N, H, Dh], got shape ",
                x.sizes());
    TORCH_CHECK(x.is_cuda() && x.device() == first.device() && y.device() == first.device(),
                "rope_fused (CUDA): ", names[i], " is on ", x.device(), ", expected ",
                first.device());
    TORCH_CHECK(x.size(0) == first.size(0) && x.size(1) == first.size(1), "rope_fused: ", names[i],
                " has [B, N] = [", x.size(0), ", ", x.size(1), "] but the first input has [",
                first.size(0), ", ", first.size(1), "]");
    TORCH_CHECK(x.scalar_type() == first.scalar_type(), "rope_fused: q is ", first.scalar_type(),
                " but k is ", x.scalar_type());
    TORCH_CHECK(y.sizes() == x.sizes() && y.scalar_type() == x.scalar_type(), "rope_fused: output ",
                i, " must match its input's shape and dtype");
    TORCH_CHECK(x.stride(3) == 1 && y.stride(3) == 1,
                "rope_fused: the last dim must be contiguous");
    TORCH_CHECK(2 * cos_in.size(-1) <= x.size(3),
                "rope_fused: rotary width 2F=", 2 * cos_in.size(-1),
                " exceeds head_dim=", x.size(3), " of ", names[i]);
  }
  const int64_t batch = first.size(0), tokens = first.size(1);
  TORCH_CHECK(cos_in.size(-2) == tokens, "rope_fused: cos/sin have ", cos_in.size(-2),
              " positions but the inputs have N=", tokens);
  TORCH_CHECK(cos_in.dim() == 2 || cos_in.size(0) == batch, "rope_fused: cos/sin batch ",
              cos_in.size(0), " does not match B=", batch);
  const auto storage = storage_of(first.scalar_type(), "rope_fused");
  c10::cuda::CUDAGuard guard(first.device());
  auto cos = cos_in.to(first.device(), at::kFloat).contiguous();
  auto sin = sin_in.to(first.device(), at::kFloat).contiguous();
  const int64_t pairs = cos.size(-1);
  if (batch * tokens == 0) return;
  if (pairs == 0) {  // nothing rotates: out of place is a copy
    for (size_t i = 0; i < inputs.size(); ++i)
      if (!outputs[i].is_same(inputs[i])) outputs[i].copy_(inputs[i]);
    return;
  }
  cuda::RopeTableLaunch a;
  a.count = static_cast<int>(inputs.size());
  a.storage = storage;
  a.batch = batch;
  a.tokens = tokens;
  a.cos = cos.data_ptr<float>();
  a.sin = sin.data_ptr<float>();
  a.table_batched = cos.dim() == 3;
  a.pairs = pairs;
  a.interleaved = layout == RopeLayout::kInterleaved;
  a.sign = inverse ? -1.0f : 1.0f;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const auto& x = inputs[i];
    const auto& y = outputs[i];
    auto& u = a.tensors[i];
    u.x = x.const_data_ptr();
    u.y = y.data_ptr();
    u.heads = x.size(2);
    u.head_dim = x.size(3);
    u.x_stride_batch = x.stride(0);
    u.x_stride_token = x.stride(1);
    u.x_stride_head = x.stride(2);
    u.y_stride_batch = y.stride(0);
    u.y_stride_token = y.stride(1);
    u.y_stride_head = y.stride(2);
  }
  check_launch(cuda::rope_rotate_tables(a, c10::cuda::getCurrentCUDAStream()), "rope_fused");
}

bool attention_cuda_supported(const at::Tensor& q) {
  return q.is_cuda() && cuda_dtype(q.scalar_type()) && q.dim() == 4 &&
         q.size(3) <= cuda::kAttentionMaxDim;
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::Tensor last_dim_contiguous(const at::Tensor& x) {
  return x.stride(-1) == 1 ? x : x.contiguous();
}

class AttentionCudaFunction : public torch::autograd::Function<AttentionCudaFunction> {
 public:
  // table: the T5 table (kBucketTable) or empty, an input so that autograd tracks it.
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q_in, const at::Tensor& k_in,
                               const at::Tensor& v_in, const at::Tensor& table,
                               const BiasSpec& bias, const at::Tensor& q_positions,
                               const at::Tensor& k_positions, const AttentionMasks& masks,
                               double scale) {
    const auto device = q_in.device();
    TORCH_CHECK(k_in.device() == device && v_in.device() == device,
                "attention_fused (CUDA): q, k, v must share a device, got ", device, ", ",
                k_in.device(), ", ", v_in.device());
    TORCH_CHECK(
        k_in.scalar_type() == q_in.scalar_type() && v_in.scalar_type() == q_in.scalar_type(),
        "attention_fused (CUDA): q, k, v must share a dtype, got ", q_in.scalar_type(), ", ",
        k_in.scalar_type(), ", ", v_in.scalar_type());
    TORCH_CHECK(q_in.size(3) <= cuda::kAttentionMaxDim && v_in.size(3) <= cuda::kAttentionMaxDim,
                "attention_fused (CUDA): head dims up to ", cuda::kAttentionMaxDim,
                ", got D=", q_in.size(3), " Dv=", v_in.size(3), "; use attention_reference");
    c10::cuda::CUDAGuard guard(device);
    auto q = last_dim_contiguous(q_in), k = last_dim_contiguous(k_in),
         v = last_dim_contiguous(v_in);
    const int64_t batch = q.size(0), nq = q.size(1), heads = q.size(2), nk = k.size(1);
    auto out = at::empty({batch, nq, heads, v.size(3)}, q.options());
    auto lse = at::empty({batch, heads, nq}, q.options().dtype(at::kFloat));
    if (out.numel() == 0) {
      ctx->saved_data["empty"] = true;
      return {out};
    }
    cuda::AttentionLaunch a;
    a.q = q.const_data_ptr();
    a.k = k.const_data_ptr();
    a.v = v.const_data_ptr();
    a.out = out.data_ptr();
    a.lse = lse.data_ptr<float>();
    a.storage = storage_of(q.scalar_type(), "attention_fused");
    a.batch = batch;
    a.heads = heads;
    a.nq = nq;
    a.nk = nk;
    a.dim = q.size(3);
    a.dim_v = v.size(3);
    a.q_stride_batch = q.stride(0);
    a.q_stride_token = q.stride(1);
    a.q_stride_head = q.stride(2);
    a.k_stride_batch = k.stride(0);
    a.k_stride_token = k.stride(1);
    a.k_stride_head = k.stride(2);
    a.v_stride_batch = v.stride(0);
    a.v_stride_token = v.stride(1);
    a.v_stride_head = v.stride(2);
    a.scale = static_cast<float>(scale);
    a.causal = masks.causal;
    // device copies that must outlive the (asynchronous) launch: kept alive until it is queued,
    // and the caching allocator orders their reuse on this stream
    auto qp = q_positions.to(device, at::kDouble).contiguous();
    auto kp = k_positions.to(device, at::kDouble).contiguous();
    at::Tensor slopes, table_f32, bucket, keep;
    a.q_positions = qp.const_data_ptr<double>();
    a.k_positions = kp.const_data_ptr<double>();
    if (bias.form == BiasForm::kAlibi) {
      slopes = bias.slopes.to(device, at::kFloat).contiguous();
      a.bias = cuda::AttentionBias::kAlibi;
      a.slopes = slopes.const_data_ptr<float>();
      a.symmetric = bias.symmetric;
    } else if (bias.form == BiasForm::kBucketTable && nk > 0) {
      // bucket per relative offset p_j - p_i over the range that occurs: the one T5 formula
      auto iq = q_positions.to(at::kCPU, at::kDouble).round().to(at::kLong);
      auto ik = k_positions.to(at::kCPU, at::kDouble).round().to(at::kLong);
      const int64_t q_min = iq.min().item<int64_t>(), q_max = iq.max().item<int64_t>();
      const int64_t k_min = ik.min().item<int64_t>(), k_max = ik.max().item<int64_t>();
      const int64_t offset_min = k_min - q_max, offset_count = k_max - q_min - offset_min + 1;
      auto offsets = torch::arange(offset_min, offset_min + offset_count, torch::kLong);
      bucket = t5_relative_position_bucket(offsets, bias.bidirectional, bias.num_buckets,
                                           bias.max_distance)
                   .to(device, at::kInt)
                   .contiguous();
      table_f32 = table.detach().to(device, at::kFloat).contiguous();
      a.bias = cuda::AttentionBias::kBucketTable;
      a.table = table_f32.const_data_ptr<float>();
      a.num_buckets = table_f32.size(0);
      a.bucket_of_offset = bucket.const_data_ptr<int32_t>();
      a.offset_min = offset_min;
      a.offset_count = offset_count;
    }
    if (masks.key_padding.defined() && masks.key_padding.numel() > 0) {
      keep = masks.key_padding.to(device, at::kByte).contiguous();
      a.key_keep = keep.const_data_ptr<uint8_t>();
    }
    check_launch(cuda::attention_forward(a, c10::cuda::getCurrentCUDAStream()), "attention_fused");

    ctx->save_for_backward({q_in, k_in, v_in, table});
    auto& d = ctx->saved_data;
    d["empty"] = false;
    d["form"] = static_cast<int64_t>(bias.form);
    d["symmetric"] = bias.symmetric;
    d["slopes"] = bias.slopes.defined() ? bias.slopes : torch::empty({0});
    d["num_buckets"] = bias.num_buckets;
    d["max_distance"] = bias.max_distance;
    d["bidirectional"] = bias.bidirectional;
    d["q_positions"] = q_positions;
    d["k_positions"] = k_positions;
    d["causal"] = masks.causal;
    d["key_padding"] = masks.key_padding.defined() ? masks.key_padding : torch::empty({0});
    d["scale"] = scale;
    return {out};
  }

  // Autograd through the reference on the device (no CUDA backward kernel yet).
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list none(9);
    auto& d = ctx->saved_data;
    if (d["empty"].toBool() || !grads[0].defined()) return none;
    auto saved = ctx->get_saved_variables();
    const auto device = saved[0].device();
    c10::cuda::CUDAGuard guard(device);
    at::AutoGradMode enable(true);
    auto q = saved[0].detach().requires_grad_(true);
    auto k = saved[1].detach().requires_grad_(true);
    auto v = saved[2].detach().requires_grad_(true);
    const auto form = static_cast<BiasForm>(d["form"].toInt());
    const bool table_grad = form == BiasForm::kBucketTable && saved[3].requires_grad();
    auto table_leaf = saved[3].detach().requires_grad_(table_grad);
    BiasSpec spec;
    spec.form = form;
    spec.symmetric = d["symmetric"].toBool();
    spec.slopes = d["slopes"].toTensor().to(device);
    spec.table = table_leaf.to(device);
    spec.num_buckets = d["num_buckets"].toInt();
    spec.max_distance = d["max_distance"].toInt();
    spec.bidirectional = d["bidirectional"].toBool();
    auto qp = d["q_positions"].toTensor().to(device, at::kDouble);
    auto kp = d["k_positions"].toTensor().to(device, at::kDouble);
    const int64_t heads = q.size(2), nq = q.size(1), nk = k.size(1);
    at::Tensor bias = bias_from_spec(spec, qp, kp, heads);  // [H, Nq, Nk] or undefined
    AttentionMasks masks;
    if (d["causal"].toBool()) {  // as a -inf bias, built on the device
      auto i = torch::arange(nq, torch::dtype(torch::kLong).device(device)).unsqueeze(1);
      auto j = torch::arange(nk, torch::dtype(torch::kLong).device(device)).unsqueeze(0);
      auto mask = torch::zeros({nq, nk}, torch::dtype(torch::kFloat).device(device))
                      .masked_fill(j > i + (nk - nq), -std::numeric_limits<float>::infinity());
      bias = bias.defined() ? bias + mask : mask;
    }
    auto padding = d["key_padding"].toTensor();
    if (padding.numel() > 0) masks.key_padding = padding.to(device);
    auto out = attention_reference(q, k, v, bias, masks, d["scale"].toDouble());
    variable_list inputs = {q, k, v};
    if (table_grad) inputs.push_back(table_leaf);
    auto g = torch::autograd::grad({out}, inputs, {grads[0]}, /*retain_graph=*/false,
                                   /*create_graph=*/false, /*allow_unused=*/true);
    none[0] = g[0];
    none[1] = g[1];
    none[2] = g[2];
    if (table_grad) none[3] = g[3];
    return none;
  }
};

}  // namespace

at::Tensor attention_fused_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const BiasSpec& bias, const at::Tensor& q_positions,
                                const at::Tensor& k_positions, const AttentionMasks& masks,
                                double scale) {
  TORCH_CHECK(attention_cuda_supported(q), "attention_fused (CUDA): unsupported q (", q.device(),
              ", ", q.scalar_type(), ", shape ", q.sizes(), "); use attention_reference");
  at::Tensor table = bias.form == BiasForm::kBucketTable ? bias.table : torch::empty({0});
  return AttentionCudaFunction::apply(q, k, v, table, bias, q_positions, k_positions, masks,
                                      scale)[0];
}

}  // namespace posenc::detail
