// Which kernel a self-attention call runs, as named rules walked in priority order (PyTorch's
// sdp_utils does the same for SDPA's backends). Each backend states what it admits; the first
// that admits the call runs it, and the selector keeps why each earlier one did not:
//
//   short_rotary  the short kernel with the plan's RoPE inside (a ViT's patch grid): CPU, no
//                 bias, no key padding, no cache, no prefix tokens, constant [N, F] rotary tables
//                 shared by q and k, shapes the kernel takes (posenc/kernels/short_attention.h);
//                 measured 2-3x faster than SDPA's CPU flash kernel at N = 16
//   short         the same kernel, the queries and keys rotated before it
//   sdpa          at::scaled_dot_product_attention: no bias, no key padding, and no causal mask
//                 over cached keys (its causal mask is aligned top-left); 1.4-1.75x faster than
//                 the fused kernel for forward + backward at training sizes
//   fused         posenc's fused kernel with the bias (ALiBi, T5, ...) computed in its tiles and,
//                 without a cache, the plan's RoPE inside: something to add (a bias, key padding
//                 or a causal mask over cached keys), a describable bias, no prefix tokens
//   reference     einsum, the materialized bias, masks and softmax: always
//
// Every backend but the reference also needs AttentionOptions::fused() (true by default).
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "posenc/core/plan.h"
#include "posenc/kernels/attention_fused.h"

namespace posenc {

struct AttentionOptions;

enum class AttentionBackend { kShortRotary, kShort, kSdpa, kFused, kReference };
std::string to_string(AttentionBackend backend);

/// What the selector looks at: q, k, v [B, N, H, Dh] as projected (before any rotation).
struct AttentionCall {
  const AttentionOptions& options;
  const EncodingPlan& plan;
  const at::Tensor& q;
  const at::Tensor& k;
  const at::Tensor& v;
  bool key_padding = false;  ///< a key padding mask is given
  bool cache = false;        ///< a key-value cache is given (empty or not)
  int64_t cached = 0;        ///< keys already in the cache
  int64_t prefix = 0;        ///< prefix tokens without position
};

struct AttentionRoute {
  AttentionBackend backend = AttentionBackend::kReference;
  /// The kernel applies the plan's RoPE itself (`rotary`); otherwise q and k are rotated first.
  bool rotary_inside = false;
  AttentionRotary rotary;
  std::shared_ptr<const FusedBias> fused;  ///< kFused: the bias its tiles compute
  /// Each backend above the chosen one, with the first rule it failed.
  std::vector<std::pair<AttentionBackend, std::string>> not_taken;
};

/// The first admissible backend in priority order, with the reasons for those passed over.
AttentionRoute select_attention(const AttentionCall& call);

/// "sdpa (short_rotary: the plan has a bias; short: the plan has a bias)": for inspect/profile.
std::string describe(const AttentionRoute& route);

}  // namespace posenc
