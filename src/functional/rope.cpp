// RoPE frequencies, scalings and the reference rotation; the math is in
// include/posenc/functional/rope.h. Scalings reproduce HF transformers' modeling_rope_utils
// (_compute_*_parameters); tests/fixtures/rope.json holds values generated from it.
#include "posenc/functional/rope.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>

#include "posenc/functional/rope_scaling.h"
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

std::string to_string(RopeScaling scaling) { return rope_scaling_unit(scaling).name; }

std::string to_string(RopeAngleDtype dtype) {
  switch (dtype) {
    case RopeAngleDtype::kFloat64:
      return "float64";
    case RopeAngleDtype::kFloat32:
      return "float32";
    case RopeAngleDtype::kFloat64Peer:
      return "float64_peer";
  }
  return "unknown";
}

RopeAngleDtype rope_angle_dtype_from_string(const std::string& name) {
  if (name == "float64") return RopeAngleDtype::kFloat64;
  if (name == "float32") return RopeAngleDtype::kFloat32;
  if (name == "float64_peer") return RopeAngleDtype::kFloat64Peer;
  TORCH_CHECK(false, "rope: unknown angle_dtype '", name,
              "'; expected one of: float64, float32, float64_peer");
}

bool rope_scaling_takes(RopeScaling scaling, const std::string& key) {
  const auto& keys = rope_scaling_unit(scaling).keys;
  return std::find(keys.begin(), keys.end(), key) != keys.end();
}

const std::vector<std::string>& rope_scaling_keys() {
  static const std::vector<std::string> keys = [] {  // the union of every type's keys
    std::vector<std::string> all;
    for (const auto& unit : rope_scaling_units())
      for (const auto& key : unit.keys)
        if (std::find(all.begin(), all.end(), key) == all.end()) all.push_back(key);
    return all;
  }();
  return keys;
}

RopeScaling rope_scaling_from_string(const std::string& name) {
  std::string known;
  for (const auto& unit : rope_scaling_units()) {
    if (unit.name == name) return unit.type;
    for (const auto& alias : unit.aliases)
      if (alias == name) return unit.type;
    known += (known.empty() ? "" : ", ") + unit.name;
  }
  TORCH_CHECK(false, "rope: unknown rope_type '", name, "'; expected one of: ", known);
}

std::string to_string(RopeFrequencyOrder order) {
  return order == RopeFrequencyOrder::kPairOrder ? "pairs" : "dealt";
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
      rope_scaling_unit(o.frequencies().scaling().rope_type()).rotates_whole_head)
    return o.head_dim();
  return static_cast<int64_t>(static_cast<double>(o.head_dim()) * o.partial_rotary_factor());
}

int64_t rope_original_context(const RopeScalingOptions& s) {
  return s.original_max_position_embeddings() > 0 ? s.original_max_position_embeddings()
                                                  : s.max_position_embeddings();
}

double rope_factor(const RopeScalingOptions& s) {
  if (s.factor()) return *s.factor();
  const auto& unit = rope_scaling_unit(s.rope_type());
  TORCH_CHECK(unit.default_factor != nullptr, "rope: rope_type '", unit.name, "' needs a 'factor'");
  return unit.default_factor(s);
}

namespace {

// The HF scaling of a theta ladder over r rotary dims: the checks every type shares, then the
// type's own (its unit).
void validate_scaling(const RopeScalingOptions& s, const RopeOptions& o, int64_t r) {
  TORCH_CHECK(s.max_position_embeddings() > 0,
              "rope: max_position_embeddings must be positive, got ", s.max_position_embeddings());
  TORCH_CHECK(s.original_max_position_embeddings() >= 0,
              "rope: original_max_position_embeddings must be >= 0, got ",
              s.original_max_position_embeddings());
  const auto& unit = rope_scaling_unit(s.rope_type());
  if (unit.validate) unit.validate(s, o, r);
  if (unit.scales) {
    const double f = rope_factor(s);
    TORCH_CHECK(f > 0 && std::isfinite(f), "rope: factor must be positive, got ", f);
    TORCH_CHECK(f >= 1 || unit.factor_below_one, "rope: ", unit.name, " needs factor >= 1, got ",
                f);
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
      TORCH_CHECK(unscaled, "rope: per_axis_frequencies needs rope_type default, got ",
                  to_string(f.scaling().rope_type()));
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
  TORCH_CHECK(f.angle_dtype() != RopeAngleDtype::kFloat64Peer ||
                  f.source() == RopeFrequencySource::kPerAxisLadders,
              "rope: angle_dtype float64_peer (diffusers' float64 ladders, 1.0 / theta^(2i/d)) "
              "applies to per_axis_frequencies; got the ",
              source, " frequency source");
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
  const auto& axes = o.sections().axes();
  TORCH_CHECK(axes.empty() || axes.size() == sections.size(), "rope: section_axes names ",
              axes.size(), " axes for ", sections.size(), " sections; give one per section");
  for (size_t a = 0; a < axes.size(); ++a)
    TORCH_CHECK(axes[a] >= 0 && axes[a] < static_cast<int64_t>(axes.size()) &&
                    std::count(axes.begin(), axes.end(), axes[a]) == 1,
                "rope: section_axes must be a permutation of 0..", axes.size() - 1, ", got ",
                c10::IntArrayRef(axes));
  TORCH_CHECK(o.sections().frequency_order() == RopeFrequencyOrder::kPairOrder ||
                  (!sections.empty() && f.source() == RopeFrequencySource::kLadder),
              "rope: frequency_order 'dealt' deals one ladder to the sections; it needs "
              "mrope_section and the ladder frequency source, got ",
              sections.size(), " sections and the ", source, " source");
  TORCH_CHECK(!o.xpos() || o.xpos_scale_base() > 0, "rope: xpos_scale_base must be positive, got ",
              o.xpos_scale_base());
  TORCH_CHECK(std::isfinite(o.position_scale()) && o.position_scale() != 0,
              "rope: position_scale must be finite and non-zero, got ", o.position_scale());
  TORCH_CHECK(o.position_scale() == 1.0 || !o.xpos(),
              "rope: xpos is not supported with a position_scale, got ", o.position_scale());
}

namespace {

// kDealt: the ladder's frequencies dealt in turn to the sections (the round-robin order of
// interleaved sections), each section's share in ladder order, then laid over the pairs.
at::Tensor deal_frequencies(const at::Tensor& ladder, const RopeSectionMap& map) {
  const auto deal = rope_section_axes(map.sections(), RopeSectionLayout::kInterleaved);
  const auto section_major = std::get<1>(deal.sort(std::optional<bool>(true), 0, false));
  return ladder.index_select(0, section_major.to(ladder.device()))
      .index_select(0, rope_section_major_index(map.sections(), map.layout()).to(ladder.device()));
}

}  // namespace

RopeFrequencies rope_frequencies(const RopeOptions& o, int64_t seq_len) {
  rope_validate(o);
  const int64_t r = rope_rotary_dim(o);
  const auto& f = o.frequencies();
  switch (f.source()) {
    case RopeFrequencySource::kLadder: {  // the scaling type's unit (rope_scaling.cpp)
      const auto& unit = rope_scaling_unit(f.scaling().rope_type());
      const RopeScalingContext context{o, r, seq_len};
      auto out =
          f.angle_dtype() == RopeAngleDtype::kFloat32 ? unit.hf32(context) : unit.exact(context);
      if (o.sections().frequency_order() == RopeFrequencyOrder::kDealt)
        out.inv_freq = deal_frequencies(out.inv_freq, o.sections());
      return out;
    }
    case RopeFrequencySource::kPerAxisLadders: {
      std::vector<at::Tensor> ladders;              // one theta^(-2i/(2 s)) ladder per section
      for (auto section : o.sections().sections())  // transformers' compute_axial_rope_parameters
        if (section > 0)
          ladders.push_back(rope_ladder(f.theta(), 2 * section, 2 * section, f.angle_dtype()));
      // section-major, laid over the pairs as the sections are (interleaved: Kimi-K2.5's tower)
      return {torch::cat(ladders).index_select(
                  0, rope_section_major_index(o.sections().sections(), o.sections().layout())),
              1.0};
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

at::Tensor rope_section_major_index(const std::vector<int64_t>& sections,
                                    RopeSectionLayout layout) {
  const auto axes = rope_section_axes(sections, layout);
  std::vector<int64_t> offset(sections.size(), 0), index;
  for (size_t a = 1; a < sections.size(); ++a) offset[a] = offset[a - 1] + sections[a - 1];
  const auto* axis = axes.data_ptr<int64_t>();
  for (int64_t j = 0; j < axes.size(0); ++j) index.push_back(offset[axis[j]]++);
  return torch::tensor(index, torch::kLong);
}

at::Tensor rope_section_coords(const at::Tensor& coords, const std::vector<int64_t>& axes) {
  if (axes.empty()) return coords;
  TORCH_CHECK(coords.dim() >= 1 && coords.size(-1) == static_cast<int64_t>(axes.size()),
              "rope: section_axes names ", axes.size(), " axes but the coordinates have shape ",
              coords.sizes());
  for (const auto a : axes)
    TORCH_CHECK(a >= 0 && a < static_cast<int64_t>(axes.size()) &&
                    std::count(axes.begin(), axes.end(), a) == 1,
                "rope: section_axes must be a permutation of 0..", axes.size() - 1, ", got ",
                c10::IntArrayRef(axes));
  return coords.index_select(-1, torch::tensor(axes, torch::kLong).to(coords.device()));
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
