// Registry: config -> encoder, one builder per type; contract in posenc/config/registry.h.
// Config text (JSON/YAML, its limits and hardening) is read by config_text.cpp.
#include "posenc/config/registry.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include "posenc/config/config_reader.h"
#include "posenc/config/hf_config.h"
#include "posenc/functional/rope_scaling.h"
#include "posenc/io/input_file.h"
#include "posenc/posenc.h"

namespace posenc {

namespace {

using Builder = std::function<PositionalEncoding(ConfigReader&, const ModelContext&)>;

// One encoder from a config whose limits build_encoder checked (a composite builds its parts
// with it, reading them where they are: a copy per level grew with the square of the nesting);
// `also_known`: keys the caller read (a compose part's modality and axes).
PositionalEncoding build_from_config(const nlohmann::json& config, const ModelContext& context,
                                     std::initializer_list<const char*> also_known = {});

// A model size from the config or the context; both given must agree.
int64_t model_size(ConfigReader& r, const std::string& key, int64_t from_context) {
  auto configured = r.optional_integer(key);
  if (configured && from_context > 0) {
    TORCH_CHECK(*configured == from_context, r.where(), ": '", key, "' is ", *configured,
                " in the config but the model has ", from_context);
  }
  const int64_t value = configured ? *configured : from_context;
  TORCH_CHECK(value > 0, r.where(), ": '", key,
              "' is required (set it in the config, or give the model's size: --dim, --heads)");
  // checked before any table is allocated (2^31 from a config.json took minutes, then the
  // allocator's own message)
  TORCH_CHECK(value <= kMaxModelSize, r.where(), ": '", key, "' is ", value,
              "; the model size limit is ", kMaxModelSize);
  return value;
}

int64_t head_dim_of(const ModelContext& c) {
  if (c.head_dim > 0) return c.head_dim;
  if (c.dim > 0 && c.num_heads <= 0) return c.dim;
  if (c.dim > 0) {
    TORCH_CHECK(c.dim % c.num_heads == 0, "model dim ", c.dim, " is not divisible by num_heads ",
                c.num_heads);
    return c.dim / c.num_heads;
  }
  return 0;
}

PositionalEncoding build_sinusoidal(ConfigReader& r, const ModelContext& c) {
  SinusoidalOptions o(model_size(r, "dim", c.dim));
  o.layout(sinusoidal_layout_from_string(r.string("layout", "interleaved")));
  o.base(r.number("base", o.base()));
  return as_encoding(Sinusoidal(o));
}

PositionalEncoding build_axial_sincos(ConfigReader& r, const ModelContext& c) {
  AxialSincosOptions o(model_size(r, "dim", c.dim));
  o.layout(axial_sincos_layout_from_string(r.string("layout", "timm")));
  o.temperature(r.number("temperature", o.temperature()));
  o.num_axes(r.integer("num_axes", o.num_axes()));
  return as_encoding(AxialSincos(o));
}

PositionalEncoding build_learned(ConfigReader& r, const ModelContext& c) {
  LearnedOptions o(r.integer("max_positions", 512), model_size(r, "dim", c.dim));
  o.init_std(r.number("init_std", o.init_std()));
  return as_encoding(Learned(o));
}

PositionalEncoding build_learned_grid(ConfigReader& r, const ModelContext& c) {
  LearnedGridOptions o(r.integer("grid_height", 14), r.integer("grid_width", 14),
                       model_size(r, "dim", c.dim));
  o.num_prefix_tokens(r.integer("num_prefix_tokens", 0));
  o.init_std(r.number("init_std", o.init_std()));
  GridResample resample;
  resample.mode(r.string("resample", resample.mode()));
  resample.antialias(r.boolean("antialias", resample.antialias()));
  TORCH_CHECK(
      resample.mode() == "bicubic" || resample.mode() == "bilinear" || resample.mode() == "ast",
      "learned_grid: resample must be bicubic, bilinear or ast, got '", resample.mode(), "'");
  o.resample(resample);
  return as_encoding(LearnedGrid(o));
}

PositionalEncoding build_time_sinusoidal(ConfigReader& r, const ModelContext& c) {
  TimeSinusoidalOptions o(model_size(r, "dim", c.dim));
  o.t_min(r.number("t_min", o.t_min()));
  o.t_max(r.number("t_max", o.t_max()));
  o.origin(r.number("origin", o.origin()));
  o.layout(sinusoidal_layout_from_string(r.string("layout", "interleaved")));
  return as_encoding(TimeSinusoidal(o));
}

PositionalEncoding build_time2vec(ConfigReader& r, const ModelContext& c) {
  Time2VecOptions o(model_size(r, "dim", c.dim));
  o.origin(r.number("origin", o.origin()));
  o.time_scale(r.number("time_scale", o.time_scale()));
  return as_encoding(Time2Vec(o));
}

PositionalEncoding build_calendar(ConfigReader& r, const ModelContext& c) {
  CalendarOptions o(model_size(r, "dim", c.dim));
  if (r.has("features"))
    o.features(r.strings("features"));
  else
    r.allow("features");
  return as_encoding(Calendar(o));
}

PositionalEncoding build_rope_mixed(ConfigReader& r, const ModelContext& c) {
  RopeMixedOptions o(model_size(r, "head_dim", head_dim_of(c)),
                     model_size(r, "num_heads", c.num_heads));
  o.theta(r.number("theta", o.theta()));
  o.layout(rope_layout_from_string(r.string("layout", "interleaved")));
  return as_encoding(RopeMixed(o));
}

// {"type": "rope_dinov3", "temperature": 100, "rescale_coords": 2, ...}: DINOv3's RoPE on patch
// centres in [-1, 1] with its training-time coordinate augmentation
// (posenc/encoders/rope_dinov3.h).
PositionalEncoding build_rope_dinov3(ConfigReader& r, const ModelContext& c) {
  RopeDinoV3Options o(model_size(r, "head_dim", head_dim_of(c)));
  o.temperature(r.number("temperature", o.temperature()));
  o.min_period(r.optional_number("min_period"));
  o.max_period(r.optional_number("max_period"));
  o.normalize(grid_normalize_from_string(r.string("normalize_coords", "separate")));
  o.shift_coords(r.optional_number("shift_coords"));
  o.jitter_coords(r.optional_number("jitter_coords"));
  o.rescale_coords(r.optional_number("rescale_coords"));
  o.layout(rope_layout_from_string(r.string("layout", "half")));
  return as_encoding(RopeDinoV3(o));
}

PositionalEncoding build_relative_2d(ConfigReader& r, const ModelContext& c) {
  Relative2dOptions o(model_size(r, "num_heads", c.num_heads), r.integer("grid_height", 7),
                      r.integer("grid_width", 7));
  o.init_std(r.number("init_std", o.init_std()));
  return as_encoding(Relative2d(o));
}

PositionalEncoding build_learned_spacetime(ConfigReader& r, const ModelContext& c) {
  LearnedSpacetimeOptions o(r.integer("frames", 8), r.integer("grid_height", 14),
                            r.integer("grid_width", 14), model_size(r, "dim", c.dim));
  o.init_std(r.number("init_std", o.init_std()));
  return as_encoding(LearnedSpacetime(o));
}

PositionalEncoding build_t5(ConfigReader& r, const ModelContext& c) {
  T5Options o(model_size(r, "num_heads", c.num_heads));
  o.num_buckets(r.integer("num_buckets", o.num_buckets()));
  o.max_distance(r.integer("max_distance", o.max_distance()));
  o.bidirectional(r.boolean("bidirectional", o.bidirectional()));
  o.init_std(r.number("init_std", o.init_std()));
  return as_encoding(T5(o));
}

PositionalEncoding build_shaw(ConfigReader& r, const ModelContext& c) {
  ShawOptions o(model_size(r, "head_dim", head_dim_of(c)));
  o.max_relative_position(r.integer("max_relative_position", o.max_relative_position()));
  o.init_std(r.number("init_std", o.init_std()));
  return as_encoding(Shaw(o));
}

PositionalEncoding build_alibi(ConfigReader& r, const ModelContext& c) {
  AlibiOptions o(model_size(r, "num_heads", c.num_heads));
  o.form(alibi_form_from_string(r.string("form", "causal")));
  o.slope_scale(r.number("slope_scale", o.slope_scale()));
  return as_encoding(Alibi(o));
}

// {"type": "variate_bias", "axis": "variate", "num_variates": 0, "init_std": 0}: Moirai's binary
// attention bias on the positions' variate axis (posenc/encoders/variate_bias.h).
PositionalEncoding build_variate_bias(ConfigReader& r, const ModelContext& c) {
  VariateBiasOptions o(model_size(r, "num_heads", c.num_heads));
  o.axis(r.string("axis", o.axis()));
  o.num_variates(r.integer("num_variates", o.num_variates()));
  o.init_std(r.number("init_std", o.init_std()));
  return as_encoding(VariateBias(o));
}

PositionalEncoding build_nope(ConfigReader&, const ModelContext&) { return as_encoding(Nope()); }

// The scaling keys of HF's rope_parameters / legacy rope_scaling, read from one object.
void read_rope_scaling(ConfigReader& r, RopeOptions& o, bool nested) {
  auto type = r.optional_string("rope_type");
  if (nested) {  // legacy blocks say "type"
    auto legacy = r.optional_string("type");
    TORCH_CHECK(!(type && legacy && *type != *legacy), r.where(), ": 'type' (", legacy.value_or(""),
                ") and 'rope_type' (", type.value_or(""), ") disagree");
    if (!type) type = legacy;
  }
  // HF's Qwen2-VL says rope_type/type "mrope": the default frequencies over mrope_section.
  if (type && *type == "mrope") {
    TORCH_CHECK(r.has("mrope_section"), r.where(), ": rope_type 'mrope' needs 'mrope_section'");
    type = "default";
  }
  auto& f = o.frequencies();
  auto& s = f.scaling();
  if (type) s.rope_type(rope_scaling_from_string(*type));
  if (r.has("mrope_section"))
    o.sections().sections(r.integers("mrope_section"));
  else
    r.allow("mrope_section");
  if (auto layout = r.optional_string("section_layout")) {
    TORCH_CHECK(*layout == "contiguous" || *layout == "interleaved", r.where(),
                ": unknown section_layout '", *layout,
                "'; expected one of: contiguous, interleaved");
    o.sections().layout(*layout == "contiguous" ? RopeSectionLayout::kContiguous
                                                : RopeSectionLayout::kInterleaved);
  }
  if (r.boolean("mrope_interleaved", false)) o.sections().layout(RopeSectionLayout::kInterleaved);
  // section_axes: the coordinate axis each section reads; frequency_order: "dealt" deals one
  // ladder to the sections in turn (Pixtral), "pairs" (default) gives pair i frequency i
  if (r.has("section_axes"))
    o.sections().axes(r.integers("section_axes"));
  else
    r.allow("section_axes");
  if (auto v = r.optional_number("position_scale")) o.position_scale(*v);
  if (auto order = r.optional_string("frequency_order")) {
    TORCH_CHECK(*order == "pairs" || *order == "dealt", r.where(), ": unknown frequency_order '",
                *order, "'; expected one of: pairs, dealt");
    o.sections().frequency_order(*order == "dealt" ? RopeFrequencyOrder::kDealt
                                                   : RopeFrequencyOrder::kPairOrder);
  }
  // per_axis_frequencies: true switches the frequency source to one ladder per section.
  if (r.boolean("per_axis_frequencies", false)) {
    TORCH_CHECK(f.source() != RopeFrequencySource::kPeriods, r.where(),
                ": min_period/max_period and per_axis_frequencies are two frequency sources; "
                "give one");
    f.source(RopeFrequencySource::kPerAxisLadders);
  }
  if (auto v = r.optional_number("rope_theta")) f.theta(*v);
  if (auto v = r.optional_number("partial_rotary_factor")) o.partial_rotary_factor(*v);
  if (auto v = r.optional_number("factor")) s.factor(*v);
  if (auto v = r.optional_integer("original_max_position_embeddings")) {
    // 0 is posenc's "unset" internally; given in a config it would divide llama3's and yarn's
    // wavelength bounds by zero in transformers' formula: refused, as any context below 1
    TORCH_CHECK(*v >= 1, r.where(),
                ": 'original_max_position_embeddings' must be >= 1 (a context "
                "length in tokens), got ",
                *v);
    s.original_max_position_embeddings(*v);
  }
  if (auto v = r.optional_integer("max_position_embeddings")) s.max_position_embeddings(*v);
  if (auto v = r.optional_number("beta_fast")) s.beta_fast(*v);
  if (auto v = r.optional_number("beta_slow")) s.beta_slow(*v);
  if (auto v = r.optional_number("attention_factor")) s.attention_factor(*v);
  if (auto v = r.optional_number("mscale")) s.mscale(*v);
  if (auto v = r.optional_number("mscale_all_dim")) s.mscale_all_dim(*v);
  s.truncate(r.boolean("truncate", s.truncate()));
  if (auto v = r.optional_number("low_freq_factor")) s.low_freq_factor(*v);
  if (auto v = r.optional_number("high_freq_factor")) s.high_freq_factor(*v);
  if (auto v = r.optional_number("alpha")) s.alpha(*v);
  if (r.has("short_factor"))
    s.short_factor(r.numbers("short_factor"));
  else
    r.allow("short_factor");
  if (r.has("long_factor"))
    s.long_factor(r.numbers("long_factor"));
  else
    r.allow("long_factor");
}

// The values a scaling depends on that HF reads from elsewhere in config.json. A pasted block
// without them would silently take posenc's defaults (theta 10000, context 2048): an error naming
// the key and where transformers reads it, or a warning when use_posenc_defaults is true.
void check_dependencies(const nlohmann::json& config, const std::string& where, bool pasted,
                        bool use_defaults, RopeScaling type) {
  auto given = [&](const std::string& key) {
    if (config.contains(key) && !config[key].is_null()) return true;
    for (const char* block : {"rope_parameters", "rope_scaling"})
      if (config.contains(block) && config[block].is_object() && config[block].contains(key) &&
          !config[block][key].is_null())
        return true;
    return false;
  };
  std::vector<std::string> missing;
  auto need = [&](const std::string& key, const std::string& why) {
    if (given(key)) return;
    std::ostringstream m;
    m << where << ": '" << key << "' is not given; " << why;
    missing.push_back(m.str());
  };
  const auto& unit = rope_scaling_unit(type);  // what the type reads from elsewhere
  if (pasted || unit.scales)
    need("rope_theta",
         "transformers reads it from the model's config.json (top-level 'rope_theta', or "
         "'rotary_emb_base' for GPT-NeoX); posenc's default would be 10000");
  for (const auto& dependency : unit.dependencies)
    if (!dependency.unless_factor || !given("factor")) need(dependency.key, dependency.why);
  if (missing.empty()) return;
  std::ostringstream all;
  for (size_t i = 0; i < missing.size(); ++i) all << (i ? "; " : "") << missing[i];
  TORCH_CHECK(use_defaults, all.str(),
              " (add it, read the whole config.json with {type: hf}, or set use_posenc_defaults: "
              "true to accept posenc's defaults)");
  TORCH_WARN(all.str(), " (use_posenc_defaults: true, posenc's default taken)");
}

PositionalEncoding build_rope(ConfigReader& r, const ModelContext& c) {
  RopeOptions o(model_size(r, "head_dim", head_dim_of(c)));
  o.layout(rope_layout_from_string(r.string("layout", "half")));
  o.xpos(r.boolean("xpos", o.xpos()));
  o.xpos_scale_base(r.number("xpos_scale_base", o.xpos_scale_base()));
  // min_period/max_period (either non-zero) choose the real-time periods as frequency source.
  const double min_period = r.number("min_period", 0.0), max_period = r.number("max_period", 0.0);
  if (min_period != 0 || max_period != 0)
    o.frequencies(RopeFrequencyOptions::periods(min_period, max_period));
  o.frequencies().angle_dtype(rope_angle_dtype_from_string(r.string("angle_dtype", "float64")));
  const bool use_defaults = r.boolean("use_posenc_defaults", false);
  read_rope_scaling(r, o, /*nested=*/false);
  // A model's rope_parameters (HF v5) or legacy rope_scaling block, pasted as it is.
  bool pasted = false;
  for (const char* block : {"rope_parameters", "rope_scaling"}) {
    if (auto nested = r.object(block)) {
      pasted = true;
      ConfigReader inner(*nested, r.where() + "." + block);
      for (const auto& item : nested->items()) {
        const std::string key = item.key() == "type" ? "rope_type" : item.key();
        TORCH_CHECK(!r.has(key), r.where(), ": '", key, "' is given both at the top level and in '",
                    block, "'");
      }
      read_rope_scaling(inner, o, /*nested=*/true);
      // A scaling key its type does not take (low_freq_factor in a yarn block): transformers
      // warns and ignores it; so does posenc, once, naming the key and the type.
      const auto scaling = o.frequencies().scaling().rope_type();
      std::vector<std::string> foreign;
      for (const auto& key : rope_scaling_keys())
        if (nested->contains(key) && !rope_scaling_takes(scaling, key)) foreign.push_back(key);
      if (!foreign.empty()) {
        std::ostringstream names;
        for (size_t i = 0; i < foreign.size(); ++i)
          names << (i ? ", " : "") << "'" << foreign[i] << "'";
        TORCH_WARN(inner.where(), ": ", names.str(), " ", foreign.size() == 1 ? "is" : "are",
                   " not a parameter of rope_type '", to_string(scaling),
                   "'; ignored, as transformers ignores it with a warning");
      }
      // Keys transformers does not read in a RoPE block (YaRN scripts write finetuned: true)
      // are ignored with one warning, as transformers does; posenc's own keys stay strict.
      const auto extra = inner.unread();
      if (!extra.empty()) {
        std::ostringstream names;
        for (size_t i = 0; i < extra.size(); ++i)
          names << (i ? ", " : "") << "'" << extra[i] << "'";
        TORCH_WARN(inner.where(), ": ignoring key(s) that are not RoPE parameters: ", names.str());
      }
    }
  }
  // HF's dependencies concern the theta ladder; another source with HF keys fails validation.
  if (o.frequencies().source() == RopeFrequencySource::kLadder)
    check_dependencies(r.json(), r.where(), pasted, use_defaults,
                       o.frequencies().scaling().rope_type());
  return as_encoding(Rope(o));
}

// {"type": "rope_fractional", "max_positions": [20, 2048, 2048], ...}: LTX-2's rotary embedding
// (posenc/encoders/rope_fractional.h); layout "split" is LTX-2's name for half.
PositionalEncoding build_rope_fractional(ConfigReader& r, const ModelContext& c) {
  RopeFractionalOptions o(
      model_size(r, "head_dim", head_dim_of(c)),
      c.num_heads > 0 || r.has("num_heads") ? model_size(r, "num_heads", c.num_heads) : 1);
  if (r.has("max_positions"))
    o.max_positions(r.numbers("max_positions"));
  else
    r.allow("max_positions");
  o.theta(r.number("theta", o.theta()));
  const auto layout = r.string("layout", "interleaved");
  o.layout(layout == "split" ? RopeLayout::kHalf : rope_layout_from_string(layout));
  const auto dtype = r.string("frequency_dtype", "float64");
  TORCH_CHECK(dtype == "float64" || dtype == "float32", r.where(), ": unknown frequency_dtype '",
              dtype, "'; expected one of: float64 (LTX-2's rope_double_precision), float32");
  o.double_precision(dtype == "float64");
  return as_encoding(RopeFractional(o));
}

// A model's whole config.json (a path or the object itself), resolved as transformers does.
PositionalEncoding build_hf(ConfigReader& r, const ModelContext& c) {
  HfConfigOptions options;
  options.layer_type = r.string("layer_type", "");
  options.angle_dtype = r.string("angle_dtype", "float64");
  TORCH_CHECK(r.has("config"), r.where(),
              ": 'config' is required: the path of a model's config.json, or its object");
  HfResolution resolution;
  if (auto path = r.has("config") && r.json()["config"].is_string() ? r.optional_string("config")
                                                                    : std::nullopt) {
    resolution = load_hf_config(*path, options);
  } else {
    auto object = r.object("config");
    options.origin = r.where() + ".config";
    resolution = from_hf_config(*object, options);
  }
  for (const auto& warning : resolution.warnings) TORCH_WARN(warning);
  return build_encoder(resolution, c);
}

SegmentKind modality_from_string(const std::string& name, const std::string& where) {
  for (auto kind :
       {SegmentKind::kText, SegmentKind::kImage, SegmentKind::kVideo, SegmentKind::kAudio}) {
    if (to_string(kind) == name) return kind;
  }
  TORCH_CHECK(false, where, ": unknown modality '", name,
              "'; expected one of: text, image, video, audio");
}

// {"type": "compose", "encoders": [{...}, ...]}: each part built with the model's sizes; a part
// may name the modality it acts on and the axes it reads.
PositionalEncoding build_compose(ConfigReader& r, const ModelContext& c) {
  r.allow("encoders");
  TORCH_CHECK(r.has("encoders") && r.json()["encoders"].is_array() && !r.json()["encoders"].empty(),
              r.where(), ": 'encoders' must be a non-empty list of encoder configs");
  std::vector<ComposePart> parts;
  const auto& list = r.json()["encoders"];
  for (size_t i = 0; i < list.size(); ++i) {
    const auto where = r.where() + ".encoders[" + std::to_string(i) + "]";
    TORCH_CHECK(list[i].is_object(), where, ": expected an encoder config object, got ",
                list[i].type_name());
    const auto& config = list[i];
    ComposePart part;
    if (config.contains("modality")) {
      TORCH_CHECK(config["modality"].is_string(), where, ".modality: expected a string, got ",
                  config["modality"].type_name());
      part.modality =
          modality_from_string(config["modality"].get<std::string>(), where + ".modality");
    }
    if (config.contains("axes")) {
      ConfigReader axes(config, where);
      part.axes = axes.strings("axes");
      TORCH_CHECK(!part.axes.empty(), where, ".axes: expected a non-empty list of axis names");
    }
    try {
      part.encoder = build_from_config(config, c, {"modality", "axes"});
    } catch (const c10::Error& e) {
      TORCH_CHECK(false, where, ": ", e.msg());
    }
    parts.push_back(std::move(part));
  }
  return as_encoding(Compose(std::move(parts)));
}

// {"type": "freq_time", "frequency": {...}, "time": {...}}: audio patches absolute along
// frequency (pitch matters; default sinusoidal) and rotary along time (shift invariant; default
// RoPE): a composite over the axes "freq" and "time" (ast_positions' axes).
PositionalEncoding build_freq_time(ConfigReader& r, const ModelContext& c) {
  r.allow("frequency");
  r.allow("time");
  std::vector<ComposePart> parts(2);
  const std::pair<const char*, const char*> axes[] = {{"frequency", "sinusoidal"},
                                                      {"time", "rope"}};
  for (size_t i = 0; i < 2; ++i) {
    const auto [key, default_type] = axes[i];
    const nlohmann::json fallback = {{"type", default_type}};
    const nlohmann::json* config = &fallback;
    if (r.has(key)) {
      TORCH_CHECK(r.json()[key].is_object(), r.where(), ".", key,
                  ": expected an encoder config object, got ", r.json()[key].type_name());
      config = &r.json()[key];
    }
    try {
      parts[i].encoder = build_from_config(*config, c);
    } catch (const c10::Error& e) {
      TORCH_CHECK(false, r.where(), ".", axes[i].first, ": ", e.msg());
    }
    parts[i].axes = {i == 0 ? "freq" : "time"};
  }
  return as_encoding(Compose(std::move(parts)));
}

const std::map<std::string, Builder>& builders() {
  static const std::map<std::string, Builder> table{{"alibi", build_alibi},
                                                    {"axial_sincos", build_axial_sincos},
                                                    {"learned", build_learned},
                                                    {"learned_grid", build_learned_grid},
                                                    {"learned_spacetime", build_learned_spacetime},
                                                    {"nope", build_nope},
                                                    {"relative_2d", build_relative_2d},
                                                    {"rope", build_rope},
                                                    {"rope_dinov3", build_rope_dinov3},
                                                    {"rope_fractional", build_rope_fractional},
                                                    {"rope_mixed", build_rope_mixed},
                                                    {"shaw", build_shaw},
                                                    {"sinusoidal", build_sinusoidal},
                                                    {"t5", build_t5},
                                                    {"time2vec", build_time2vec},
                                                    {"time_sinusoidal", build_time_sinusoidal},
                                                    {"variate_bias", build_variate_bias},
                                                    {"calendar", build_calendar},
                                                    {"compose", build_compose},
                                                    {"freq_time", build_freq_time},
                                                    {"hf", build_hf}};
  return table;
}

std::string join(const std::vector<std::string>& names) {
  std::ostringstream out;
  for (size_t i = 0; i < names.size(); ++i) out << (i ? ", " : "") << names[i];
  return out.str();
}

}  // namespace

std::vector<std::string> encoder_types() {
  std::vector<std::string> names;
  for (const auto& item : builders()) names.push_back(item.first);
  return names;
}

namespace {

PositionalEncoding build_from_config(const nlohmann::json& config, const ModelContext& context,
                                     std::initializer_list<const char*> also_known) {
  TORCH_CHECK(config.is_object(), "encoder config: expected an object with a 'type', got ",
              config.type_name());
  TORCH_CHECK(config.contains("type") && config["type"].is_string(),
              "encoder config: 'type' is required; known types: ", join(encoder_types()));
  const auto type = config["type"].get<std::string>();
  auto it = builders().find(type);
  TORCH_CHECK(it != builders().end(), "encoder config: unknown type '", type,
              "'; known types: ", join(encoder_types()));
  ConfigReader reader(config, type + " config");
  reader.allow("type");
  for (const char* key : also_known) reader.allow(key);
  auto encoder = it->second(reader, context);
  reader.finish();
  return encoder;
}

}  // namespace

// Every door's configs pass here (text through parse_config first): the limits hold before any
// builder reads, so a tree nested past the stack is one line, not a crash.
PositionalEncoding build_encoder(const nlohmann::json& config, const ModelContext& context) {
  check_config_limits(config, "encoder config");
  return build_from_config(config, context);
}

}  // namespace posenc
