// The position plan: what the encoders contribute to one forward, compiled from the positions
// once and then only read by every block.
//
//   additive  x[:, P:] += embedding            [N, D] or [B, N, D]  (summed over additive parts;
//             x[:, :P] += prefix_embedding     [P, D]  rows of prefix tokens, e.g. a learned CLS
//             row)
//   rotary    q -> R(p_q) q,  k -> R(p_k) k     per-pair cos/sin tables [.., N, F] (or [N, H, F]
//                                               per head), already times any attention scaling;
//                                               at most one rotary part per plan
//   bias      logits += sum of the bias parts:
//               describable parts (BiasSpec: ALiBi slopes, T5 bucket table, Shaw relative
//               table) with the positions they read, so a fused kernel computes them on the fly;
//               materialized parts ([H, Nq, Nk] or [B, H, Nq, Nk]); query-dependent parts
//               (functions of q, materialized at the attention); at most one binary variate
//               part (Moirai's BinaryAttentionBias, posenc/encoders/variate_bias.h):
//               + table[same variate id, h], ids [N] or [B, N], table [2, H] learned, which a
//               fused kernel reads as ids, O(N), never as [N, N].
//   sample    packed samples (several series in one sequence, PlanRequest::sample_ids): query
//             i sees key j only when both carry the same sample id (one contiguous run each).
//
// An encoder writes its part through the add_* / set_rotary builders (PositionalEncodingImpl::
// contribute); a composite calls each of its parts in turn. The transformer builds the plan once
// per forward (PositionalEncodingImpl::plan) and the attention dispatches on what the plan
// holds, never on the encoder's type. With a key-value cache the plan is built for the new
// tokens only: rotary tables at the new positions (cached keys are stored rotated), the bias for
// the new query rows against every key position (cached + new), nothing for the old rows.
//
// Each part is recorded (PlanPart) so `posenc inspect` and `posenc plot` show what touched what.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "posenc/core/positions.h"
#include "posenc/core/stream.h"
#include "posenc/functional/rope.h"

namespace posenc {

/// What a bias is, so a kernel can compute b(p_m, p_n) without materializing it.
enum class BiasForm {
  kNone,
  kAlibi,          ///< b_h(m, n) = -slope_h * (p_m - p_n) (causal) or -slope_h * |p_m - p_n|
  kBucketTable,    ///< b_h(m, n) = table[bucket(p_n - p_m), h] (T5)
  kRelativeTable,  ///< b_h(m, n) = q_m,h . table[clip(p_n - p_m, -K, K) + K] / sqrt(Dh) (Shaw)
};
std::string to_string(BiasForm form);

struct BiasSpec {
  BiasForm form = BiasForm::kNone;
  at::Tensor slopes;          ///< kAlibi: [H], float32
  bool symmetric = false;     ///< kAlibi: |p_m - p_n| instead of (p_m - p_n)
  at::Tensor table;           ///< kBucketTable: [num_buckets, H]; kRelativeTable: [2K+1, Dh]
  int64_t num_buckets = 0;    ///< kBucketTable
  int64_t max_distance = 0;   ///< kBucketTable
  bool bidirectional = true;  ///< kBucketTable
  int64_t max_relative_position = 0;  ///< kRelativeTable: K
};

/// What the positions of one forward are: the queries (the tokens of this forward), every key
/// (cached + new with a key-value cache), and the keys rotated in this forward (the new ones).
struct PlanRequest {
  PlanRequest() = default;
  explicit PlanRequest(Positions queries_, Positions keys_ = {}, Positions rotated_keys_ = {},
                       at::Device device_ = at::kCPU)
      : queries(std::move(queries_)),
        keys(std::move(keys_)),
        rotated_keys(std::move(rotated_keys_)),
        device(device_) {}
  Positions queries;
  Positions keys;                        ///< undefined: the queries
  Positions rotated_keys;                ///< undefined: the keys
  at::Device device = at::kCPU;          ///< where the activations are: tables are built there
  std::vector<SegmentKind> token_kinds;  ///< per query token of a mixed stream (empty: unknown)
  /// Packed samples: [N] or [B, N] integer ids, each one contiguous run per row; attention keeps
  /// to equal ids (undefined: one sample). Self-attention without a cache only (keys = queries).
  at::Tensor sample_ids;
  const Positions& key_positions() const { return keys.defined() ? keys : queries; }
  const Positions& rotated_key_positions() const {
    return rotated_keys.defined() ? rotated_keys : key_positions();
  }
};

/// Rotary tables of the plan's one rotary part (see rope_apply for the layouts).
struct RotaryTables {
  at::Tensor q_cos, q_sin;  ///< [Nq, F], [B, Nq, F], or [Nq, H, F] with per_head
  at::Tensor k_cos, k_sin;  ///< the same for the rotated keys; the same tensors when shared
  RopeLayout layout = RopeLayout::kHalf;
  bool shared = false;    ///< q and k rotated by the same tables (one pass over both)
  bool per_head = false;  ///< tables carry a head axis (RoPE-Mixed)
  bool fused = true;      ///< the encoder allows the fused kernels
  int64_t head_dim = 0;   ///< the Dh the tables were built for
  bool defined() const { return q_cos.defined(); }
};

/// One encoder's contribution, for inspection: "rope" -> "rotary", "alibi" -> "bias (alibi)".
struct PlanPart {
  std::string encoder;  ///< the encoder's type(), e.g. "alibi"
  std::string role;     ///< "additive", "rotary", "bias (alibi)", "bias (materialized)", ...
};

struct FusedBias;  // the fused kernel's per-forward bias data (posenc/kernels/attention_fused.h)

class EncodingPlan {
 public:
  EncodingPlan() = default;
  explicit EncodingPlan(PlanRequest request);

  const PlanRequest& request() const { return request_; }
  const std::vector<PlanPart>& parts() const { return parts_; }

  // ---- builders (called by encoders' contribute) ----
  /// Adds an additive part: embedding [N, D] or [B, N, D] for the N positioned tokens, and
  /// optionally prefix rows [P, D] for P prefix tokens.
  void add_embedding(const std::string& encoder, const at::Tensor& embedding,
                     const at::Tensor& prefix_rows = {});
  /// Sets the rotary part; a second one is an error naming both encoders.
  void set_rotary(const std::string& encoder, RotaryTables tables);
  /// Adds a describable bias; spec positions are the request's (one axis, not batched).
  void add_bias_spec(const std::string& encoder, BiasSpec spec);
  /// Adds a materialized bias [H, Nq, Nk] or [B, H, Nq, Nk] (depends on positions only).
  void add_bias(const std::string& encoder, const at::Tensor& bias);
  /// Adds a query-dependent bias: q [B, Nq, H, Dh] -> [B, H, Nq, Nk].
  void add_query_bias(const std::string& encoder,
                      std::function<at::Tensor(const at::Tensor& q)> bias);
  /// Sets the binary variate part: + table[1, h] where the variate ids of query and key are
  /// equal, table[0, h] where not. ids [N] or [B, N] int64 over the keys (= the queries: self-
  /// attention without a cache), table [2, H]; a second one is an error naming both encoders.
  void set_variate_bias(const std::string& encoder, const at::Tensor& ids, const at::Tensor& table);

  // ---- what the plan holds ----
  bool has_additive() const { return embedding_.defined() || prefix_embedding_.defined(); }
  bool has_rotary() const { return rotary_.defined(); }
  bool has_bias() const {
    return !bias_specs_.empty() || materialized_bias_.defined() || !query_biases_.empty() ||
           has_variate_bias();
  }
  /// Every bias part describable: the fused kernel may compute them all on the fly.
  bool bias_describable() const {
    return (!bias_specs_.empty() || has_variate_bias()) && !materialized_bias_.defined() &&
           query_biases_.empty();
  }
  bool has_variate_bias() const { return variate_table_.defined(); }
  /// The variate part: ids [N] or [B, N] int64 and the learned table [2, H] (undefined: none).
  const at::Tensor& variate_ids() const { return variate_ids_; }
  const at::Tensor& variate_table() const { return variate_table_; }
  /// Packed samples: the request's sample ids, checked (int64 [N] or [B, N]; undefined: none).
  bool has_sample_mask() const { return sample_ids_.defined(); }
  const at::Tensor& sample_ids() const { return sample_ids_; }
  const at::Tensor& embedding() const { return embedding_; }
  const at::Tensor& prefix_embedding() const { return prefix_embedding_; }
  const RotaryTables& rotary() const { return rotary_; }
  const std::vector<BiasSpec>& bias_specs() const { return bias_specs_; }
  /// The positions the describable parts read: float64 [Nq], [Nk].
  const at::Tensor& bias_q_positions() const { return bias_q_; }
  const at::Tensor& bias_k_positions() const { return bias_k_; }
  const at::Tensor& materialized_bias() const { return materialized_bias_; }
  int64_t num_query_biases() const { return static_cast<int64_t>(query_biases_.size()); }

  // ---- applying it ----
  /// x [B, P + N, D] or [P + N, D] -> x + the additive parts (P = prefix tokens).
  at::Tensor apply_additive(const at::Tensor& x, int64_t prefix = 0) const;
  /// q [B, Nq, H, Dh], k [B, Nk, H, Dh] rotated by the rotary part (unchanged without one).
  std::pair<at::Tensor, at::Tensor> apply_rotary(const at::Tensor& q, const at::Tensor& k) const;
  /// Every bias part summed and materialized (the variate part too, not the sample mask):
  /// [H, Nq, Nk] or [B, H, Nq, Nk], or undefined.
  /// q [B, Nq, H, Dh] is needed by query-dependent parts.
  at::Tensor materialize_bias(int64_t heads, const at::Tensor& q = {}) const;

  /// The fused kernel's data for the describable parts, built on first use and then shared by
  /// every block of the forward (buckets, offsets, position vectors).
  std::shared_ptr<const FusedBias> fused_bias() const;

 private:
  PlanRequest request_;
  std::vector<PlanPart> parts_;
  at::Tensor embedding_, prefix_embedding_;
  std::string additive_owner_;
  RotaryTables rotary_;
  std::string rotary_owner_;
  std::vector<BiasSpec> bias_specs_;
  at::Tensor bias_q_, bias_k_;
  at::Tensor materialized_bias_;
  std::vector<std::function<at::Tensor(const at::Tensor&)>> query_biases_;
  at::Tensor variate_ids_, variate_table_;
  std::string variate_owner_;
  at::Tensor sample_ids_;
  mutable std::shared_ptr<const FusedBias> fused_;
};

}  // namespace posenc
