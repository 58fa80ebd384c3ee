// The RoPE scaling types, one unit each (include/posenc/functional/rope_scaling.h). Each unit's
// math follows transformers' modeling_rope_utils.py (transformers 5), with r the rotary dims,
// theta the base, f the factor, L0 the original context (original_max_position_embeddings, else
// max_position_embeddings):
//   default       inv_i = theta^(-2i/r)
//   linear        inv_i / f                                  (position interpolation)
//   dynamic       theta' = theta (f L / L_max - (f - 1))^(r/(r-2)) for L > L_max   (dynamic NTK)
//   yarn          blend of inv_i and inv_i / f over the ramp [low, high] of correction dims;
//                 attention scaling 0.1 ln f + 1 (or DeepSeek's mscale ratio, or attention_factor)
//   llama3        inv_i / f beyond L0 / low_freq_factor wavelengths, inv_i below L0 /
//                 high_freq_factor, smoothed between
//   longrope      1 / (ext_i theta^(2i/r)), ext = long_factor past L0, short_factor within;
//                 attention scaling sqrt(1 + ln f / ln L0)
//   proportional  theta^(-2i/Dh) for the rotating pairs, 0 for the rest, / f (Gemma 4)
//   ntk_alpha     theta' = theta alpha^(r/(r-2)); inv_i = theta'^(-2i/r) at every length (HunYuan's
//                 compute_ntk_alpha_rope_parameters,
//                 models/hunyuan_v1_dense/modeling_hunyuan_v1_dense.py: the class reads a 'dynamic'
//                 block with a non-zero alpha as this type)
//
// Two arithmetics: Exact (float64) and Hf32 (transformers' float32, op for op, so its bits). A
// unit's frequencies are one template over them where the formula is written the same way;
// dynamic is two functions because transformers' differs in kind: it keeps the frequencies made
// at init up to the context and computes the grown base as a float32 tensor past it.
#include "posenc/functional/rope_scaling.h"

#include <torch/torch.h>

#include <cmath>

namespace posenc {

namespace {

// ---- the two arithmetics ---------------------------------------------------------------------

struct Exact {
  static constexpr auto dtype = torch::kFloat64;
  // theta^(-2i/denominator), i < dim/2
  static at::Tensor ladder(double theta, int64_t dim, int64_t denominator) {
    return torch::pow(
        theta, -torch::arange(0, dim, 2, torch::kFloat64) / static_cast<double>(denominator));
  }
  // 2i/r, i < r/2
  static at::Tensor exponents(int64_t r) {
    return torch::arange(0, r, 2, torch::kFloat64) / static_cast<double>(r);
  }
  // yarn's extrapolation (theta^(-2i/r)) and interpolation (that / f) bands
  static std::pair<at::Tensor, at::Tensor> yarn_bands(double theta, int64_t r, double f) {
    auto extrapolation = ladder(theta, r, r);
    return {extrapolation, extrapolation / f};
  }
  // k / t, one rounding
  static at::Tensor over(double k, const at::Tensor& t) { return k / t; }
};

// Python's `1.0 / t` is t.reciprocal() * 1.0 and `base ** t` is torch.pow(base, t); the same ATen
// ops on the same float32 values give the same bits.
struct Hf32 {
  static constexpr auto dtype = torch::kFloat32;
  // 1.0 / (base ** (arange(0, dim, 2).float() / denominator))
  static at::Tensor ladder(double theta, int64_t dim, int64_t denominator) {
    auto exponents = torch::arange(0, dim, 2, torch::kLong).to(torch::kFloat32) / denominator;
    return torch::pow(at::Scalar(theta), exponents).reciprocal();
  }
  static at::Tensor exponents(int64_t r) {
    return torch::arange(0, r, 2, torch::kLong).to(torch::kFloat32) / r;
  }
  // pos_freqs = base ** (arange(0, dim, 2).float() / dim); 1 / pos_freqs, 1 / (f * pos_freqs)
  static std::pair<at::Tensor, at::Tensor> yarn_bands(double theta, int64_t r, double f) {
    auto pos_freqs = torch::pow(at::Scalar(theta), torch::arange(0, r, 2).to(torch::kFloat32) / r);
    return {pos_freqs.reciprocal(), pos_freqs.mul(f).reciprocal()};
  }
  // Python's `k / t` on a tensor: t.reciprocal() * k
  static at::Tensor over(double k, const at::Tensor& t) { return t.reciprocal().mul(k); }
};

double theta_of(const RopeScalingContext& c) { return c.options.frequencies().theta(); }
const RopeScalingOptions& scaling_of(const RopeScalingContext& c) {
  return c.options.frequencies().scaling();
}

double max_over_original(const RopeScalingOptions& s) {
  return static_cast<double>(s.max_position_embeddings()) /
         static_cast<double>(rope_original_context(s));
}
double one(const RopeScalingOptions&) { return 1.0; }

// ---- default, linear ---------------------------------------------------------------------------

template <typename A>
RopeFrequencies default_frequencies(const RopeScalingContext& c) {
  return {A::ladder(theta_of(c), c.rotary_dim, c.rotary_dim), 1.0};
}

template <typename A>
RopeFrequencies linear_frequencies(const RopeScalingContext& c) {
  return {A::ladder(theta_of(c), c.rotary_dim, c.rotary_dim) / rope_factor(scaling_of(c)), 1.0};
}

// ---- dynamic NTK -------------------------------------------------------------------------------

RopeFrequencies dynamic_exact(const RopeScalingContext& c) {
  const auto& s = scaling_of(c);
  const int64_t r = c.rotary_dim;
  const double f = rope_factor(s), theta = theta_of(c);
  const int64_t context = s.max_position_embeddings();
  const double length = static_cast<double>(std::max(c.seq_len, context));
  const double grown =
      theta * std::pow(f * length / context - (f - 1), static_cast<double>(r) / (r - 2));
  return {Exact::ladder(grown, r, r), 1.0};
}

// At or below the context, HF keeps the frequencies made at init (python floats: theta); beyond
// it, dynamic_rope_update passes seq_len as a tensor and the base is float32.
RopeFrequencies dynamic_hf32(const RopeScalingContext& c) {
  const auto& s = scaling_of(c);
  const int64_t r = c.rotary_dim;
  const int64_t context = s.max_position_embeddings();
  if (c.seq_len <= context) return {Hf32::ladder(theta_of(c), r, r), 1.0};
  const double f = rope_factor(s);
  auto length = torch::scalar_tensor(c.seq_len, torch::kLong);
  auto grown = torch::pow(length.mul(f) / context - (f - 1),
                          static_cast<double>(r) / static_cast<double>(r - 2))
                   .mul(theta_of(c));
  return {torch::pow(grown, Hf32::exponents(r)).reciprocal(), 1.0};
}

// ---- YaRN --------------------------------------------------------------------------------------

double yarn_mscale(double scale, double mscale) {
  return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

// Dimension index whose wavelength makes `rotations` turns over the context L0.
double yarn_correction_dim(double rotations, int64_t r, double theta, int64_t context) {
  return r * std::log(static_cast<double>(context) / (rotations * 2 * M_PI)) /
         (2 * std::log(theta));
}

// YaRN's ramp bounds [low, high] over the r/2 pairs (python floats in transformers too).
std::pair<double, double> yarn_ramp(const RopeScalingOptions& s, int64_t r, double theta) {
  const int64_t context = rope_original_context(s);
  double low = yarn_correction_dim(s.beta_fast(), r, theta, context);
  double high = yarn_correction_dim(s.beta_slow(), r, theta, context);
  if (s.truncate()) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(r - 1));
  if (low == high) high += 0.001;  // avoid a zero-width ramp
  return {low, high};
}

double yarn_attention(const RopeScalingOptions& s) {
  const double f = rope_factor(s);
  if (s.attention_factor()) return *s.attention_factor();
  if (s.mscale() && s.mscale_all_dim() && *s.mscale() != 0 && *s.mscale_all_dim() != 0)
    return yarn_mscale(f, *s.mscale()) / yarn_mscale(f, *s.mscale_all_dim());
  return yarn_mscale(f, 1.0);
}

template <typename A>
RopeFrequencies yarn_frequencies(const RopeScalingContext& c) {
  const auto& s = scaling_of(c);
  const int64_t r = c.rotary_dim;
  const auto [low, high] = yarn_ramp(s, r, theta_of(c));
  const auto [extrapolation, interpolation] = A::yarn_bands(theta_of(c), r, rope_factor(s));
  // gamma_i = clamp((i - low) / (high - low), 0, 1); weight of extrapolation = 1 - gamma
  auto ramp = ((torch::arange(r / 2, A::dtype) - low) / (high - low)).clamp(0, 1);
  auto extrapolation_weight = 1 - ramp;
  auto inv = interpolation * (1 - extrapolation_weight) + extrapolation * extrapolation_weight;
  return {inv, yarn_attention(s)};
}

void yarn_validate(const RopeScalingOptions& s, const RopeOptions&, int64_t) {
  TORCH_CHECK(s.beta_fast() > 0 && s.beta_slow() > 0,
              "rope: yarn beta_fast and beta_slow must be positive, got ", s.beta_fast(), " and ",
              s.beta_slow());
}

// ---- Llama 3 -----------------------------------------------------------------------------------

template <typename A>
RopeFrequencies llama3_frequencies(const RopeScalingContext& c) {
  const auto& s = scaling_of(c);
  auto inv = A::ladder(theta_of(c), c.rotary_dim, c.rotary_dim);
  const double f = rope_factor(s);
  const double context = static_cast<double>(rope_original_context(s));
  const double low_wavelen = context / s.low_freq_factor();
  const double high_wavelen = context / s.high_freq_factor();
  auto wavelen = A::over(2 * M_PI, inv);
  auto scaled = torch::where(wavelen > low_wavelen, inv / f, inv);
  auto smooth = (A::over(context, wavelen) - s.low_freq_factor()) /
                (s.high_freq_factor() - s.low_freq_factor());
  auto smoothed = (1 - smooth) * scaled / f + smooth * scaled;
  auto medium = (wavelen < high_wavelen).logical_not() * (wavelen > low_wavelen).logical_not();
  TORCH_CHECK(s.high_freq_factor() > s.low_freq_factor() || !medium.any().template item<bool>(),
              "rope: llama3 with high_freq_factor == low_freq_factor (", s.low_freq_factor(),
              ") and a wavelength exactly at the band edge: transformers' smoothing divides by "
              "zero there (NaN), so there is no table to match");
  return {torch::where(medium, smoothed, scaled), 1.0};
}

// Equal factors (Llama 4 Scout: 1.0 and 1.0) leave no medium band: every frequency is either
// kept or divided by the factor, as in transformers (its smooth term, x / 0, is never selected).
void llama3_validate(const RopeScalingOptions& s, const RopeOptions&, int64_t) {
  TORCH_CHECK(s.high_freq_factor() >= s.low_freq_factor(),
              "rope: llama3 needs high_freq_factor >= low_freq_factor, got ", s.high_freq_factor(),
              " and ", s.low_freq_factor());
}

// ---- LongRoPE ----------------------------------------------------------------------------------

double longrope_attention(const RopeScalingOptions& s) {
  if (s.attention_factor()) return *s.attention_factor();
  const double f = rope_factor(s);
  if (f <= 1) return 1.0;
  return std::sqrt(1 + std::log(f) / std::log(static_cast<double>(rope_original_context(s))));
}

template <typename A>
RopeFrequencies longrope_frequencies(const RopeScalingContext& c) {
  const auto& s = scaling_of(c);
  const auto& ext = c.seq_len > rope_original_context(s) ? s.long_factor() : s.short_factor();
  auto ext_t = torch::tensor(ext, torch::kFloat64).to(A::dtype);
  auto inv = (ext_t * torch::pow(at::Scalar(theta_of(c)), A::exponents(c.rotary_dim))).reciprocal();
  return {inv, longrope_attention(s)};
}

void longrope_validate(const RopeScalingOptions& s, const RopeOptions&, int64_t r) {
  const size_t half = static_cast<size_t>(r / 2);
  TORCH_CHECK(s.short_factor().size() == half, "rope: longrope short_factor must have r/2 = ", half,
              " values, got ", s.short_factor().size());
  TORCH_CHECK(s.long_factor().size() == half, "rope: longrope long_factor must have r/2 = ", half,
              " values, got ", s.long_factor().size());
}

// ---- proportional ------------------------------------------------------------------------------

template <typename A>
RopeFrequencies proportional_frequencies(const RopeScalingContext& c) {
  const auto& o = c.options;
  const int64_t rotating = static_cast<int64_t>(o.partial_rotary_factor() * o.head_dim()) / 2;
  auto inv = torch::cat({A::ladder(theta_of(c), 2 * rotating, o.head_dim()),
                         torch::zeros({o.head_dim() / 2 - rotating}, A::dtype)});
  return {inv / rope_factor(scaling_of(c)), 1.0};
}

void proportional_validate(const RopeScalingOptions&, const RopeOptions& o, int64_t) {
  TORCH_CHECK(o.head_dim() % 2 == 0,
              "rope: proportional rotates the whole head; head_dim must be even, got ",
              o.head_dim());
  TORCH_CHECK(o.sections().sections().empty() && !o.xpos(),
              "rope: proportional does not combine with mrope_section or xpos");
}

// ---- NTK-alpha (HunYuan) -----------------------------------------------------------------------

// theta' in Python floats, as transformers computes it (theta * alpha ** (dim / (dim - 2))); both
// arithmetics then take the default ladder over theta'.
double ntk_alpha_base(const RopeScalingContext& c) {
  const int64_t r = c.rotary_dim;
  return theta_of(c) *
         std::pow(*scaling_of(c).alpha(), static_cast<double>(r) / static_cast<double>(r - 2));
}

template <typename A>
RopeFrequencies ntk_alpha_frequencies(const RopeScalingContext& c) {
  return {A::ladder(ntk_alpha_base(c), c.rotary_dim, c.rotary_dim), 1.0};
}

void ntk_alpha_validate(const RopeScalingOptions& s, const RopeOptions&, int64_t r) {
  TORCH_CHECK(s.alpha().has_value(),
              "rope: ntk_alpha needs 'alpha' (theta' = theta alpha^(r/(r-2)))");
  TORCH_CHECK(std::isfinite(*s.alpha()) && *s.alpha() > 0,
              "rope: ntk_alpha 'alpha' must be a positive finite number, got ", *s.alpha());
  TORCH_CHECK(r > 2, "rope: ntk_alpha needs a rotary dim above 2 (alpha^(r/(r-2))), got ", r);
}

// ---- the table ---------------------------------------------------------------------------------

const RopeScalingDependency kOriginalContext{
    "original_max_position_embeddings",
    "transformers reads the pre-training context from the block or from the top level of "
    "config.json (Phi-3 keeps it there), else from 'max_position_embeddings'",
    false};
const RopeScalingDependency kContextForFactor{
    "max_position_embeddings",
    "without 'factor', transformers takes max_position_embeddings / "
    "original_max_position_embeddings; posenc's default would be 2048",
    true};

std::vector<RopeScalingUnit> make_units() {
  std::vector<RopeScalingUnit> units;
  {
    RopeScalingUnit u{RopeScaling::kDefault, "default", {}, "_compute_default_rope_parameters"};
    u.scales = false;
    u.default_factor = one;
    u.exact = default_frequencies<Exact>;
    u.hf32 = default_frequencies<Hf32>;
    units.push_back(u);
  }
  {
    RopeScalingUnit u{
        RopeScaling::kLinear, "linear", {}, "_compute_linear_scaling_rope_parameters"};
    u.keys = {"factor"};
    u.factor_below_one = true;
    u.exact = linear_frequencies<Exact>;
    u.hf32 = linear_frequencies<Hf32>;
    units.push_back(u);
  }
  {
    RopeScalingUnit u{RopeScaling::kDynamic, "dynamic", {}, "_compute_dynamic_ntk_parameters"};
    u.keys = {"factor"};
    u.dependencies = {{"max_position_embeddings",
                       "dynamic NTK grows theta past the model's context, which transformers reads "
                       "from the top-level 'max_position_embeddings'; posenc's default would be "
                       "2048",
                       false}};
    u.exact = dynamic_exact;
    u.hf32 = dynamic_hf32;
    units.push_back(u);
  }
  {
    RopeScalingUnit u{RopeScaling::kYarn, "yarn", {}, "_compute_yarn_parameters"};
    u.keys = {"factor",           "original_max_position_embeddings",
              "attention_factor", "beta_fast",
              "beta_slow",        "mscale",
              "mscale_all_dim",   "truncate"};
    u.dependencies = {kOriginalContext, kContextForFactor};
    u.default_factor = max_over_original;
    u.validate = yarn_validate;
    u.exact = yarn_frequencies<Exact>;
    u.hf32 = yarn_frequencies<Hf32>;
    units.push_back(u);
  }
  {
    RopeScalingUnit u{RopeScaling::kLlama3, "llama3", {}, "_compute_llama3_parameters"};
    u.keys = {"factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor"};
    u.dependencies = {kOriginalContext};
    u.validate = llama3_validate;
    u.exact = llama3_frequencies<Exact>;
    u.hf32 = llama3_frequencies<Hf32>;
    units.push_back(u);
  }
  {
    RopeScalingUnit u{RopeScaling::kLongRope, "longrope", {"su"}, "_compute_longrope_parameters"};
    u.keys = {"short_factor", "long_factor", "factor", "original_max_position_embeddings",
              "attention_factor"};
    u.dependencies = {kOriginalContext, kContextForFactor};
    u.factor_below_one = true;
    u.default_factor = max_over_original;
    u.validate = longrope_validate;
    u.exact = longrope_frequencies<Exact>;
    u.hf32 = longrope_frequencies<Hf32>;
    units.push_back(u);
  }
  {
    RopeScalingUnit u{
        RopeScaling::kProportional, "proportional", {}, "_compute_proportional_rope_parameters"};
    u.keys = {"factor"};
    u.scales = false;
    u.rotates_whole_head = true;
    u.default_factor = one;
    u.validate = proportional_validate;
    u.exact = proportional_frequencies<Exact>;
    u.hf32 = proportional_frequencies<Hf32>;
    units.push_back(u);
  }
  {
    RopeScalingUnit u{RopeScaling::kNtkAlpha,
                      "ntk_alpha",
                      {},
                      "HunYuanDenseV1RotaryEmbedding.compute_ntk_alpha_rope_parameters"};
    u.keys = {"alpha"};
    u.scales = false;
    u.default_factor = one;
    u.validate = ntk_alpha_validate;
    u.exact = ntk_alpha_frequencies<Exact>;
    u.hf32 = ntk_alpha_frequencies<Hf32>;
    units.push_back(u);
  }
  return units;
}

}  // namespace

const std::vector<RopeScalingUnit>& rope_scaling_units() {
  static const std::vector<RopeScalingUnit> units = [] {
    auto made = make_units();
    for (size_t i = 0; i < made.size(); ++i)  // the table is indexed by the enum
      TORCH_INTERNAL_ASSERT(static_cast<size_t>(made[i].type) == i && made[i].exact &&
                            made[i].hf32);
    return made;
  }();
  return units;
}

const RopeScalingUnit& rope_scaling_unit(RopeScaling type) {
  const auto& units = rope_scaling_units();
  const auto index = static_cast<size_t>(type);
  TORCH_CHECK(index < units.size(), "rope: unknown rope_type value ", index);
  return units[index];
}

at::Tensor rope_ladder(double theta, int64_t dim, int64_t denominator, RopeAngleDtype dtype) {
  switch (dtype) {
    case RopeAngleDtype::kFloat32:
      return Hf32::ladder(theta, dim, denominator);
    case RopeAngleDtype::kFloat64Peer:  // 1.0 / (theta ** (arange(0, dim, 2, float64) /
                                        // denominator))
      return torch::pow(at::Scalar(theta), torch::arange(0, dim, 2, torch::kFloat64) /
                                               static_cast<double>(denominator))
          .reciprocal();
    case RopeAngleDtype::kFloat64:
      break;
  }
  return Exact::ladder(theta, dim, denominator);
}

}  // namespace posenc
