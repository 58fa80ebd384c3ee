// Tensors into the raw CUDA kernels (contract and who calls it: tensor_launch.h). Nothing here
// manages a device or a stream: the caller sets the device and passes the stream, so the same
// code runs on CUDA tensors (cuda_glue.cpp) and, against the CPU emulator, on CPU tensors
// (tests/cuda_emu/tensor_launch_emu.cpp, where cudaGetErrorString and the kernels are the
// emulator's). The references rope_apply / attention_reference are the specification.
#include "tensor_launch.h"

#include <ATen/ATen.h>

#include <limits>
#include <utility>

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

// Both modes: eager reads tables of width W = 2F ([.., W]), the default per-pair ones ([.., F]).
void rope_rotate_tables_launch(const std::vector<at::Tensor>& inputs,
                               const std::vector<at::Tensor>& outputs, const at::Tensor& cos_in,
                               const at::Tensor& sin_in, RopeLayout layout, bool inverse,
                               cudaStream_t stream, bool eager) {
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
    TORCH_CHECK(x.device() == first.device() && y.device() == first.device(),
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
    const int64_t width = eager ? cos_in.size(-1) : 2 * cos_in.size(-1);
    TORCH_CHECK(width % 2 == 0, "rope_fused: the tables' width W=", width, " must be even");
    TORCH_CHECK(width <= x.size(3), "rope_fused: rotary width ", eager ? "W=" : "2F=", width,
                " exceeds head_dim=", x.size(3), " of ", names[i]);
  }
  const int64_t batch = first.size(0), tokens = first.size(1);
  TORCH_CHECK(cos_in.size(-2) == tokens, "rope_fused: cos/sin have ", cos_in.size(-2),
              " positions but the inputs have N=", tokens);
  TORCH_CHECK(cos_in.dim() == 2 || cos_in.size(0) == batch, "rope_fused: cos/sin batch ",
              cos_in.size(0), " does not match B=", batch);
  const auto storage = storage_of(first.scalar_type(), "rope_fused");
  auto cos = cos_in.to(first.device(), at::kFloat).contiguous();
  auto sin = sin_in.to(first.device(), at::kFloat).contiguous();
  const int64_t pairs = eager ? cos.size(-1) / 2 : cos.size(-1);
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
  a.eager = eager;
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
  check_launch(cuda::rope_rotate_tables(a, stream), "rope_fused");
}

}  // namespace

void rope_rotate_launch(const std::vector<at::Tensor>& inputs,
                        const std::vector<at::Tensor>& outputs, const at::Tensor& cos,
                        const at::Tensor& sin, RopeLayout layout, bool inverse,
                        cudaStream_t stream) {
  rope_rotate_tables_launch(inputs, outputs, cos, sin, layout, inverse, stream, /*eager=*/false);
}

void rope_rotate_launch_eager(const std::vector<at::Tensor>& inputs,
                              const std::vector<at::Tensor>& outputs, const at::Tensor& cos,
                              const at::Tensor& sin, RopeLayout layout, cudaStream_t stream) {
  rope_rotate_tables_launch(inputs, outputs, cos, sin, layout, /*inverse=*/false, stream,
                            /*eager=*/true);
}

namespace {

at::Tensor last_dim_contiguous(const at::Tensor& x) {
  return x.stride(-1) == 1 ? x : x.contiguous();
}

// An AttentionLaunch for (q, k, v, bias, positions, masks) on q's device, and the device tensors
// it points into (positions, slopes, the T5 bucket lookup, the padding mask): the forward and the
// backward build theirs with this one function. Launches are asynchronous; the caching allocator
// orders the reuse of these buffers on the stream, so they only need to live until queued.
struct PreparedAttention {
  cuda::AttentionLaunch launch;
  at::Tensor q, k, v, q_positions, k_positions, slopes, table, bucket, keep;
  at::Tensor sample_first, sample_last, variate_ids, variate_bias;
};

// Packed samples: each token's sample bounds [B, Nk] int32, the first and the last token of the
// run of equal sample ids holding it (the operator has checked that every id is one contiguous run
// per row: posenc::detail::check_packed_ids), computed on the ids' device:
//   begins[j] = (j == 0 or ids[j] != ids[j - 1]),  first[j] = max_{j' <= j, begins[j']} j'
//   ends[j]   = (j == Nk - 1 or ids[j] != ids[j + 1]),  last[j] = min_{j' >= j, ends[j']} j'
std::pair<at::Tensor, at::Tensor> sample_bounds(const at::Tensor& sample_ids) {
  const auto ids = sample_ids.to(at::kLong);
  const int64_t nk = ids.size(1);
  TORCH_CHECK(nk <= std::numeric_limits<int32_t>::max(),
              "attention_fused (CUDA): sample_ids with Nk=", nk, " keys (at most 2^31 - 1)");
  const auto index = at::arange(nk, ids.options()).expand_as(ids);
  auto begins = at::ones_like(ids, ids.options().dtype(at::kBool));
  auto ends = at::ones_like(begins);
  if (nk > 1) {
    const auto differ = ids.narrow(1, 1, nk - 1) != ids.narrow(1, 0, nk - 1);
    begins.narrow(1, 1, nk - 1).copy_(differ);
    ends.narrow(1, 0, nk - 1).copy_(differ);
  }
  auto first = std::get<0>(at::cummax(at::where(begins, index, at::zeros_like(index)), 1));
  auto last =
      std::get<0>(at::cummin(at::where(ends, index, at::full_like(index, nk)).flip(1), 1)).flip(1);
  return {first.to(at::kInt).contiguous(), last.to(at::kInt).contiguous()};
}

PreparedAttention prepare_attention(const at::Tensor& q_in, const at::Tensor& k_in,
                                    const at::Tensor& v_in, const at::Tensor& table,
                                    const BiasSpec& bias, const at::Tensor& q_positions,
                                    const at::Tensor& k_positions, const AttentionMasks& masks,
                                    double scale) {
  const auto device = q_in.device();
  PreparedAttention p;
  p.q = last_dim_contiguous(q_in);
  p.k = last_dim_contiguous(k_in);
  p.v = last_dim_contiguous(v_in);
  const auto &q = p.q, &k = p.k, &v = p.v;
  cuda::AttentionLaunch& a = p.launch;
  a.q = q.const_data_ptr();
  a.k = k.const_data_ptr();
  a.v = v.const_data_ptr();
  a.storage = storage_of(q.scalar_type(), "attention_fused");
  a.batch = q.size(0);
  a.heads = q.size(2);
  a.nq = q.size(1);
  a.nk = k.size(1);
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
  p.q_positions = q_positions.to(device, at::kDouble).contiguous();
  p.k_positions = k_positions.to(device, at::kDouble).contiguous();
  a.q_positions = p.q_positions.const_data_ptr<double>();
  a.k_positions = p.k_positions.const_data_ptr<double>();
  if (bias.form == BiasForm::kAlibi) {
    p.slopes = bias.slopes.to(device, at::kFloat).contiguous();
    a.bias = cuda::AttentionBias::kAlibi;
    a.slopes = p.slopes.const_data_ptr<float>();
    a.symmetric = bias.symmetric;
  } else if (bias.form == BiasForm::kBucketTable && a.nk > 0) {
    // bucket per relative offset p_j - p_i over the range that occurs: the one T5 formula
    auto offsets = t5_offset_buckets(q_positions, k_positions, bias.bidirectional, bias.num_buckets,
                                     bias.max_distance);
    p.bucket = offsets.buckets.to(device, at::kInt).contiguous();
    p.table = table.detach().to(device, at::kFloat).contiguous();
    a.bias = cuda::AttentionBias::kBucketTable;
    a.table = p.table.const_data_ptr<float>();
    a.num_buckets = p.table.size(0);
    a.bucket_of_offset = p.bucket.const_data_ptr<int32_t>();
    a.offset_min = offsets.offset_min;
    a.offset_count = p.bucket.numel();
  }
  if (masks.key_padding.defined() && masks.key_padding.numel() > 0) {
    p.keep = masks.key_padding.to(device, at::kByte).contiguous();
    a.key_keep = p.keep.const_data_ptr<uint8_t>();
  }
  if (masks.sample_ids.defined() && a.nk > 0) {
    std::tie(p.sample_first, p.sample_last) = sample_bounds(masks.sample_ids.to(device));
    a.sample_first = p.sample_first.const_data_ptr<int32_t>();
    a.sample_last = p.sample_last.const_data_ptr<int32_t>();
  }
  if (masks.variate_ids.defined() && a.nk > 0) {
    p.variate_ids = masks.variate_ids.to(device, at::kLong).contiguous();
    p.variate_bias = masks.variate_bias.detach().to(device, at::kFloat).contiguous();
    a.variate_ids = p.variate_ids.const_data_ptr<int64_t>();
    a.variate_bias = p.variate_bias.const_data_ptr<float>();
  }
  return p;
}

void check_attention_cuda(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                          const AttentionMasks& masks) {
  const auto device = q_in.device();
  TORCH_CHECK(k_in.device() == device && v_in.device() == device,
              "attention_fused (CUDA): q, k, v must share a device, got ", device, ", ",
              k_in.device(), ", ", v_in.device());
  TORCH_CHECK(k_in.scalar_type() == q_in.scalar_type() && v_in.scalar_type() == q_in.scalar_type(),
              "attention_fused (CUDA): q, k, v must share a dtype, got ", q_in.scalar_type(), ", ",
              k_in.scalar_type(), ", ", v_in.scalar_type());
  TORCH_CHECK(q_in.size(3) <= cuda::kAttentionMaxDim && v_in.size(3) <= cuda::kAttentionMaxDim,
              "attention_fused (CUDA): head dims up to ", cuda::kAttentionMaxDim,
              ", got D=", q_in.size(3), " Dv=", v_in.size(3), "; use attention_reference");
  // the ids' values are the operator's to check (check_packed_ids); their shapes are read here
  for (const auto& [name, ids] :
       {std::pair<const char*, const at::Tensor&>{"sample_ids", masks.sample_ids},
        {"variate_ids", masks.variate_ids}})
    TORCH_CHECK(!ids.defined() || (ids.dim() == 2 && ids.size(0) == q_in.size(0) &&
                                   ids.size(1) == k_in.size(1) && q_in.size(1) <= k_in.size(1)),
                "attention_fused (CUDA): ", name, " must be [B, Nk] = [", q_in.size(0), ", ",
                k_in.size(1), "] with Nq=", q_in.size(1), " <= Nk, got ", ids.sizes());
  TORCH_CHECK(masks.variate_ids.defined() == masks.variate_bias.defined() &&
                  (!masks.variate_bias.defined() ||
                   (masks.variate_bias.dim() == 2 && masks.variate_bias.size(0) == 2 &&
                    masks.variate_bias.size(1) == q_in.size(2))),
              "attention_fused (CUDA): variate_ids needs variate_bias [2, H] = [2, ", q_in.size(2),
              "]");
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> attention_forward_launch(
    const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in, const at::Tensor& table,
    const BiasSpec& bias, const at::Tensor& q_positions, const at::Tensor& k_positions,
    const AttentionMasks& masks, double scale, cudaStream_t stream) {
  check_attention_cuda(q_in, k_in, v_in, masks);
  const int64_t batch = q_in.size(0), nq = q_in.size(1), heads = q_in.size(2);
  auto out = at::empty({batch, nq, heads, v_in.size(3)}, q_in.options());
  auto lse = at::empty({batch, heads, nq}, q_in.options().dtype(at::kFloat));
  TORCH_CHECK(v_in.size(3) > 0 || out.numel() == 0,
              "attention_fused (CUDA): value head dim Dv=0; use attention_reference");
  if (out.numel() == 0) return {out, lse};
  auto prepared =
      prepare_attention(q_in, k_in, v_in, table, bias, q_positions, k_positions, masks, scale);
  prepared.launch.out = out.data_ptr();
  prepared.launch.lse = lse.data_ptr<float>();
  check_launch(cuda::attention_forward(prepared.launch, stream), "attention_fused");
  return {out, lse};
}

// The backward kernels (attention_cuda.h): tiles recomputed from the saved log-sum-exp.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> attention_backward_launch(
    const at::Tensor& grad_out, const at::Tensor& out, const at::Tensor& lse, const at::Tensor& q,
    const at::Tensor& k, const at::Tensor& v, const at::Tensor& table, const BiasSpec& spec,
    const at::Tensor& q_positions, const at::Tensor& k_positions, const AttentionMasks& masks,
    double scale, cudaStream_t stream, at::Tensor* dvariate) {
  check_attention_cuda(q, k, v, masks);
  auto f32 = q.options().dtype(at::kFloat);
  const bool table_grad = spec.form == BiasForm::kBucketTable && table.numel() > 0;
  if (dvariate != nullptr)  // [2, H] float32 with a variate bias, else undefined
    *dvariate = masks.variate_ids.defined() ? at::zeros({2, q.size(2)}, f32) : at::Tensor();
  if (out.numel() == 0 || k.size(1) == 0) {  // no rows, or no key for any row: no gradient
    const auto contiguous = at::MemoryFormat::Contiguous;
    return {at::zeros_like(q, contiguous), at::zeros_like(k, contiguous),
            at::zeros_like(v, contiguous), table_grad ? at::zeros_like(table) : at::Tensor()};
  }
  auto prepared = prepare_attention(q, k, v, table, spec, q_positions, k_positions, masks, scale);
  auto dout = grad_out.to(q.scalar_type()).contiguous();  // [B, Nq, H, Dv]
  // delta_i = dO_i . O_i: [B, Nq, H] -> [B, H, Nq]
  auto delta = (dout.to(at::kFloat) * out.to(at::kFloat)).sum(-1).transpose(1, 2).contiguous();
  auto lse_f32 = lse.to(at::kFloat).contiguous();
  auto dq = at::empty(q.sizes(), f32), dk = at::empty(k.sizes(), f32),
       dv = at::empty(v.sizes(), f32);
  at::Tensor dtable;
  cuda::AttentionBackwardLaunch g;
  g.forward = prepared.launch;
  g.forward.lse = const_cast<float*>(lse_f32.const_data_ptr<float>());  // read only
  g.dout = dout.const_data_ptr();
  g.delta = delta.const_data_ptr<float>();
  g.dq = dq.data_ptr<float>();
  g.dk = dk.data_ptr<float>();
  g.dv = dv.data_ptr<float>();
  if (table_grad && prepared.launch.bias == cuda::AttentionBias::kBucketTable) {
    dtable = at::zeros({table.size(0), table.size(1)}, f32);
    g.dtable = dtable.data_ptr<float>();
  }
  // the variate bias's gradient, deterministic: per key tile partial sums [B, H, tiles, 2] from
  // the dK/dV kernel, summed here over the batch and the tiles (no atomics)
  at::Tensor dvariate_partial;
  if (dvariate != nullptr && prepared.launch.variate_ids != nullptr) {
    const int64_t tiles = (k.size(1) + cuda::kAttentionKeyTile - 1) / cuda::kAttentionKeyTile;
    dvariate_partial = at::empty({q.size(0), q.size(2), tiles, 2}, f32);
    g.dvariate_partial = dvariate_partial.data_ptr<float>();
  }
  check_launch(cuda::attention_backward(g, stream), "attention_fused backward");
  if (dtable.defined()) dtable = dtable.to(table.scalar_type());
  if (dvariate_partial.defined()) *dvariate = dvariate_partial.sum({0, 2}).t().contiguous();
  return {dq.to(q.scalar_type()), dk.to(k.scalar_type()), dv.to(v.scalar_type()), dtable};
}

}  // namespace posenc::detail
