// Rotary and additive tables as dispatcher operators:
//
// posenc::rope_cos_sin(positions, inv_freq, attention_scaling, mrope_section, section_layout,
//                      layout) -> (cos, sin)
//   1D:        positions [..., N]      angle[..., n, i] = positions[..., n] * inv_freq[i]
//   sectioned: positions [..., N, A]   angle[..., n, i] = positions[..., n, axis(i)] * inv_freq[i]
//              (axis(i) from mrope_section: Qwen2-VL's contiguous sections, Qwen3-VL's
//              interleaved ones; posenc/functional/rope.h rope_section_axes)
//   cos = cos(angle) * attention_scaling laid over the rotary width W = 2F in the layout's order
//   (half: cat(t, t), as transformers' rotary modules return it; interleaved: t0 t0 t1 t1 ...),
//   float32. inv_freq float32 computes the angles in float32 as transformers does (equal to the
//   bit); float64 exactly. No gradients (positions and frequencies are data).
//
// posenc::sinusoidal_table(positions, dim, base, layout) -> Tensor
//   The additive sinusoidal table (Vaswani et al. 2017, sec. 3.5): positions [...] (fractional:
//   timestamps) -> [..., dim] float64, angle_i = p base^(-2i/dim), i < dim/2; "interleaved"
//   [sin a_0, cos a_0, sin a_1, ...] (Vaswani; XLM/DistilBERT's create_sinusoidal_embeddings),
//   "concat" [sin a_0 .. sin a_{F-1}, cos a_0 .. cos a_{F-1}] (Marian, MAE's 1D table);
//   posenc/functional/sinusoidal.h. A composition of ATen ops (CompositeImplicitAutograd).
//
// posenc::hf_rope(config_json, layer_type, angle_dtype, seq_len) -> (inv_freq, attention_scaling,
//                 resolution_json)
//   A model's config.json resolved as transformers resolves it (posenc/config/hf_config.h): the
//   frequencies for a sequence of seq_len tokens (-1: the original context; dynamic and longrope
//   depend on it), the attention scaling and the whole resolution (every value with its source,
//   warnings, plus rotary_dim) as JSON.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "../kernels/dispatch/operator_checks.h"
#include "posenc/config/hf_config.h"
#include "posenc/encoders/rope.h"
#include "posenc/functional/rope.h"
#include "posenc/functional/sinusoidal.h"
#include "registration.h"

namespace posenc::ops {

namespace {

std::tuple<at::Tensor, at::Tensor> rope_cos_sin_op(
    const at::Tensor& positions, const at::Tensor& inv_freq, double attention_scaling,
    c10::IntArrayRef mrope_section, c10::string_view section_layout, c10::string_view layout) {
  check_same_device("posenc.rope_cos_sin", {{"positions", positions}, {"inv_freq", inv_freq}});
  TORCH_CHECK(at::isFloatingType(positions.scalar_type()) ||
                  at::isIntegralType(positions.scalar_type(), /*includeBool=*/false),
              "posenc.rope_cos_sin: positions must be real numbers (floating point or integer), "
              "got ",
              positions.scalar_type());
  const RopeLayout pairs = rope_layout_from_string(std::string(layout));
  TORCH_CHECK(inv_freq.dim() == 1, "posenc.rope_cos_sin: inv_freq must be [F], got shape ",
              inv_freq.sizes());
  TORCH_CHECK(inv_freq.scalar_type() == at::kFloat || inv_freq.scalar_type() == at::kDouble,
              "posenc.rope_cos_sin: inv_freq must be float32 (transformers' arithmetic) or "
              "float64 (exact), got ",
              inv_freq.scalar_type());
  TORCH_CHECK(std::isfinite(attention_scaling),
              "posenc.rope_cos_sin: attention_scaling must be "
              "finite, got ",
              attention_scaling);
  at::Tensor cos, sin;
  if (mrope_section.empty()) {
    TORCH_CHECK(positions.dim() >= 1,
                "posenc.rope_cos_sin: positions must be [..., N], got a "
                "scalar");
    std::tie(cos, sin) = rope_cos_sin(positions, inv_freq, attention_scaling);
  } else {
    const std::vector<int64_t> sections(mrope_section.begin(), mrope_section.end());
    int64_t total = 0;
    for (const int64_t s : sections) {
      TORCH_CHECK(s >= 0, "posenc.rope_cos_sin: mrope_section entries must be >= 0, got ", s);
      total += s;
    }
    TORCH_CHECK(total == inv_freq.size(0), "posenc.rope_cos_sin: mrope_section sums to ", total,
                " pairs but inv_freq has ", inv_freq.size(0));
    TORCH_CHECK(positions.dim() >= 2 && positions.size(-1) == static_cast<int64_t>(sections.size()),
                "posenc.rope_cos_sin: sectioned positions must be [..., N, A] with A = ",
                sections.size(), " axes, got shape ", positions.sizes());
    const std::string name(section_layout);
    TORCH_CHECK(name == "contiguous" || name == "interleaved",
                "posenc.rope_cos_sin: section_layout must be 'contiguous' or 'interleaved', got '",
                name, "'");
    std::tie(cos, sin) = rope_cos_sin_sections(
        positions, inv_freq, sections,
        name == "interleaved" ? RopeSectionLayout::kInterleaved : RopeSectionLayout::kContiguous,
        attention_scaling);
  }
  return {rope_expand(cos, pairs).contiguous(), rope_expand(sin, pairs).contiguous()};
}

at::Tensor sinusoidal_table_op(const at::Tensor& positions, int64_t dim, double base,
                               c10::string_view layout) {
  TORCH_CHECK(at::isFloatingType(positions.scalar_type()) ||
                  at::isIntegralType(positions.scalar_type(), /*includeBool=*/false),
              "posenc.sinusoidal_table: positions must be numbers, got ", positions.scalar_type());
  return sinusoidal_table(positions, dim, base, sinusoidal_layout_from_string(std::string(layout)));
}

std::tuple<at::Tensor, double, std::string> hf_rope_op(c10::string_view config_json,
                                                       c10::string_view layer_type,
                                                       c10::string_view angle_dtype,
                                                       int64_t seq_len, c10::string_view origin) {
  // the hardened reader: size/depth limits, NaN/Infinity as Python writes them, one-line errors
  const nlohmann::json config = parse_config(std::string(config_json), std::string(origin));
  HfConfigOptions options;
  options.layer_type = std::string(layer_type);
  options.angle_dtype = std::string(angle_dtype);
  options.origin = std::string(origin);
  const HfResolution resolution = from_hf_config(config, options);
  auto encoder = build_encoder(resolution);
  const auto* rope = dynamic_cast<const RopeImpl*>(encoder.get());
  TORCH_CHECK(rope != nullptr, "posenc.hf_rope: the config resolves to a '",
              resolution.config.value("type", "?"), "' encoder, not rotary");
  TORCH_CHECK(seq_len >= -1, "posenc.hf_rope: seq_len must be >= 0 (or -1), got ", seq_len);
  const RopeFrequencies f = rope->frequencies(seq_len);
  auto described = to_json(resolution);
  described["rotary_dim"] = rope->rotary_dim();
  return {f.inv_freq, f.attention_scaling, described.dump()};
}

POSENC_LIBRARY_FRAGMENT(m) {
  m.def(
      "rope_cos_sin(Tensor positions, Tensor inv_freq, float attention_scaling=1., "
      "int[] mrope_section=[], str section_layout=\"contiguous\", str layout=\"half\") -> "
      "(Tensor, Tensor)");
  m.def(
      "sinusoidal_table(Tensor positions, int dim, float base=10000., "
      "str layout=\"interleaved\") -> Tensor");
  m.impl("sinusoidal_table", c10::DispatchKey::CompositeImplicitAutograd,
         TORCH_FN(sinusoidal_table_op));
  m.def(
      "hf_rope(str config_json, str layer_type=\"\", str angle_dtype=\"float32\", "
      "int seq_len=-1, str origin=\"config.json\") -> (Tensor, float, str)",
      TORCH_FN(hf_rope_op));
}

// Tables are data: an input that asks for a gradient is one line, never a silent None.
std::tuple<at::Tensor, at::Tensor> rope_cos_sin_autograd(
    const at::Tensor& positions, const at::Tensor& inv_freq, double attention_scaling,
    c10::IntArrayRef mrope_section, c10::string_view section_layout, c10::string_view layout) {
  TORCH_CHECK(
      !(at::GradMode::is_enabled() && (positions.requires_grad() || inv_freq.requires_grad())),
      "posenc.rope_cos_sin: the tables have no gradient with respect to positions or "
      "inv_freq (learned frequencies: compute the angles with torch ops)");
  at::AutoDispatchBelowADInplaceOrView guard;
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("posenc::rope_cos_sin", "")
                             .typed<std::tuple<at::Tensor, at::Tensor>(
                                 const at::Tensor&, const at::Tensor&, double, c10::IntArrayRef,
                                 c10::string_view, c10::string_view)>();
  return op.call(positions, inv_freq, attention_scaling, mrope_section, section_layout, layout);
}

}  // namespace

POSENC_LIBRARY_IMPL(CPU, m) { m.impl("rope_cos_sin", TORCH_FN(rope_cos_sin_op)); }
POSENC_LIBRARY_IMPL(Autograd, m) { m.impl("rope_cos_sin", TORCH_FN(rope_cos_sin_autograd)); }
POSENC_LIBRARY_IMPL(CUDA, m) { m.impl("rope_cos_sin", TORCH_FN(rope_cos_sin_op)); }

}  // namespace posenc::ops
