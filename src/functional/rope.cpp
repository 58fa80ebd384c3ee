// RoPE frequencies, scalings and the reference rotation; the math is in
// include/posenc/functional/rope.h. Scalings reproduce HF transformers' modeling_rope_utils
// (_compute_*_parameters); tests/fixtures/rope.json holds values generated from it.
#include "posenc/functional/rope.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>

#include "posenc/functional/time.h"

namespace posenc {

std::string to_string(RopeLayout layout) {
  switch (layout) {
    case RopeLayout::kHalf:
      return "half";
    case RopeLayout::kInterleaved:
      return "interleaved";
  }
  return "unknown";
}

RopeLayout rope_layout_from_string(const std::string& name) {
  if (name == "half" || name == "neox") return RopeLayout::kHalf;
  if (name == "interleaved" || name == "gptj") return RopeLayout::kInterleaved;
  TORCH_CHECK(false, "rope: unknown layout '", name, "'; expected one of: half, interleaved");
}

std::string to_string(RopeScaling scaling) {
  switch (scaling) {
    case RopeScaling::kDefault:
      return "default";
    case RopeScaling::kLinear:
      return "linear";
    case RopeScaling::kDynamic:
      return "dynamic";
    case RopeScaling::kYarn:
      return "yarn";
    case RopeScaling::kLlama3:
      return "llama3";
    case RopeScaling::kLongRope:
      return "longrope";
    case RopeScaling::kProportional:
      return "proportional";
  }
  return "unknown";
}

std::string to_string(RopeAngleDtype dtype) {
  return dtype == RopeAngleDtype::kFloat32 ? "float32" : "float64";
}

RopeAngleDtype rope_angle_dtype_from_string(const std::string& name) {
  if (name == "float64") return RopeAngleDtype::kFloat64;
  if (name == "float32") return RopeAngleDtype::kFloat32;
  TORCH_CHECK(false, "rope: unknown angle_dtype '", name, "'; expected one of: float64, float32");
}

namespace {
// The block keys each scaling type takes (transformers' validators: required and optional keys).
const std::vector<std::string>& scaling_keys_of(RopeScaling scaling) {
  static const std::vector<std::string> none, linear{"factor"},
      yarn{"factor",           "original_max_position_embeddings",
           "attention_factor", "beta_fast",
           "beta_slow",        "mscale",
           "mscale_all_dim",   "truncate"},
      longrope{"short_factor", "long_factor", "factor", "original_max_position_embeddings",
               "attention_factor"},
      llama3{"factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor"};
  switch (scaling) {
    case RopeScaling::kDefault:
      return none;
    case RopeScaling::kLinear:
    case RopeScaling::kDynamic:
    case RopeScaling::kProportional:
      return linear;
    case RopeScaling::kYarn:
      return yarn;
    case RopeScaling::kLongRope:
      return longrope;
    case RopeScaling::kLlama3:
      return llama3;
  }
  return none;
}
}  // namespace

bool rope_scaling_takes(RopeScaling scaling, const std::string& key) {
  const auto& keys = scaling_keys_of(scaling);
  return std::find(keys.begin(), keys.end(), key) != keys.end();
}

const std::vector<std::string>& rope_scaling_keys() {
  static const std::vector<std::string> keys = [] {  // the union of every type's keys
    std::vector<std::string> all;
    for (auto type :
         {RopeScaling::kLinear, RopeScaling::kYarn, RopeScaling::kLongRope, RopeScaling::kLlama3})
      for (const auto& key : scaling_keys_of(type))
        if (std::find(all.begin(), all.end(), key) == all.end()) all.push_back(key);
    return all;
  }();
  return keys;
}

RopeScaling rope_scaling_from_string(const std::string& name) {
  if (name == "default") return RopeScaling::kDefault;
  if (name == "linear") return RopeScaling::kLinear;
  if (name == "dynamic") return RopeScaling::kDynamic;
  if (name == "yarn") return RopeScaling::kYarn;
  if (name == "llama3") return RopeScaling::kLlama3;
  if (name == "longrope" || name == "su") return RopeScaling::kLongRope;
  if (name == "proportional") return RopeScaling::kProportional;
  TORCH_CHECK(false, "rope: unknown rope_type '", name,
              "'; expected one of: default, linear, dynamic, yarn, llama3, longrope, proportional");
}

std::string to_string(RopeFrequencySource source) {
  switch (source) {
    case RopeFrequencySource::kLadder:
      return "ladder";
    case RopeFrequencySource::kPerAxisLadders:
      return "per_axis_ladders";
    case RopeFrequencySource::kPeriods:
      return "periods";
  }
  return "unknown";
}

RopeFrequencyOptions RopeFrequencyOptions::ladder(double theta, RopeScalingOptions scaling) {
  return RopeFrequencyOptions().theta(theta).scaling(std::move(scaling));
}

RopeFrequencyOptions RopeFrequencyOptions::per_axis_ladders(double theta) {
  return RopeFrequencyOptions().source(RopeFrequencySource::kPerAxisLadders).theta(theta);
}

RopeFrequencyOptions RopeFrequencyOptions::periods(double min_period, double max_period) {
  return RopeFrequencyOptions()
      .source(RopeFrequencySource::kPeriods)
      .min_period(min_period)
      .max_period(max_period);
}

int64_t rope_rotary_dim(const RopeOptions& o) {
  if (o.frequencies().source() == RopeFrequencySource::kLadder &&
      o.frequencies().scaling().rope_type() == RopeScaling::kProportional)
    return o.head_dim();
  return static_cast<int64_t>(static_cast<double>(o.head_dim()) * o.partial_rotary_factor());
}

int64_t rope_original_context(const RopeScalingOptions& s) {
  return s.original_max_position_embeddings() > 0 ? s.original_max_position_embeddings()
                                                  : s.max_position_embeddings();
}

double rope_factor(const RopeScalingOptions& s) {
  if (s.factor()) return *s.factor();
  switch (s.rope_type()) {
    case RopeScaling::kYarn:
    case RopeScaling::kLongRope:
      return static_cast<double>(s.max_position_embeddings()) /
             static_cast<double>(rope_original_context(s));
    case RopeScaling::kDefault:
    case RopeScaling::kProportional:
      return 1.0;
    default:
      TORCH_CHECK(false, "rope: rope_type '", to_string(s.rope_type()), "' needs a 'factor'");
  }
}

namespace {

// The HF scaling of a theta ladder over r rotary dims.
void validate_scaling(const RopeScalingOptions& s, const RopeOptions& o, int64_t r) {
  TORCH_CHECK(s.max_position_embeddings() > 0,
              "rope: max_position_embeddings must be positive, got ", s.max_position_embeddings());
  TORCH_CHECK(s.original_max_position_embeddings() >= 0,
              "rope: original_max_position_embeddings must be >= 0, got ",
              s.original_max_position_embeddings());
  if (s.rope_type() == RopeScaling::kProportional) {
    TORCH_CHECK(o.head_dim() % 2 == 0,
                "rope: proportional rotates the whole head; head_dim must be ", "even, got ",
                o.head_dim());
    TORCH_CHECK(o.sections().sections().empty() && !o.xpos(),
                "rope: proportional does not combine with mrope_section or xpos");
  }
  const bool scaled =
      s.rope_type() != RopeScaling::kDefault && s.rope_type() != RopeScaling::kProportional;
  if (scaled) {
    const double f = rope_factor(s);
    TORCH_CHECK(f > 0 && std::isfinite(f), "rope: factor must be positive, got ", f);
    TORCH_CHECK(
        f >= 1 || s.rope_type() == RopeScaling::kLinear || s.rope_type() == RopeScaling::kLongRope,
        "rope: ", to_string(s.rope_type()), " needs factor >= 1, got ", f);
  }
  if (s.rope_type() == RopeScaling::kYarn) {
    TORCH_CHECK(s.beta_fast() > 0 && s.beta_slow() > 0,
                "rope: yarn beta_fast and beta_slow must be positive, got ", s.beta_fast(), " and ",
                s.beta_slow());
  }
  if (s.rope_type() == RopeScaling::kLlama3) {
    TORCH_CHECK(s.high_freq_factor() > s.low_freq_factor(),
                "rope: llama3 needs high_freq_factor > low_freq_factor, got ", s.high_freq_factor(),
                " and ", s.low_freq_factor());
  }
  if (s.rope_type() == RopeScaling::kLongRope) {
    const size_t half = static_cast<size_t>(r / 2);
    TORCH_CHECK(s.short_factor().size() == half,
                "rope: longrope short_factor must have r/2 = ", half, " values, got ",
                s.short_factor().size());
    TORCH_CHECK(s.long_factor().size() == half, "rope: longrope long_factor must have r/2 = ", half,
                " values, got ", s.long_factor().size());
  }
}

}  // namespace

void rope_validate(const RopeOptions& o) {
  TORCH_CHECK(o.head_dim() > 0, "rope: head_dim must be positive, got ", o.head_dim());
  TORCH_CHECK(o.partial_rotary_factor() > 0 && o.partial_rotary_factor() <= 1,
              "rope: partial_rotary_factor must be in (0, 1], got ", o.partial_rotary_factor());
  const int64_t r = rope_rotary_dim(o);
  TORCH_CHECK(r >= 2 && r % 2 == 0,
              "rope: the rotary dimension int(head_dim * partial_rotary_factor)",
              " must be even and >= 2, got ", r, " (head_dim=", o.head_dim(),
              ", partial_rotary_factor=", o.partial_rotary_factor(), ")");
  const auto& f = o.frequencies();
  const auto& sections = o.sections().sections();
  // Fields of another source: an error, never silently ignored.
  const std::string source = to_string(f.source());
  const bool unscaled = f.scaling().rope_type() == RopeScaling::kDefault;
  switch (f.source()) {
    case RopeFrequencySource::kLadder:
      TORCH_CHECK(f.theta() > 1 && std::isfinite(f.theta()), "rope: rope_theta must be > 1, got ",
                  f.theta());
      TORCH_CHECK(f.min_period() == 0 && f.max_period() == 0,
                  "rope: min_period/max_period belong to the periods frequency source, not the ",
                  source, " (got min_period=", f.min_period(), ", max_period=", f.max_period(),
                  ")");
      validate_scaling(f.scaling(), o, r);
      break;
    case RopeFrequencySource::kPerAxisLadders:
      TORCH_CHECK(f.theta() > 1 && std::isfinite(f.theta()), "rope: rope_theta must be > 1, got ",
                  f.theta());
      TORCH_CHECK(!sections.empty(),
                  "rope: per_axis_frequencies deals one ladder per section; it needs "
                  "mrope_section (one entry per axis), got none");
      TORCH_CHECK(o.sections().layout() == RopeSectionLayout::kContiguous && unscaled,
                  "rope: per_axis_frequencies needs section_layout contiguous and rope_type "
                  "default, got ",
                  to_string(o.sections().layout()), " and ", to_string(f.scaling().rope_type()));
      TORCH_CHECK(f.min_period() == 0 && f.max_period() == 0,
                  "rope: min_period/max_period and per_axis_frequencies are two frequency "
                  "sources; give one");
      break;
    case RopeFrequencySource::kPeriods:
      TORCH_CHECK(
          f.min_period() > 0 && f.max_period() >= f.min_period() && std::isfinite(f.max_period()),
          "rope: periods need 0 < min_period <= max_period, got min_period=", f.min_period(),
          ", max_period=", f.max_period());
      TORCH_CHECK(unscaled,
                  "rope: min_period/max_period replace the frequency ladder; rope_type must be "
                  "default, got ",
                  to_string(f.scaling().rope_type()));
      TORCH_CHECK(f.theta() == RopeFrequencyOptions().theta(),
                  "rope: min_period/max_period replace the frequency ladder; rope_theta (",
                  f.theta(), ") would be ignored: remove it");
      break;
  }
  TORCH_CHECK(
      f.angle_dtype() == RopeAngleDtype::kFloat64 || f.source() != RopeFrequencySource::kPeriods,
      "rope: angle_dtype float32 reproduces HF's ladders; it does not apply to the ", source,
      " frequency source (min_period/max_period)");
  if (!sections.empty()) {
    int64_t pairs = 0;
    for (auto section : sections) {
      TORCH_CHECK(section >= 0, "rope: mrope_section entries must be >= 0, got ", section);
      pairs += section;
    }
    TORCH_CHECK(pairs == r / 2, "rope: mrope_section sums to ", pairs,
                " pairs but the rotary dimension has r/2 = ", r / 2);
    TORCH_CHECK(!o.xpos(), "rope: xpos is not supported with mrope_section");
  }
  TORCH_CHECK(!o.xpos() || o.xpos_scale_base() > 0, "rope: xpos_scale_base must be positive, got ",
              o.xpos_scale_base());
}

namespace {

// theta^(-2i/r) in float64: [r/2]
at::Tensor base_inv_freq(double theta, int64_t r) {
  return torch::pow(theta, -torch::arange(0, r, 2, torch::kFloat64) / static_cast<double>(r));
}

double yarn_mscale(double scale, double mscale) {
  return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

// Dimension index whose wavelength makes `rotations` turns over the context L0.
double yarn_correction_dim(double rotations, int64_t r, double theta, int64_t context) {
  return r * std::log(static_cast<double>(context) / (rotations * 2 * M_PI)) /
         (2 * std::log(theta));
}

// YaRN's ramp bounds [low, high] over the r/2 pairs.
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

double longrope_attention(const RopeScalingOptions& s) {
  if (s.attention_factor()) return *s.attention_factor();
  const double f = rope_factor(s);
  if (f <= 1) return 1.0;
  return std::sqrt(1 + std::log(f) / std::log(static_cast<double>(rope_original_context(s))));
}

// theta ladder with an HF scaling, float64.
RopeFrequencies scaled_ladder(const RopeOptions& o, int64_t r, int64_t seq_len) {
  const auto& s = o.frequencies().scaling();
  const double theta = o.frequencies().theta();
  switch (s.rope_type()) {
    case RopeScaling::kDefault:
      return {base_inv_freq(theta, r), 1.0};
    case RopeScaling::kLinear:
      return {base_inv_freq(theta, r) / rope_factor(s), 1.0};
    case RopeScaling::kDynamic: {
      const double f = rope_factor(s);
      const int64_t context = s.max_position_embeddings();
      const double length = static_cast<double>(std::max(seq_len, context));
      const double grown =
          theta * std::pow(f * length / context - (f - 1), static_cast<double>(r) / (r - 2));
      return {base_inv_freq(grown, r), 1.0};
    }
    case RopeScaling::kYarn: {
      const auto [low, high] = yarn_ramp(s, r, theta);
      auto extrapolation = base_inv_freq(theta, r);
      auto interpolation = extrapolation / rope_factor(s);
      // gamma_i = clamp((i - low) / (high - low), 0, 1); weight of extrapolation = 1 - gamma
      auto ramp = ((torch::arange(r / 2, torch::kFloat64) - low) / (high - low)).clamp(0, 1);
      auto extrapolation_weight = 1 - ramp;
      auto inv = interpolation * (1 - extrapolation_weight) + extrapolation * extrapolation_weight;
      return {inv, yarn_attention(s)};
    }
    case RopeScaling::kLlama3: {
      auto inv = base_inv_freq(theta, r);
      const double f = rope_factor(s);
      const double context = static_cast<double>(rope_original_context(s));
      const double low_wavelen = context / s.low_freq_factor();
      const double high_wavelen = context / s.high_freq_factor();
      auto wavelen = 2 * M_PI / inv;
      auto scaled = torch::where(wavelen > low_wavelen, inv / f, inv);
      auto smooth =
          (context / wavelen - s.low_freq_factor()) / (s.high_freq_factor() - s.low_freq_factor());
      auto smoothed = (1 - smooth) * scaled / f + smooth * scaled;
      auto medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen);
      return {torch::where(medium, smoothed, scaled), 1.0};
    }
    case RopeScaling::kLongRope: {
      const auto& ext = seq_len > rope_original_context(s) ? s.long_factor() : s.short_factor();
      auto ext_t = torch::tensor(ext, torch::kFloat64);
      auto inv = 1.0 / (ext_t * torch::pow(theta, torch::arange(0, r, 2, torch::kFloat64) /
                                                      static_cast<double>(r)));
      return {inv, longrope_attention(s)};
    }
    case RopeScaling::kProportional: {
      const int64_t rotating = static_cast<int64_t>(o.partial_rotary_factor() * o.head_dim()) / 2;
      auto ladder = torch::pow(theta, -torch::arange(0, 2 * rotating, 2, torch::kFloat64) /
                                          static_cast<double>(o.head_dim()));
      auto inv = torch::cat({ladder, torch::zeros({o.head_dim() / 2 - rotating}, torch::kFloat64)});
      return {inv / rope_factor(s), 1.0};
    }
  }
  TORCH_CHECK(false, "rope: unhandled rope_type");
}

// ---- HF transformers' float32 arithmetic, op for op (modeling_rope_utils.py, transformers 5) ----
// Python's `1.0 / t` is t.reciprocal() * 1.0 and `base ** t` is torch.pow(base, t); the same ATen
// ops on the same float32 values give the same bits.

// 1.0 / (base ** (arange(0, dim, 2).float() / denominator)): [dim/2] float32
at::Tensor hf32_ladder(double base, int64_t dim, int64_t denominator) {
  auto exponents = torch::arange(0, dim, 2, torch::kLong).to(torch::kFloat32) / denominator;
  return torch::pow(at::Scalar(base), exponents).reciprocal();
}

RopeFrequencies hf32_scaled_ladder(const RopeOptions& o, int64_t r, int64_t seq_len) {
  const auto& s = o.frequencies().scaling();
  const double theta = o.frequencies().theta();
  switch (s.rope_type()) {
    case RopeScaling::kDefault:
      return {hf32_ladder(theta, r, r), 1.0};
    case RopeScaling::kLinear:
      return {hf32_ladder(theta, r, r) / rope_factor(s), 1.0};
    case RopeScaling::kProportional: {
      const int64_t rotating = static_cast<int64_t>(o.partial_rotary_factor() * o.head_dim()) / 2;
      auto inv = torch::cat({hf32_ladder(theta, 2 * rotating, o.head_dim()),
                             torch::zeros({o.head_dim() / 2 - rotating}, torch::kFloat32)});
      return {inv / rope_factor(s), 1.0};
    }
    case RopeScaling::kDynamic: {
      // At or below the context, HF keeps the frequencies made at init (python floats: theta);
      // beyond it, dynamic_rope_update passes seq_len as a tensor and the base is float32.
      const int64_t context = s.max_position_embeddings();
      if (seq_len <= context) return {hf32_ladder(theta, r, r), 1.0};
      const double f = rope_factor(s);
      auto length = torch::scalar_tensor(seq_len, torch::kLong);
      auto grown = torch::pow(length.mul(f) / context - (f - 1),
                              static_cast<double>(r) / static_cast<double>(r - 2))
                       .mul(theta);
      auto exponents = torch::arange(0, r, 2, torch::kLong).to(torch::kFloat32) / r;
      return {torch::pow(grown, exponents).reciprocal(), 1.0};
    }
    case RopeScaling::kYarn: {  // attention scaling and the ramp bounds: python floats in HF too
      const double f = rope_factor(s);
      const auto [low, high] = yarn_ramp(s, r, theta);
      auto pos_freqs =
          torch::pow(at::Scalar(theta), torch::arange(0, r, 2).to(torch::kFloat32) / r);
      auto extrapolation = pos_freqs.reciprocal();
      auto interpolation = pos_freqs.mul(f).reciprocal();
      auto ramp = ((torch::arange(r / 2, torch::kFloat32) - low) / (high - low)).clamp(0, 1);
      auto extrapolation_weight = 1 - ramp;
      auto inv = interpolation * (1 - extrapolation_weight) + extrapolation * extrapolation_weight;
      return {inv, yarn_attention(s)};
    }
    case RopeScaling::kLlama3: {
      auto inv = hf32_ladder(theta, r, r);
      const double f = rope_factor(s);
      const double context = static_cast<double>(rope_original_context(s));
      const double low_wavelen = context / s.low_freq_factor();
      const double high_wavelen = context / s.high_freq_factor();
      auto wavelen = inv.reciprocal().mul(2 * M_PI);
      auto scaled = torch::where(wavelen > low_wavelen, inv / f, inv);
      auto smooth = (wavelen.reciprocal().mul(context) - s.low_freq_factor()) /
                    (s.high_freq_factor() - s.low_freq_factor());
      auto smoothed = (1 - smooth) * scaled / f + smooth * scaled;
      auto medium = (wavelen < high_wavelen).logical_not() * (wavelen > low_wavelen).logical_not();
      return {torch::where(medium, smoothed, scaled), 1.0};
    }
    case RopeScaling::kLongRope: {
      const auto& ext = seq_len > rope_original_context(s) ? s.long_factor() : s.short_factor();
      auto ext_t = torch::tensor(ext, torch::kFloat64).to(torch::kFloat32);
      auto shape = torch::arange(0, r, 2, torch::kLong).to(torch::kFloat32) / r;
      return {(ext_t * torch::pow(at::Scalar(theta), shape)).reciprocal(), longrope_attention(s)};
    }
  }
  TORCH_CHECK(false, "rope: unhandled rope_type");
}

}  // namespace

RopeFrequencies rope_frequencies(const RopeOptions& o, int64_t seq_len) {
  rope_validate(o);
  const int64_t r = rope_rotary_dim(o);
  const auto& f = o.frequencies();
  switch (f.source()) {
    case RopeFrequencySource::kLadder:
      return f.angle_dtype() == RopeAngleDtype::kFloat32 ? hf32_scaled_ladder(o, r, seq_len)
                                                         : scaled_ladder(o, r, seq_len);
    case RopeFrequencySource::kPerAxisLadders: {
      std::vector<at::Tensor> ladders;  // one theta^(-2i/(2 s)) ladder per section
      const bool hf32 =
          f.angle_dtype() == RopeAngleDtype::kFloat32;  // compute_axial_rope_parameters
      for (auto section : o.sections().sections())
        if (section > 0)
          ladders.push_back(hf32 ? hf32_ladder(f.theta(), 2 * section, 2 * section)
                                 : base_inv_freq(f.theta(), 2 * section));
      return {torch::cat(ladders), 1.0};
    }
    case RopeFrequencySource::kPeriods:
      return {2 * M_PI / time_periods(f.min_period(), f.max_period(), r / 2), 1.0};
  }
  TORCH_CHECK(false, "rope: unhandled frequency source");
}

std::pair<at::Tensor, at::Tensor> rope_cos_sin(const at::Tensor& positions,
                                               const at::Tensor& inv_freq, double scaling) {
  TORCH_CHECK(inv_freq.dim() == 1, "rope: inv_freq must be 1-D [F], got shape ", inv_freq.sizes());
  if (inv_freq.scalar_type() == torch::kFloat32) {  // HF's arithmetic: float32 p * inv_freq
    // the tables are built where the positions are (host or GPU)
    auto angles = positions.to(torch::kFloat32).unsqueeze(-1) * inv_freq.to(positions.device());
    return {angles.cos().mul(scaling), angles.sin().mul(scaling)};
  }
  // Exact products in float64, then reduced: fp32 angles lose positions above 2^24 and round
  // large angles badly (anchors survey, user need 1).
  auto angles = positions.to(torch::kFloat64).unsqueeze(-1) *
                inv_freq.to(positions.device(), torch::kFloat64);
  auto cos = angles.cos();
  auto sin = angles.sin();
  if (scaling != 1.0) {
    cos.mul_(scaling);
    sin.mul_(scaling);
  }
  return {cos.to(torch::kFloat32), sin.to(torch::kFloat32)};
}

std::string to_string(RopeSectionLayout layout) {
  return layout == RopeSectionLayout::kContiguous ? "contiguous" : "interleaved";
}

at::Tensor rope_section_axes(const std::vector<int64_t>& sections, RopeSectionLayout layout) {
  TORCH_CHECK(!sections.empty(), "rope: sections must name at least one axis");
  std::vector<int64_t> left = sections, axes;
  for (size_t a = 0; a < sections.size(); ++a)
    TORCH_CHECK(sections[a] >= 0, "rope: section ", a, " must be >= 0, got ", sections[a]);
  if (layout == RopeSectionLayout::kContiguous) {
    for (size_t a = 0; a < sections.size(); ++a)
      axes.insert(axes.end(), sections[a], static_cast<int64_t>(a));
  } else {
    for (bool any = true; any;) {
      any = false;
      for (size_t a = 0; a < left.size(); ++a)
        if (left[a] > 0) {
          axes.push_back(static_cast<int64_t>(a));
          --left[a];
          any = true;
        }
    }
  }
  return torch::tensor(axes, torch::kLong);
}

std::pair<at::Tensor, at::Tensor> rope_cos_sin_sections(const at::Tensor& coords,
                                                        const at::Tensor& inv_freq,
                                                        const std::vector<int64_t>& sections,
                                                        RopeSectionLayout layout, double scaling) {
  TORCH_CHECK(coords.dim() >= 2, "rope: sectioned coords must be [..., N, A], got ",
              coords.sizes());
  TORCH_CHECK(coords.size(-1) == static_cast<int64_t>(sections.size()), "rope: coords have ",
              coords.size(-1), " axes but ", sections.size(), " sections were given");
  auto axes = rope_section_axes(sections, layout);
  TORCH_CHECK(axes.size(0) == inv_freq.size(0), "rope: sections cover ", axes.size(0),
              " pairs but inv_freq has ", inv_freq.size(0));
  axes = axes.to(coords.device());                  // built where the coordinates are (host or GPU)
  if (inv_freq.scalar_type() == torch::kFloat32) {  // HF's arithmetic, as in rope_cos_sin
    auto angles = coords.to(torch::kFloat32).index_select(-1, axes) * inv_freq.to(coords.device());
    return {angles.cos().mul(scaling), angles.sin().mul(scaling)};
  }
  auto angles = coords.to(torch::kFloat64).index_select(-1, axes) *
                inv_freq.to(coords.device(), torch::kFloat64);
  auto cos = angles.cos(), sin = angles.sin();
  if (scaling != 1.0) {
    cos.mul_(scaling);
    sin.mul_(scaling);
  }
  return {cos.to(torch::kFloat32), sin.to(torch::kFloat32)};
}

at::Tensor xpos_scale(const at::Tensor& positions, int64_t rotary_dim, double scale_base) {
  auto i = torch::arange(0, rotary_dim, 2, positions.options().dtype(torch::kFloat64));
  auto zeta = (i + 0.4 * rotary_dim) / (1.4 * rotary_dim);                // [r/2]
  auto power = positions.to(torch::kFloat64).unsqueeze(-1) / scale_base;  // [..., 1]
  return torch::pow(zeta, power).to(torch::kFloat32);
}

at::Tensor rope_expand(const at::Tensor& per_pair, RopeLayout layout) {
  if (layout == RopeLayout::kHalf) return torch::cat({per_pair, per_pair}, -1);
  return per_pair.repeat_interleave(2, -1);
}

at::Tensor rope_apply(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                      RopeLayout layout) {
  TORCH_CHECK(x.dim() == 4, "rope_apply: x must be [B, N, H, Dh], got shape ", x.sizes());
  TORCH_CHECK(cos.sizes() == sin.sizes(), "rope_apply: cos and sin shapes differ: ", cos.sizes(),
              " vs ", sin.sizes());
  TORCH_CHECK(cos.dim() == 2 || cos.dim() == 3,
              "rope_apply: cos/sin must be [N, F] or [B, N, F], got ", cos.sizes());
  const int64_t n = x.size(1);
  const int64_t f = cos.size(-1);
  TORCH_CHECK(cos.size(-2) == n, "rope_apply: cos/sin have ", cos.size(-2),
              " positions but x has N=", n, " (x shape ", x.sizes(), ")");
  TORCH_CHECK(cos.dim() == 2 || cos.size(0) == x.size(0) || cos.size(0) == 1,
              "rope_apply: cos/sin batch ", cos.size(0), " does not match x batch ", x.size(0));
  TORCH_CHECK(2 * f <= x.size(3), "rope_apply: rotary width 2F=", 2 * f,
              " exceeds head_dim=", x.size(3));
  // c, s: [.., N, 1, F] broadcast over heads
  auto c = cos.unsqueeze(-2);
  auto s = sin.unsqueeze(-2);
  if (c.dim() == 3) {  // [N, 1, F] -> [1, N, 1, F]
    c = c.unsqueeze(0);
    s = s.unsqueeze(0);
  }
  return rope_rotate_pairs(x, c, s, layout);
}

at::Tensor rope_rotate_pairs(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                             RopeLayout layout) {
  const int64_t f = cos.size(-1);
  TORCH_CHECK(2 * f <= x.size(-1), "rope: rotary width 2F=", 2 * f,
              " exceeds head_dim=", x.size(-1));
  const auto dtype = x.scalar_type();
  const auto compute = (dtype == torch::kFloat64) ? torch::kFloat64 : torch::kFloat32;
  auto c = cos.to(compute);
  auto s = sin.to(compute);
  auto xf = x.to(compute);
  auto rotary = xf.narrow(-1, 0, 2 * f);
  at::Tensor a, b;
  if (layout == RopeLayout::kHalf) {
    a = rotary.narrow(-1, 0, f);  // x_i
    b = rotary.narrow(-1, f, f);  // x_{i + r/2}
  } else {
    auto pairs = rotary.unflatten(-1, {f, 2});  // [..., F, 2]
    a = pairs.select(-1, 0);                    // x_{2i}
    b = pairs.select(-1, 1);                    // x_{2i+1}
  }
  auto ra = a * c - b * s;
  auto rb = b * c + a * s;
  at::Tensor rotated = layout == RopeLayout::kHalf ? torch::cat({ra, rb}, -1)
                                                   : torch::stack({ra, rb}, -1).flatten(-2);
  const int64_t dh = x.size(-1);
  if (2 * f < dh) rotated = torch::cat({rotated, xf.narrow(-1, 2 * f, dh - 2 * f)}, -1);
  return rotated.to(dtype);
}

}  // namespace posenc
