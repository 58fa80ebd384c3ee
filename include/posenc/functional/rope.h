// Rotary position embedding (Su et al. 2021, "RoFormer", arXiv:2104.09864) and its scalings.
//
//   inv_freq_i = theta^(-2i/r),  i = 0 .. r/2-1,   r = int(Dh * partial_rotary_factor) (even)
//   angle(p, i) = p * inv_freq_i
//   (x_a, x_b) -> (x_a cos - x_b sin,  x_b cos + x_a sin) * attention_scaling-scaled cos/sin
// Pairs, by layout:
//   half        [x0 .. x(r/2-1) | x(r/2) .. x(r-1)]  pairs (i, i + r/2)   Llama, GPT-NeoX, HF
//   interleaved [x0 x1 | x2 x3 | ...]                 pairs (2i, 2i + 1)  GPT-J, llama.cpp NORM
// Dims r .. Dh-1 pass through unchanged (partial rotary).
//
// Scalings follow HF transformers' modeling_rope_utils (rope_parameters / legacy rope_scaling):
//   default   as above, attention_scaling 1
//   linear    inv_freq / factor                          (Chen et al. 2023, position interpolation)
//   dynamic   theta' = theta (f L/L - (f-1))^(r/(r-2)) when L > Lmax, Lmax the model's
//             max_position_embeddings (HF uses it, not the original context)  (dynamic NTK)
//   yarn      ramp-blend of inv_freq and inv_freq/f over correction dims [low, high];
//             attention_scaling 0.1 ln f + 1 or mscale(f, mscale)/mscale(f, mscale_all_dim)
//             (Peng et al. 2023, "YaRN", arXiv:2309.00071)
//   llama3    wavelength bands: keep high frequencies, divide low ones by f, smooth in between
//   longrope  inv_freq_i = 1 / (ext_i theta^(2i/r)), ext = long_factor if L > L0 else short_factor;
//             attention_scaling sqrt(1 + ln f / ln L0)   (Ding et al. 2024, "LongRoPE")
//   proportional  the whole head rotates in pairs (i, i + Dh/2); the first p Dh/2 pairs turn at
//             theta^(-2i/Dh) / f, the rest at 0 (HF _compute_proportional_rope_parameters)
//   ntk_alpha theta' = theta alpha^(r/(r-2)), the default ladder over theta' at every length
//             (HunYuan's compute_ntk_alpha_rope_parameters: its 'dynamic' blocks with an alpha)
// xPos (Sun et al. 2022, "A Length-Extrapolatable Transformer"): q scaled by
// zeta_i^(p/scale_base), k by zeta_i^(-p/scale_base), zeta_i = (2i + 0.4 r) / (1.4 r).
//
// Angles (angle_dtype): float64 (default) computes inv_freq and p * inv_freq in float64 and rounds
// cos/sin to float32 once: exact to half a float32 ulp at any position. float32 computes them the
// way HF transformers does (float32 inv_freq from the same ATen ops as modeling_rope_utils, float32
// products, float32 cos/sin times attention_scaling), so a porter matches HF bit for bit; at
// position 65535 the two differ by up to ~2e-3 in cos/sin (HF's float32 rounding, not ours).
// rope_cos_sin follows the dtype of the inv_freq it is given. x of any float dtype is rotated in
// float32 and cast back.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/arg.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace posenc {

enum class RopeLayout { kHalf, kInterleaved };
std::string to_string(RopeLayout layout);
RopeLayout rope_layout_from_string(const std::string& name);

enum class RopeScaling {
  kDefault,
  kLinear,
  kDynamic,
  kYarn,
  kLlama3,
  kLongRope,
  kProportional,
  kNtkAlpha
};
std::string to_string(RopeScaling scaling);
/// HF names: default, linear, dynamic, yarn, llama3, longrope (legacy alias "su"), proportional,
/// ntk_alpha.
RopeScaling rope_scaling_from_string(const std::string& name);
/// The block keys a scaling type takes, as transformers' validators list them (its required and
/// optional keys; rope_type, rope_theta and partial_rotary_factor go with every type): linear and
/// dynamic {factor}; yarn {factor, original_max_position_embeddings, attention_factor, beta_fast,
/// beta_slow, mscale, mscale_all_dim, truncate}; longrope {short_factor, long_factor, factor,
/// original_max_position_embeddings, attention_factor}; llama3 {factor,
/// original_max_position_embeddings, low_freq_factor, high_freq_factor}; proportional {factor};
/// ntk_alpha {alpha}.
/// A scaling key outside its type's set is one warning and ignored, as in transformers.
bool rope_scaling_takes(RopeScaling scaling, const std::string& key);
/// The scaling-specific keys any type takes (the union of the sets above).
const std::vector<std::string>& rope_scaling_keys();

/// How rotary pairs are split among position axes (multi-axis RoPE: 2D/3D axial, M-RoPE).
///   kContiguous: axis a owns a run of sections[a] consecutive pairs (timm axial RoPE, Qwen2-VL
///                M-RoPE's mrope_section, ggml MROPE)
///   kInterleaved: pairs cycle over the axes t, h, w, t, h, w, ... skipping axes whose count is
///                used up (Qwen3-VL interleaved M-RoPE, ggml IMROPE)
enum class RopeSectionLayout { kContiguous, kInterleaved };
std::string to_string(RopeSectionLayout layout);

/// Which of the frequency source's r/2 frequencies each section's pairs turn at.
///   kPairOrder: pair i turns at the source's i-th frequency (M-RoPE's one ladder over the
///               sections; per_axis_frequencies: each section's ladder over its own pairs)
///   kDealt:     the source's frequencies are dealt in turn to the sections (round robin, a section
///               whose count is used up skipped), each section's share laid over its pairs in
///               order: Pixtral's rows the even, columns the odd frequencies of one ladder
///               theta^(-2i/r) (transformers' cat(inv_freq[0::2], inv_freq[1::2]))
enum class RopeFrequencyOrder { kPairOrder, kDealt };
std::string to_string(RopeFrequencyOrder order);

/// The arithmetic of the angles: kFloat64 (exact; default), kFloat32 (HF transformers' own), or
/// kFloat64Peer: float64 in the peers' op order, inv_freq = 1.0 / theta^(2i/d) (a reciprocal of
/// the pow, where kFloat64 takes pow(theta, -2i/d); the two differ in the last float64 bit), as
/// diffusers' get_1d_rotary_pos_embed(freqs_dtype=float64) computes it for Wan and SkyReels-V2
/// (per_axis_frequencies only).
enum class RopeAngleDtype { kFloat64, kFloat32, kFloat64Peer };
std::string to_string(RopeAngleDtype dtype);
RopeAngleDtype rope_angle_dtype_from_string(const std::string& name);

/// Where the r/2 rotary frequencies come from. rope_frequencies is the one dispatch point.
///   kLadder          theta^(-2i/r), reshaped by an HF rope_type scaling (RopeScalingOptions)
///   kPerAxisLadders  one ladder theta^(-2i/(2 s_a)) per section s_a of the section map, restarting
///                    in each (axial vision RoPE: timm's RotaryEmbeddingCat, ggml VISION)
///   kPeriods         2 pi / period for r/2 periods log-spaced over [min_period, max_period] in the
///                    positions' unit (real-time RoPE: torch_brain's RotaryTimeEmbedding)
enum class RopeFrequencySource { kLadder, kPerAxisLadders, kPeriods };
std::string to_string(RopeFrequencySource source);

/// HF transformers' rope_type scaling of the theta ladder (rope_parameters / legacy rope_scaling).
struct RopeScalingOptions {
  /// Scaling type (HF rope_type; default kDefault).
  TORCH_ARG(RopeScaling, rope_type) = RopeScaling::kDefault;
  /// Scaling factor f. Required by linear, dynamic and llama3; yarn and longrope default it to
  /// max_position_embeddings / original_max_position_embeddings, as HF does.
  TORCH_ARG(std::optional<double>, factor) = std::nullopt;
  /// The model's context length (HF max_position_embeddings; default 2048).
  TORCH_ARG(int64_t, max_position_embeddings) = 2048;
  /// Pre-training context L0 (default 0: take max_position_embeddings).
  TORCH_ARG(int64_t, original_max_position_embeddings) = 0;
  /// YaRN: rotations that bound the extrapolated (fast) band (default 32).
  TORCH_ARG(double, beta_fast) = 32.0;
  /// YaRN: rotations that bound the interpolated (slow) band (default 1).
  TORCH_ARG(double, beta_slow) = 1.0;
  /// YaRN/LongRoPE: explicit attention scaling (default: derived from factor).
  TORCH_ARG(std::optional<double>, attention_factor) = std::nullopt;
  /// YaRN: DeepSeek-style mscale (default unset).
  TORCH_ARG(std::optional<double>, mscale) = std::nullopt;
  /// YaRN: DeepSeek-style mscale_all_dim (default unset).
  TORCH_ARG(std::optional<double>, mscale_all_dim) = std::nullopt;
  /// YaRN: floor/ceil the correction range (default true).
  TORCH_ARG(bool, truncate) = true;
  /// Llama3: low-frequency factor (default 1).
  TORCH_ARG(double, low_freq_factor) = 1.0;
  /// Llama3: high-frequency factor (default 4).
  TORCH_ARG(double, high_freq_factor) = 4.0;
  /// LongRoPE: per-frequency divisors for L <= L0 (r/2 values).
  TORCH_ARG(std::vector<double>, short_factor);
  /// LongRoPE: per-frequency divisors for L > L0 (r/2 values).
  TORCH_ARG(std::vector<double>, long_factor);
  /// NTK-alpha: the base's stretch, theta' = theta alpha^(r/(r-2)) (required by ntk_alpha).
  TORCH_ARG(std::optional<double>, alpha) = std::nullopt;
};

/// The frequency source and its parameters. Only the source's own fields are read; a field of
/// another source left at a non-default value is an error (rope_validate), never ignored.
struct RopeFrequencyOptions {
  /// theta^(-2i/r) with an optional HF scaling.
  static RopeFrequencyOptions ladder(double theta = 10000.0, RopeScalingOptions scaling = {});
  /// One theta ladder per section of the section map.
  static RopeFrequencyOptions per_axis_ladders(double theta = 10000.0);
  /// Log-spaced periods in [min_period, max_period].
  static RopeFrequencyOptions periods(double min_period, double max_period);

  /// Which source (default kLadder).
  TORCH_ARG(RopeFrequencySource, source) = RopeFrequencySource::kLadder;
  /// theta, the ladder base (kLadder, kPerAxisLadders; default 10000).
  TORCH_ARG(double, theta) = 10000.0;
  /// The HF scaling of the ladder (kLadder only).
  TORCH_ARG(RopeScalingOptions, scaling);
  /// Shortest period (kPeriods only; > 0).
  TORCH_ARG(double, min_period) = 0.0;
  /// Longest period (kPeriods only; >= min_period).
  TORCH_ARG(double, max_period) = 0.0;
  /// Angle arithmetic (default kFloat64; kFloat32 reproduces HF transformers bit for bit: kLadder
  /// and kPerAxisLadders; kFloat64Peer diffusers' float64 ladders: kPerAxisLadders only).
  TORCH_ARG(RopeAngleDtype, angle_dtype) = RopeAngleDtype::kFloat64;
};

/// How rotary pairs are dealt to position axes. No sections (default): 1D RoPE on one axis.
struct RopeSectionMap {
  /// Rotary pairs per position axis (HF mrope_section, e.g. {16, 24, 24} for t, h, w; they sum to
  /// r/2). Empty: one axis.
  TORCH_ARG(std::vector<int64_t>, sections);
  /// How the sections are laid over the pairs (default kContiguous; kInterleaved as Qwen3-VL).
  TORCH_ARG(RopeSectionLayout, layout) = RopeSectionLayout::kContiguous;
  /// The coordinate axis each section reads (a permutation of 0 .. A-1; default empty: section a
  /// reads axis a). {1, 0} over (row, column) positions: columns first (Step 3.7's and Inkling
  /// 2's towers: cat(w, h)).
  TORCH_ARG(std::vector<int64_t>, axes);
  /// Which frequencies each section's pairs take (default kPairOrder; kDealt as Pixtral).
  TORCH_ARG(RopeFrequencyOrder, frequency_order) = RopeFrequencyOrder::kPairOrder;
};

/// RoPE = frequency source (what each pair turns at) + section map (which axis each pair reads)
/// + how pairs sit in the head (layout, partial rotary) + xPos. Config keys (registry): HF's
/// rope_theta/rope_type/... fill frequencies().scaling(); min_period/max_period choose kPeriods;
/// per_axis_frequencies: true chooses kPerAxisLadders; mrope_section/section_layout/section_axes/
/// frequency_order fill sections().
struct RopeOptions {
  explicit RopeOptions(int64_t head_dim = 64) : head_dim_(head_dim) {}
  /// Per-head dimension Dh. No default in configs: it comes from the model.
  TORCH_ARG(int64_t, head_dim);
  /// Pairing convention (default kHalf, as HF/Llama).
  TORCH_ARG(RopeLayout, layout) = RopeLayout::kHalf;
  /// Fraction of Dh that rotates (default 1.0); int(Dh * factor) must be even.
  TORCH_ARG(double, partial_rotary_factor) = 1.0;
  /// Where the frequencies come from (default: the theta=10000 ladder, unscaled).
  TORCH_ARG(RopeFrequencyOptions, frequencies);
  /// Which axis each pair reads (default: one axis).
  TORCH_ARG(RopeSectionMap, sections);
  /// s in angle = (s p) inv_freq, the positions scaled first, in the angles' dtype (default 1).
  /// DINOv3: 2 pi over patch centres in [-1, 1] (transformers' 2 * math.pi * coords * inv_freq).
  TORCH_ARG(double, position_scale) = 1.0;
  /// xPos length-extrapolation scaling (default false; one axis only).
  TORCH_ARG(bool, xpos) = false;
  /// xPos scale base (default 512).
  TORCH_ARG(double, xpos_scale_base) = 512.0;
  /// Use the fused kernels (posenc/kernels/rope_fused.h) where they apply (default true); false
  /// runs the reference rope_apply.
  TORCH_ARG(bool, fused) = true;
};

/// Checks every option; errors name the option, the expected and the actual value.
void rope_validate(const RopeOptions& options);
/// r = int(Dh * partial_rotary_factor); Dh for proportional (its non-rotating pairs turn at 0).
int64_t rope_rotary_dim(const RopeOptions& options);
/// L0: original_max_position_embeddings, or max_position_embeddings when unset.
int64_t rope_original_context(const RopeScalingOptions& scaling);
/// f: the factor option, or (yarn, longrope) max_position_embeddings / L0; 1 for default.
double rope_factor(const RopeScalingOptions& scaling);

struct RopeFrequencies {
  at::Tensor inv_freq;  ///< [r/2] float64 (float32 with angle_dtype kFloat32), after scaling
  double attention_scaling = 1.0;
};
/// inv_freq and attention scaling for a sequence of length seq_len (dynamic and longrope depend
/// on it; -1 means "no longer than the original context").
RopeFrequencies rope_frequencies(const RopeOptions& options, int64_t seq_len = -1);

/// positions [...] x inv_freq [F] -> (cos, sin) [..., F] float32, each times `scaling`. Angles in
/// float64, or in float32 as HF computes them when inv_freq is float32.
std::pair<at::Tensor, at::Tensor> rope_cos_sin(const at::Tensor& positions,
                                               const at::Tensor& inv_freq, double scaling = 1.0);
/// The axis of each of the F = sum(sections) pairs: [F] int64.
at::Tensor rope_section_axes(const std::vector<int64_t>& sections, RopeSectionLayout layout);
/// Section-major frequencies (section 0's, then section 1's, ...) in pair order: for each pair,
/// the index of its frequency in the section-major list ([F] int64; the identity for contiguous
/// sections, t0 h0 w0 t1 ... for interleaved ones).
at::Tensor rope_section_major_index(const std::vector<int64_t>& sections, RopeSectionLayout layout);
/// The sections' coordinates: coords [..., A] with column a replaced by column axes[a] (the
/// section map's axes; coords unchanged when empty). Checks that axes is a permutation of 0..A-1.
at::Tensor rope_section_coords(const at::Tensor& coords, const std::vector<int64_t>& axes);
/// Sectioned tables: pair i rotates by coords[..., axis(i)] * inv_freq[i].
/// coords [..., N, A], inv_freq [F] -> (cos, sin) [..., N, F] float32. The fused kernels take
/// these tables as they take 1D ones, so multi-axis RoPE costs what 1D RoPE costs.
std::pair<at::Tensor, at::Tensor> rope_cos_sin_sections(const at::Tensor& coords,
                                                        const at::Tensor& inv_freq,
                                                        const std::vector<int64_t>& sections,
                                                        RopeSectionLayout layout,
                                                        double scaling = 1.0);

/// xPos per-pair scale zeta_i^(p / scale_base): positions [...] -> [..., r/2] float32.
at::Tensor xpos_scale(const at::Tensor& positions, int64_t rotary_dim, double scale_base);

/// Reference rotation (plain ATen, autograd-able): the specification of the fused kernels.
/// x: [B, N, H, Dh]; cos, sin: [N, F] or [B, N, F] with 2F <= Dh. Dims 2F.. pass through.
at::Tensor rope_apply(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                      RopeLayout layout);
/// The rotation itself: x [..., Dh]; cos, sin broadcastable to x's pair view [..., F].
/// rope_apply and the per-head variant (RoPE-Mixed) call it.
at::Tensor rope_rotate_pairs(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                             RopeLayout layout);
/// A per-pair table [..., F] laid out over the rotary width [..., 2F] in the layout's order
/// (half: cat(t, t) as HF's cos/sin; interleaved: t0 t0 t1 t1 ...).
at::Tensor rope_expand(const at::Tensor& per_pair, RopeLayout layout);

}  // namespace posenc
