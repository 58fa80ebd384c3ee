// `posenc inspect` and the argument parsing shared with `posenc plot`.
// Output: one JSON object {type, kind, axes, positions, <what the encoder computes>, [output]}.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <limits>
#include <optional>
#include <sstream>

#include "cli.h"
#include "posenc/config/hf_config.h"
#include "posenc/posenc.h"
#include "timeseries/csv_series.h"

namespace posenc::cli {

namespace {

std::vector<std::string> split_axes(const std::string& text, int64_t count) {
  std::vector<std::string> names;
  if (text.empty()) {
    static const std::vector<std::vector<std::string>> defaults{{"t"}, {"h", "w"}, {"t", "h", "w"}};
    TORCH_CHECK(count >= 1 && count <= 3, "--positions has ", count,
                " coordinates per position; name the axes with --axes");
    return defaults[count - 1];
  }
  std::stringstream in(text);
  for (std::string name; std::getline(in, name, ',');) names.push_back(name);
  return names;
}

}  // namespace

namespace {
// "4x6" -> {4, 6}
std::vector<int64_t> parse_extent(const std::string& text, const std::string& spec, size_t count) {
  std::vector<int64_t> sizes;
  std::stringstream in(text);
  for (std::string part; std::getline(in, part, 'x');) {
    size_t used = 0;
    int64_t value = 0;
    try {
      value = std::stoll(part, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    TORCH_CHECK(used > 0 && used == part.size() && value > 0, "--positions '", spec, "': '", part,
                "' is not a positive integer");
    sizes.push_back(value);
  }
  TORCH_CHECK(sizes.size() == count, "--positions '", spec, "': expected ", count,
              " sizes separated by 'x', got ", sizes.size());
  double total = 1;
  for (auto s : sizes) total *= static_cast<double>(s);
  TORCH_CHECK(total <= kMaxPositions, "--positions '", spec, "': ", total,
              " positions; the limit is ", kMaxPositions);
  return sizes;
}
}  // namespace

namespace {
// "2.5" (or "2.5s") -> 2.5: a positive, finite number of seconds.
double parse_seconds(const std::string& part, const std::string& text) {
  const auto number = !part.empty() && part.back() == 's' ? part.substr(0, part.size() - 1) : part;
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(number, &used);
  } catch (const std::out_of_range&) {  // below the smallest normal double, or above the largest
    TORCH_CHECK(false, "--positions '", text, "': '", part,
                "' seconds is outside what a double holds (normal values ",
                std::numeric_limits<double>::min(), " to ", std::numeric_limits<double>::max(),
                ")");
  } catch (const std::exception&) {
    used = 0;
  }
  TORCH_CHECK(used > 0 && used == number.size() && std::isfinite(value) && value > 0,
              "--positions '", text, "': '", part, "' is not a positive number of seconds");
  return value;
}

// Qwen2.5-Omni audio: "12" -> 12 audio tokens; "2.0s" -> an audio of that length at 16 kHz:
// ceil(samples / 160) mel frames (the Whisper feature extractor's attention mask, hop 160, i.e.
// 100 frames per second) -> omni_audio_tokens (25 tokens per second).
int64_t parse_audio(const std::string& size, const std::string& text) {
  if (size.empty() || size.back() != 's') return parse_extent(size, text, 1)[0];
  const double seconds = parse_seconds(size, text);
  TORCH_CHECK(seconds * 25 <= kMaxPositions, "--positions '", text, "': audio=", size, " is ",
              seconds * 25, " audio tokens; the limit is ", kMaxPositions);
  const double samples = std::round(seconds * 16000);
  const auto mel_frames = static_cast<int64_t>(std::ceil(samples / 160));
  const int64_t tokens = omni_audio_tokens(mel_frames);
  TORCH_CHECK(tokens >= 1, "--positions '", text, "': audio=", size, " is ", mel_frames,
              " mel frames, which give no audio token (at least 3 mel frames: more than 0.02 s)");
  return tokens;
}

// "video=3x2x2,text=5" -> a mixed stream with M-RoPE positions (posenc/core/stream.h).
// "omni:text=2,audio=2.0s,video=4x2x2@1.0+audio=4.0s" -> Qwen2.5-Omni TMRoPE positions, marker
// tokens included. Sizes are token grids (spatial_merge_size 1) under both rules; @S is a video's
// seconds per temporal grid step (HF second_per_grid(s) = 2 / fps), required under omni.
StreamLayout parse_stream(const std::string& spec, const std::string& text) {
  const bool omni = spec.rfind("omni:", 0) == 0;
  const std::string body = omni ? spec.substr(5) : spec;
  TORCH_CHECK(!body.empty(), "--positions '", text, "': no segments after '",
              omni ? "stream:omni:" : "stream:", "'");
  std::vector<Segment> segments;
  double total = 0;
  std::stringstream in(body);
  for (std::string part; std::getline(in, part, ',');) {
    const auto equals = part.find('=');
    TORCH_CHECK(equals != std::string::npos, "--positions '", text, "': segment '", part,
                "' is not kind=size (text=N, pad=N, image=HxW, video=TxHxW[@S]; after "
                "stream:omni: also audio=N|Ss and video=TxHxW@S+audio=N|Ss)");
    const auto kind = part.substr(0, equals), size = part.substr(equals + 1);
    if (kind == "text") {
      segments.push_back(Segment::text(parse_extent(size, text, 1)[0]));
    } else if (kind == "pad") {
      segments.push_back(Segment::padding(parse_extent(size, text, 1)[0]));
    } else if (kind == "image") {
      auto s = parse_extent(size, text, 2);
      segments.push_back(Segment::image(s[0], s[1]));
    } else if (kind == "audio") {
      TORCH_CHECK(omni, "--positions '", text, "': segment '", part,
                  "': audio needs the Qwen2.5-Omni rule; write stream:omni:...");
      segments.push_back(Segment::audio(parse_audio(size, text)));
    } else if (kind == "video") {
      // TxHxW[@S][+audio=N|Ss]
      std::string grid = size, seconds, audio;
      const auto plus = grid.find("+audio=");
      if (plus != std::string::npos) {
        TORCH_CHECK(omni, "--positions '", text, "': segment '", part,
                    "': a video with its audio needs the Qwen2.5-Omni rule; write "
                    "stream:omni:...");
        audio = grid.substr(plus + 7);
        grid = grid.substr(0, plus);
      }
      const auto at = grid.find('@');
      if (at != std::string::npos) {
        seconds = grid.substr(at + 1);
        grid = grid.substr(0, at);
      }
      TORCH_CHECK(!omni || at != std::string::npos, "--positions '", text, "': segment '", part,
                  "' needs its seconds per grid under stream:omni: (video=TxHxW@S, e.g. @1.0 ",
                  "for 2 fps)");
      auto s = parse_extent(grid, text, 3);
      const double seconds_per_grid = at == std::string::npos ? 0.0 : parse_seconds(seconds, text);
      TORCH_CHECK(seconds_per_grid * static_cast<double>(s[0]) <= kMaxVideoSeconds, "--positions '",
                  text, "': '@", seconds, "' seconds per grid puts a ", s[0], "-grid video past ",
                  kMaxVideoSeconds,
                  " seconds (the video length limit; its positions would not stay finite)");
      if (plus != std::string::npos) {
        const int64_t audio_tokens = parse_audio(audio, text);
        segments.push_back(
            Segment::video_with_audio(s[0], s[1], s[2], seconds_per_grid, audio_tokens));
      } else {
        segments.push_back(Segment::video(s[0], s[1], s[2], seconds_per_grid));
      }
    } else {
      TORCH_CHECK(false, "--positions '", text, "': unknown segment kind '", kind,
                  "' (text, pad, image, video", omni ? ", audio)" : "; audio after stream:omni:)");
    }
    const auto& s = segments.back();
    const double markers = omni && s.kind != SegmentKind::kText && s.kind != SegmentKind::kPadding
                               ? (s.audio_tokens > 0 ? 4.0 : 2.0)
                               : 0.0;
    total += s.kind == SegmentKind::kText || s.kind == SegmentKind::kPadding ||
                     s.kind == SegmentKind::kAudio
                 ? static_cast<double>(s.tokens)
                 : static_cast<double>(s.frames) * static_cast<double>(s.height) *
                       static_cast<double>(s.width);
    total += markers + static_cast<double>(s.audio_tokens);
    TORCH_CHECK(total <= kMaxPositions, "--positions '", text, "': more than ", kMaxPositions,
                " positions (the positions limit)");
  }
  if (!omni) return build_stream(segments);
  StreamOptions options = StreamOptions::qwen2_5_omni();
  options.spatial_merge_size = 1;  // sizes are token grids, as for stream:
  return build_stream(segments, options);
}

// LTX-2's audio-video clock (posenc/core/av_clock.h), sizes in latent frames and patches:
//   "ltx2:video=FxHxW@FPS"            the video's positions: t seconds, h and w pixels
//   "ltx2:audio=N" or "ltx2:audio=Ss" the audio's: t seconds, N latent frames or S seconds of
//                                     audio (round(S * 25) frames, the pipeline's count)
//   "ltx2:video=...,audio=..."        the shared clock, one axis t: the video's times, then the
//                                     audio's (the positions LTX-2's cross-attention rotates by)
StreamLayout parse_ltx2(const std::string& spec, const std::string& text) {
  TORCH_CHECK(!spec.empty(), "--positions '", text,
              "': no segments after 'ltx2:' (video=FxHxW@FPS, audio=N|Ss)");
  std::optional<Positions> video, audio;
  std::stringstream in(spec);
  for (std::string part; std::getline(in, part, ',');) {
    const auto equals = part.find('=');
    TORCH_CHECK(equals != std::string::npos, "--positions '", text, "': segment '", part,
                "' is not kind=size (ltx2: takes video=FxHxW@FPS and audio=N|Ss)");
    const auto kind = part.substr(0, equals), size = part.substr(equals + 1);
    if (kind == "video") {
      TORCH_CHECK(!video, "--positions '", text, "': ltx2: takes one video, got a second");
      const auto at = size.find('@');
      TORCH_CHECK(at != std::string::npos, "--positions '", text, "': segment '", part,
                  "' needs its frame rate (video=FxHxW@FPS, e.g. @24)");
      auto s = parse_extent(size.substr(0, at), text, 3);
      Ltx2VideoClock clock;
      const auto rate = size.substr(at + 1);
      size_t used = 0;
      try {
        clock.fps = std::stod(rate, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      TORCH_CHECK(used > 0 && used == rate.size() && std::isfinite(clock.fps) && clock.fps > 0 &&
                      std::isfinite(static_cast<float>(clock.fps)) &&
                      static_cast<float>(clock.fps) > 0,
                  "--positions '", text, "': '@", rate,
                  "' is not a frame rate (a positive number of frames per second that float32 "
                  "holds)");
      video = ltx2_video_positions(s[0], s[1], s[2], clock);
    } else if (kind == "audio") {
      TORCH_CHECK(!audio, "--positions '", text, "': ltx2: takes one audio track, got a second");
      const int64_t frames = !size.empty() && size.back() == 's'
                                 ? ltx2_audio_latent_frames(parse_seconds(size, text))
                                 : parse_extent(size, text, 1)[0];
      TORCH_CHECK(frames >= 1, "--positions '", text, "': audio=", size,
                  " is no audio latent frame (one is 0.04 s at 25 per second)");
      audio = ltx2_audio_positions(frames);
    } else {
      TORCH_CHECK(false, "--positions '", text, "': unknown segment kind '", kind,
                  "' (ltx2: takes video and audio)");
    }
  }
  StreamLayout layout;
  if (video && audio) {
    layout.positions = ltx2_clock(*video, *audio);
    layout.kinds.assign(static_cast<size_t>(video->size()), SegmentKind::kVideo);
    layout.kinds.insert(layout.kinds.end(), static_cast<size_t>(audio->size()),
                        SegmentKind::kAudio);
  } else {
    layout.positions = video ? *video : *audio;
  }
  return layout;
}

// "2010-01-01 00:00,2010-01-01 03:30" -> epoch seconds on the axis "time".
Positions parse_times(const std::string& spec, const std::string& text) {
  TORCH_CHECK(!spec.empty(), "--positions '", text, "': no timestamps after 'times:'");
  std::vector<double> seconds;
  std::stringstream in(spec);
  for (std::string part; std::getline(in, part, ',');) {
    auto value = timeseries::parse_timestamp(part);
    TORCH_CHECK(value.has_value(), "--positions '", text, "': '", part,
                "' is not a timestamp (YYYY-MM-DD[ HH:MM[:SS]], YYYYMMDD or epoch seconds)");
    seconds.push_back(*value);
  }
  return Positions::values(seconds, "time");
}
}  // namespace

Positions parse_positions(const std::string& text, const std::string& axes) {
  TORCH_CHECK(!text.empty(), "--positions is empty; expected start:stop[:step] or a JSON array");
  if (text.rfind("stream:", 0) == 0) return parse_stream(text.substr(7), text).positions;
  if (text.rfind("times:", 0) == 0) return parse_times(text.substr(6), text);
  if (text.rfind("ltx2:", 0) == 0) return parse_ltx2(text.substr(5), text).positions;
  if (text.rfind("grid:", 0) == 0) {
    auto s = parse_extent(text.substr(5), text, 2);
    return Positions::grid(s[0], s[1]);
  }
  if (text.rfind("volume:", 0) == 0) {
    auto s = parse_extent(text.substr(7), text, 3);
    return Positions::volume(s[0], s[1], s[2]);
  }
  if (text.find(':') != std::string::npos && text.find('[') == std::string::npos) {
    std::vector<double> parts;
    std::stringstream in(text);
    for (std::string part; std::getline(in, part, ':');) {
      size_t used = 0;
      double value = 0;
      try {
        value = std::stod(part, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      TORCH_CHECK(used > 0 && used == part.size(), "--positions '", text, "': '", part,
                  "' is not a number");
      parts.push_back(value);
    }
    TORCH_CHECK(parts.size() == 2 || parts.size() == 3, "--positions '", text,
                "': expected start:stop or start:stop:step, got ", parts.size(), " fields");
    const double step = parts.size() == 3 ? parts[2] : 1.0;
    TORCH_CHECK(step > 0, "--positions '", text, "': step must be positive, got ", step);
    TORCH_CHECK(parts[1] > parts[0], "--positions '", text, "': stop (", parts[1],
                ") must be greater than start (", parts[0], ")");
    const double count = std::ceil((parts[1] - parts[0]) / step);
    TORCH_CHECK(std::isfinite(parts[0]) && std::isfinite(parts[1]) && count <= kMaxPositions,
                "--positions '", text, "': ", count, " positions; the limit is ", kMaxPositions);
    TORCH_CHECK(std::max(std::abs(parts[0]), std::abs(parts[1])) < kMaxExactPosition,
                "--positions '", text,
                "': positions must stay below 2^53 = 9007199254740992 (the exact-position "
                "limit: float64 repeats or rounds integers past it)");
    auto values = torch::arange(parts[0], parts[1], step, torch::kFloat64);
    return Positions(values.unsqueeze(1), split_axes(axes, 1));
  }
  nlohmann::json parsed;
  try {
    parsed = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception&) {  // parse errors, and numbers out of range
    TORCH_CHECK(false, "--positions '", text,
                "': expected start:stop[:step], grid:HxW, volume:TxHxW, stream:..., times:..., "
                "ltx2:... or a JSON array");
  }
  TORCH_CHECK(parsed.is_array() && !parsed.empty(),
              "--positions: expected a non-empty JSON array, got ", parsed.dump());
  std::vector<double> flat;
  int64_t width = -1;
  for (size_t i = 0; i < parsed.size(); ++i) {
    const auto& item = parsed[i];
    std::vector<double> row;
    // a number past 2^53, integer or float (9007199254740993.0 parses as ...992), would round to
    // a neighbour's value: refused as the integers are
    auto exact = [&](const nlohmann::json& v) {
      TORCH_CHECK(std::abs(v.get<double>()) < kMaxExactPosition, "--positions[", i,
                  "]: ", v.is_number_float() ? "a number read as " : "", v.dump(),
                  " is past 2^53 = 9007199254740992 (the exact-position limit): float64 would "
                  "round it");
      return v.get<double>();
    };
    if (item.is_number()) {
      row.push_back(exact(item));
    } else if (item.is_array()) {
      for (const auto& v : item) {
        TORCH_CHECK(v.is_number(), "--positions[", i, "]: expected numbers, got ", v.dump());
        row.push_back(exact(v));
      }
    } else {
      TORCH_CHECK(false, "--positions[", i, "]: expected a number or a list of numbers, got ",
                  item.dump());
    }
    if (width < 0) width = static_cast<int64_t>(row.size());
    TORCH_CHECK(static_cast<int64_t>(row.size()) == width, "--positions[", i, "] has ", row.size(),
                " coordinates but the first position has ", width);
    flat.insert(flat.end(), row.begin(), row.end());
  }
  auto coords = torch::tensor(flat, torch::kFloat64).view({-1, width});
  return Positions(coords, split_axes(axes, width));
}

nlohmann::ordered_json tensor_to_json(const at::Tensor& tensor) {
  auto t = tensor.detach().to(torch::kCPU);
  if (t.dim() == 0) {
    if (at::isIntegralType(t.scalar_type(), /*includeBool=*/true)) return t.item<int64_t>();
    return t.item<double>();
  }
  auto out = nlohmann::ordered_json::array();
  for (int64_t i = 0; i < t.size(0); ++i) out.push_back(tensor_to_json(t[i]));
  return out;
}

PlanRequest parse_plan_request(const std::string& text, const std::string& axes) {
  if (text.rfind("stream:", 0) == 0) {
    auto layout = parse_stream(text.substr(7), text);
    PlanRequest request{layout.positions};
    request.token_kinds = layout.kinds;
    return request;
  }
  if (text.rfind("ltx2:", 0) == 0) {
    auto layout = parse_ltx2(text.substr(5), text);
    PlanRequest request{layout.positions};
    request.token_kinds = layout.kinds;
    return request;
  }
  return PlanRequest{parse_positions(text, axes)};
}

namespace {
// Which tokens a part touched: for an additive part, the rows its embedding is non-zero on.
nlohmann::ordered_json token_ranges(const at::Tensor& touched) {
  auto out = nlohmann::ordered_json::array();
  const auto flags = touched.to(torch::kBool).contiguous();
  const auto* f = flags.data_ptr<bool>();
  for (int64_t i = 0, n = flags.numel(); i < n;) {
    if (!f[i]) {
      ++i;
      continue;
    }
    int64_t j = i;
    while (j < n && f[j]) ++j;
    out.push_back({i, j});  // [begin, end)
    i = j;
  }
  return out;
}
}  // namespace

nlohmann::ordered_json plan_to_json(const EncodingPlan& plan, int64_t heads) {
  nlohmann::ordered_json out;
  const auto& request = plan.request();
  const int64_t n = request.queries.size();
  auto parts = nlohmann::ordered_json::array();
  for (const auto& part : plan.parts()) {
    nlohmann::ordered_json p{{"encoder", part.encoder}, {"role", part.role}};
    auto all = torch::ones({n}, torch::kBool);
    if (part.role == "additive" && part.encoder.find(" on ") != std::string::npos) {
      // a per-modality part: the tokens of that modality
      const auto modality = part.encoder.substr(part.encoder.find(" on ") + 4);
      auto touched = torch::zeros({n}, torch::kBool);
      for (int64_t i = 0; i < static_cast<int64_t>(request.token_kinds.size()); ++i)
        if (to_string(request.token_kinds[i]) == modality) touched[i] = true;
      all = touched;
    }
    p["tokens"] = token_ranges(all);
    parts.push_back(p);
  }
  out["parts"] = parts;
  if (plan.has_additive()) out["embedding"] = tensor_to_json(plan.embedding().detach());
  if (plan.has_rotary()) {
    const auto& r = plan.rotary();
    out["rotary"] = {{"layout", to_string(r.layout)},
                     {"shared", r.shared},
                     {"cos", tensor_to_json(r.q_cos.detach())},
                     {"sin", tensor_to_json(r.q_sin.detach())}};
    if (!r.shared) {
      out["rotary"]["k_cos"] = tensor_to_json(r.k_cos.detach());
      out["rotary"]["k_sin"] = tensor_to_json(r.k_sin.detach());
    }
  }
  if (plan.has_bias()) {
    auto forms = nlohmann::ordered_json::array();
    for (const auto& spec : plan.bias_specs()) {
      forms.push_back(to_string(spec.form));
      if (spec.form == BiasForm::kAlibi) out["alibi_slopes"] = tensor_to_json(spec.slopes);
    }
    out["bias_forms"] = forms;
    if (plan.num_query_biases() == 0 &&
        std::none_of(plan.bias_specs().begin(), plan.bias_specs().end(),
                     [](const BiasSpec& s) { return s.form == BiasForm::kRelativeTable; })) {
      auto bias = plan.materialize_bias(heads);
      out["bias"] = tensor_to_json(bias.detach());
    }
  }
  return out;
}

PositionalEncoding build_from_args(const EncoderArgs& args, nlohmann::ordered_json* resolution) {
  TORCH_CHECK(args.config.empty() != args.hf_config.empty(),
              "give exactly one of --config (a posenc encoder config) and --hf-config (a model's "
              "config.json)");
  if (args.hf_config.empty()) {
    TORCH_CHECK(args.layer_type.empty() && args.angle_dtype == "float64",
                "--layer-type and --angle-dtype go with --hf-config (in --config, set "
                "'angle_dtype' in the config)");
    return build_encoder(config_from_argument(args.config), ModelContext{args.dim, args.heads, 0});
  }
  HfConfigOptions options;
  options.layer_type = args.layer_type;
  options.angle_dtype = args.angle_dtype;
  auto resolved = load_hf_config(args.hf_config, options);
  for (const auto& warning : resolved.warnings) TORCH_WARN(warning);
  if (resolution) *resolution = to_json(resolved);
  return build_encoder(resolved, ModelContext{args.dim, args.heads, 0});
}

// The roles a plan holds, joined: "additive", "rotary", "bias", "rotary+bias", or "none".
std::string plan_kind(const EncodingPlan& plan) {
  std::string kind;
  auto add = [&](bool present, const char* name) {
    if (!present) return;
    if (!kind.empty()) kind += "+";
    kind += name;
  };
  add(plan.has_additive(), "additive");
  add(plan.has_rotary(), "rotary");
  add(plan.has_bias(), "bias");
  return kind.empty() ? "none" : kind;
}

int run_inspect(const EncoderArgs& args, const std::string& input) {
  nlohmann::ordered_json resolution;
  auto encoder = build_from_args(args, &resolution);
  auto request = parse_plan_request(args.positions, args.axes);
  const auto& positions = request.queries;
  torch::NoGradGuard no_grad;
  auto plan = encoder->plan(request);
  nlohmann::ordered_json out;  // keys in the order written: type and kind first
  if (!resolution.is_null()) out["hf"] = resolution;  // what posenc uses, and from where
  out["type"] = encoder->type();
  out["kind"] = plan_kind(plan);
  out["axes"] = positions.axes();
  out["positions"] = tensor_to_json(positions.coords());
  if (!request.token_kinds.empty()) {  // a stream: what each token is (text, audio, markers, ...)
    std::vector<std::string> kinds;
    for (auto kind : request.token_kinds) kinds.push_back(to_string(kind));
    out["tokens"] = kinds;
  }
  if (plan.has_bias() && plan.bias_specs().size() == 1)
    out["bias_form"] = to_string(plan.bias_specs()[0].form);
  DescribeOptions options;
  options.seq_len = args.seq_len;
  for (const auto& [name, value] : encoder->describe(positions, options))
    out[name] = tensor_to_json(value);
  if (plan.parts().size() > 1 || !request.token_kinds.empty())
    out["plan"] = plan_to_json(plan, args.heads > 0 ? args.heads : -1);
  if (!input.empty()) {
    auto vector = nlohmann::json::parse(input, nullptr, false);
    TORCH_CHECK(vector.is_array() && !vector.empty(),
                "--input: expected a JSON array of numbers, got ", input);
    std::vector<double> values;
    for (const auto& v : vector) {
      TORCH_CHECK(v.is_number(), "--input: expected numbers, got ", v.dump());
      values.push_back(v.get<double>());
    }
    TORCH_CHECK(plan.has_additive() || plan.has_rotary() || !plan.has_bias(),
                "--input applies to additive and rotary encoders; '", encoder->type(),
                "' biases attention logits (see 'bias')");
    const int64_t n = positions.size(), d = static_cast<int64_t>(values.size());
    auto x = torch::tensor(values, torch::kFloat32).expand({n, d}).contiguous();
    // the plan applied as a model would: embedding added, then q rotated (one head of width d)
    if (plan.has_additive()) {
      const auto& rows = plan.prefix_embedding();
      TORCH_CHECK(!rows.defined(), "--input: '", encoder->type(),
                  "' has prefix rows (CLS); inspect its table instead");
      x = plan.apply_additive(x.unsqueeze(0))[0];
    }
    if (plan.has_rotary()) {
      auto q = x.view({1, n, 1, d});
      x = plan.apply_rotary(q, q).first.view({n, d});
    }
    out["output"] = tensor_to_json(x);
  }
  std::cout << out.dump() << "\n";
  return 0;
}

}  // namespace posenc::cli
