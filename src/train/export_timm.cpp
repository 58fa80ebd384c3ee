// A run's ViT as timm's VisionTransformer or, when it rotates q and k, as timm's Eva; the
// correspondence and the refusals are in posenc/train/export_timm.h.
#include "posenc/train/export_timm.h"

#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <memory>
#include <set>
#include <sstream>

#include "posenc/config/registry.h"
#include "posenc/encoders/compose.h"
#include "posenc/encoders/rope.h"
#include "posenc/encoders/rope_dinov3.h"
#include "posenc/encoders/rope_mixed.h"
#include "posenc/io/durable_file.h"
#include "posenc/nn/models.h"
#include "posenc/train/checkpoint.h"
#include "posenc/train/task.h"
#include "run_folder.h"

namespace posenc::train {

namespace fs = std::filesystem;

namespace {

constexpr double kTimmNormEps = 1e-6;    // timm's LayerNorm default (timm/layers/norm.py)
constexpr double kDinoV3NormEps = 1e-5;  // timm's DINOv3 Eva names: partial(LayerNorm, eps=1e-5)

at::Tensor host(const at::Tensor& t) { return t.detach().to(torch::kCPU).contiguous(); }

std::string join(const std::vector<int64_t>& values) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < values.size(); ++i) out << (i ? ", " : "") << values[i];
  out << "]";
  return out.str();
}

// Eva's RoPE (timm/models/eva.py Eva.__init__ -> create_rope_embed) for the run's rotary encoder:
// its rope_* arguments, the registered name of its family (LayerNorm eps 1e-6), and rope.freqs
// (RoPE-Mixed's learned frequencies, Eva's only RoPE state).
struct EvaRope {
  nlohmann::ordered_json args;
  std::string family;
  at::Tensor freqs;  ///< [2, depth, H, Dh/2] or undefined
};

// posenc's axial RoPE ("rope" with per_axis_frequencies and two sections of Dh/4 pairs) ->
// rope_type 'cat', RotaryEmbeddingCat(in_pixels=False): bands temperature^(-i/(Dh/4)) per axis
// over the integer patch grid, axis 0 the rows ('ij'; section_axes [1, 0]: 'xy', columns first),
// pairs half (rotate_half) or interleaved.
EvaRope eva_rope_axial(const RopeImpl& rope) {
  const auto& o = rope.options;
  const auto& f = o.frequencies();
  const auto& s = o.sections();
  const int64_t quarter = o.head_dim() / 4;
  const std::string what = "export --to timm: the 'rope' encoder ";
  TORCH_CHECK(f.source() == RopeFrequencySource::kPerAxisLadders, what,
              "takes its frequencies from the '", to_string(f.source()),
              "' source; timm's axial RoPE restarts the ladder theta^(-i/(Dh/4)) on each axis "
              "(per_axis_frequencies: true)");
  TORCH_CHECK(o.head_dim() % 4 == 0 && s.sections() == std::vector<int64_t>({quarter, quarter}),
              what, "has sections ", join(s.sections()), " at head_dim ", o.head_dim(),
              "; timm's axial RoPE gives each of the two axes Dh/4 pairs (mrope_section [", quarter,
              ", ", quarter, "])");
  TORCH_CHECK(s.layout() == RopeSectionLayout::kContiguous, what, "interleaves its sections; ",
              "timm's axial RoPE lays them one after the other (section_layout: contiguous)");
  TORCH_CHECK(s.frequency_order() == RopeFrequencyOrder::kPairOrder, what,
              "deals its frequencies to the sections; timm's axial RoPE does not "
              "(frequency_order: pairs)");
  const auto& axes = s.axes();
  TORCH_CHECK(
      axes.empty() || axes == std::vector<int64_t>({0, 1}) || axes == std::vector<int64_t>({1, 0}),
      what, "reads the axes ", join(axes), "; timm's grid gives [0, 1] or [1, 0]");
  TORCH_CHECK(o.partial_rotary_factor() == 1.0, what, "rotates a part (partial_rotary_factor ",
              o.partial_rotary_factor(), ") of each head; timm's axial RoPE rotates all of it");
  TORCH_CHECK(o.position_scale() == 1.0, what, "scales its positions by ", o.position_scale(),
              "; timm's axial RoPE reads the patch indices");
  TORCH_CHECK(!o.xpos(), what, "uses xPos; timm's axial RoPE does not");
  const bool columns_first = axes == std::vector<int64_t>({1, 0});
  return {{{"rope_type", "cat"},
           {"rope_temperature", f.theta()},
           {"rope_rotate_half", o.layout() == RopeLayout::kHalf},
           {"rope_grid_indexing", columns_first ? "xy" : "ij"},
           {"rope_grid_offset", 0.0}},
          "vit_small_patch16_rope_224",
          {}};
}

// posenc's RoPE-Mixed -> rope_type 'mixed', RotaryEmbeddingMixed with grid_indexing 'xy' (t_x the
// column, t_y the row: posenc's angle = w f[0] + h f[1], timm's t_x freqs[0] + t_y freqs[1], the
// same float32 products and sum); posenc's one set of frequencies serves every block, timm learns
// one per block: rope.freqs is it repeated over the depth.
EvaRope eva_rope_mixed(const RopeMixedImpl& rope, int64_t depth) {
  TORCH_CHECK(rope.options.layout() == RopeLayout::kInterleaved,
              "export --to timm: the 'rope_mixed' encoder pairs dimensions 'half'; timm's "
              "RoPE-Mixed requires interleaved pairs (layout: interleaved)");
  auto freqs = host(rope.freqs).to(torch::kFloat32);  // [2, H, Dh/2]
  return {{{"rope_type", "mixed"},
           {"rope_temperature", rope.options.theta()},
           {"rope_rotate_half", false},
           {"rope_grid_indexing", "xy"}},
          "vit_small_patch16_rope_mixed_224",
          freqs.unsqueeze(1).expand({2, depth, freqs.size(1), freqs.size(2)}).contiguous()};
}

// posenc's DINOv3 RoPE -> rope_type 'dinov3', RotaryEmbeddingDinoV3 with Eva's arguments (the
// temperature's periods; Eva passes no min/max period and no normalize_coords, so those stay at
// the ladder and 'separate'); the training-time augmentation is carried for fine-tuning (eval
// mode does not use it on either side).
EvaRope eva_rope_dinov3(const RopeDinoV3Impl& rope) {
  const auto& o = rope.options;
  TORCH_CHECK(!o.min_period() && !o.max_period(),
              "export --to timm: the 'rope_dinov3' encoder takes min_period/max_period; timm's "
              "Eva builds DINOv3 periods from rope_temperature only");
  TORCH_CHECK(
      o.normalize() == GridNormalize::kSeparate,
      "export --to timm: the 'rope_dinov3' encoder normalizes coordinates by the min or max "
      "side; timm's Eva normalizes each axis by its own ('separate')");
  auto optional = [](const std::optional<double>& v) {
    return v ? nlohmann::ordered_json(*v) : nlohmann::ordered_json(nullptr);
  };
  return {{{"rope_type", "dinov3"},
           {"rope_temperature", o.temperature()},
           {"rope_rotate_half", o.layout() == RopeLayout::kHalf},
           {"rope_grid_indexing", "ij"},
           {"rope_grid_offset", 0.0},
           {"rope_shift_coords", optional(o.shift_coords())},
           {"rope_jitter_coords", optional(o.jitter_coords())},
           {"rope_rescale_coords", optional(o.rescale_coords())}},
          "vit_small_patch16_rope_224",
          {}};
}

// The one encoder that rotates q and k: the model's, or the part of a composite whose plan
// rotates (it must act on every token and axis, as Eva's rope does). Export translates encoders
// into another library's classes, so it reads their types here (the layers never do).
EvaRope eva_rope(const PositionalEncoding& encoder, const Positions& grid, int64_t depth) {
  std::shared_ptr<PositionalEncodingImpl> rotary = encoder.ptr();
  if (auto compose = std::dynamic_pointer_cast<ComposeImpl>(rotary)) {
    rotary = nullptr;
    for (const auto& part : compose->parts) {
      if (part.modality) continue;  // a part on one modality's tokens is additive (compose.h)
      std::vector<int64_t> axes;    // the part plans over its axes only (compose.cpp)
      for (const auto& name : part.axes) axes.push_back(grid.axis_index(name));
      const auto own =
          axes.empty() ? grid
                       : Positions(grid.coords().index_select(1, torch::tensor(axes, torch::kLong)),
                                   part.axes);
      if (!part.encoder.ptr()->plan(own).has_rotary()) continue;
      auto names = [](const std::vector<std::string>& axes) {
        std::string out = "[";
        for (size_t i = 0; i < axes.size(); ++i) out += (i ? ", " : "") + axes[i];
        return out + "]";
      };
      TORCH_CHECK(part.axes.empty() || part.axes == grid.axes(),
                  "export --to timm: the composite's '", part.encoder->type(),
                  "' part reads the axes ", names(part.axes), " of the grid's ", names(grid.axes()),
                  "; timm's Eva rotates by both, in the grid's order");
      rotary = part.encoder.ptr();
    }
  }
  if (auto rope = std::dynamic_pointer_cast<RopeImpl>(rotary)) return eva_rope_axial(*rope);
  if (auto mixed = std::dynamic_pointer_cast<RopeMixedImpl>(rotary))
    return eva_rope_mixed(*mixed, depth);
  if (auto dinov3 = std::dynamic_pointer_cast<RopeDinoV3Impl>(rotary))
    return eva_rope_dinov3(*dinov3);
  TORCH_CHECK(false, "export --to timm: the '", rotary ? rotary->type() : encoder->type(),
              "' encoder's rotation has no timm twin (timm's Eva rotates as posenc's axial 'rope' "
              "with per_axis_frequencies, 'rope_mixed' or 'rope_dinov3')");
}

}  // namespace

TimmExport timm_export(const nlohmann::json& config, const std::string& weights) {
  const auto type = config.at("task").value("type", std::string());
  TORCH_CHECK(type == "image_classification", "export --to timm: the run's task is '", type,
              "'; only image_classification ViTs have a timm counterpart");
  torch::manual_seed(0);
  auto task = make_task(config);
  check_class_names(task->class_names(), weights);  // timm.json's classes: the weights' own
  auto model = std::dynamic_pointer_cast<TokenClassifierImpl>(task->model());
  TORCH_CHECK(model, "export --to timm: the run's model is not a TokenClassifier");
  load_parameters(weights, *model);
  model->eval();
  torch::NoGradGuard no_grad;
  const auto input = task->image_input();
  const auto& t = model->options.transformer();
  auto transformer = model->transformer;
  const int64_t d = t.dim(), heads = t.num_heads(), layers = t.num_layers();
  const int64_t patch = input.at("patch").get<int64_t>();
  const int64_t channels = input.at("channels").get<int64_t>();
  const int64_t side = input.at("image_size").get<int64_t>() + 2 * input.at("pad").get<int64_t>();
  const int64_t grid = side / patch;
  const bool cls = model->options.pooling() == Pooling::kCls;
  const std::string encoder = transformer->encoder->type();
  // The encoder through its plan at the training grid: additive parts (pos_embed) and at most one
  // rotary part (Eva's rope); no logit bias.
  const auto positions = Positions::grid(grid, grid);
  auto plan = transformer->encoder->plan(positions);
  TORCH_CHECK(!plan.has_bias(), "export --to timm: the '", encoder,
              "' encoder adds a bias to the attention logits; timm's ViT adds none");
  const bool rotary = plan.has_rotary();
  const EvaRope rope = rotary ? eva_rope(transformer->encoder, positions, layers) : EvaRope{};
  // Settings timm's ViT and Eva fix. LayerNorm eps: 1e-6 in VisionTransformer and the ViT-RoPE
  // Eva names, 1e-5 in the DINOv3 Eva names (a callable, so the model name carries it).
  const double eps = transformer->norm->options.eps();
  TORCH_CHECK(eps == kTimmNormEps || (rotary && eps == kDinoV3NormEps),
              "export --to timm: the model's LayerNorm eps is ", eps,
              rotary ? ", timm's Eva names use 1e-06 (ViT-RoPE) or 1e-05 (DINOv3)"
                     : ", timm's ViT uses 1e-06 (train with model.norm_eps: 1e-6 to export)");
  TORCH_CHECK(!t.causal(),
              "export --to timm: the model's attention is causal; timm's ViT's is not");
  TORCH_CHECK(t.temperature() == AttentionTemperature::kNone,
              "export --to timm: the model scales its logits by an attention temperature; timm's "
              "ViT has none");
  TORCH_CHECK(t.attention_scale() == 0 ||
                  t.attention_scale() == 1.0 / std::sqrt(static_cast<double>(d / heads)),
              "export --to timm: the model's attention scale is ", t.attention_scale(),
              ", timm's ViT uses 1/sqrt(head_dim)");
  const auto hidden =
      model->transformer->blocks[0]->as<TransformerBlockImpl>()->fc1->options.out_features();
  TORCH_CHECK(static_cast<int64_t>(static_cast<double>(d) * t.mlp_ratio()) == hidden,
              "export --to timm: the MLP width ", hidden, " is not int(D mlp_ratio)");
  const int64_t prefix = cls ? 1 : 0;
  at::Tensor pos_embed;
  if (plan.has_additive()) {
    auto added = plan.apply_additive(torch::zeros({1, prefix + grid * grid, d}), prefix);
    TORCH_CHECK(prefix == 0 || host(added.narrow(1, 0, prefix)).abs().max().item<double>() == 0,
                "export --to timm: the '", encoder,
                "' encoder gives the class token a position; timm's no_embed_class does not");
    pos_embed = host(added.narrow(1, prefix, grid * grid));
  }

  TimmExport out;
  out.input = input;
  out.classes = task->class_names();
  out.model_args = {{"img_size", side},
                    {"patch_size", patch},
                    {"in_chans", channels},
                    {"num_classes", model->options.num_classes()},
                    {"embed_dim", d},
                    {"depth", layers},
                    {"num_heads", heads},
                    {"mlp_ratio", t.mlp_ratio()},
                    {"qkv_bias", true},
                    {"class_token", cls},
                    {"global_pool", cls ? "token" : "avg"},
                    {"no_embed_class", true},
                    {"init_values", nullptr}};
  // timm's data config (resolve_data_config / create_transform) from posenc's preprocessing:
  // without it timm resolves 224 px, mean/std 0.5, crop_pct 0.9, bicubic, and its standard eval
  // transform feeds the model other pixels. input_size is the size the model takes, side =
  // image_size + 2 pad (img_size above; timm's patch embedding refuses any other): posenc's
  // black border ('pad', before normalization) has no timm transform, so an image_size image
  // padded by the caller, side x side, is what timm's transform passes through unchanged.
  // 'squash' resizes to side x side as posenc does, but with PIL (posenc: OpenCV's INTER_AREA /
  // bilinear), so only an image already side x side gets posenc's tensor to the bit (other
  // sizes: 5e-3 .. 5e-2 in the logits of a 16 px model).
  out.model_args["pretrained_cfg_overlay"] = {{"input_size", {channels, side, side}},
                                              {"mean", input.at("mean")},
                                              {"std", input.at("std")},
                                              {"crop_pct", 1.0},
                                              {"crop_mode", "squash"},
                                              {"interpolation", "bilinear"}};
  if (!rotary) {
    out.model_name = "vit_base_patch16_224";  // its defaults all overridden
    out.model_args["fc_norm"] = false;
    out.model_args["pos_embed"] = pos_embed.defined() ? "learn" : "none";
  } else {
    // Eva with timm's ViT-RoPE attention (attn_type 'rope': AttentionRope, one fused qkv Linear
    // whose bias includes the key's, as posenc's; EvaAttention's k_bias is a zero buffer), a
    // pre-norm block with the plain GELU Mlp, the final norm before pooling (use_fc_norm False).
    // The name carries the LayerNorm eps; every other setting it makes is overridden here.
    out.model_name = eps == kTimmNormEps ? rope.family : "vit_small_patch16_dinov3_qkvb";
    const nlohmann::ordered_json eva = {{"num_reg_tokens", 0},
                                        {"qkv_fused", true},
                                        {"attn_type", "rope"},
                                        {"qk_norm", false},
                                        {"swiglu_mlp", false},
                                        {"scale_mlp", false},
                                        {"scale_attn_inner", false},
                                        {"use_fc_norm", false},
                                        {"use_post_transformer_norm", true},
                                        {"use_pre_transformer_norm", false},
                                        {"dynamic_img_size", false},
                                        {"use_abs_pos_emb", pos_embed.defined()},
                                        {"use_rot_pos_emb", true}};
    for (const auto& [key, value] : eva.items()) out.model_args[key] = value;
    // timm.create_model drops None arguments, so the names' layer scale (init_values 1e-5) cannot
    // be turned off: it is kept with gamma = 1 (x * 1.0 is exact), written below.
    out.model_args["init_values"] = 1.0;
    out.model_args["attn_only_layer_scale"] = false;
    for (const auto& [key, value] : rope.args.items()) out.model_args[key] = value;
  }
  auto& w = out.tensors;
  std::set<std::string> used;  // posenc names mapped
  auto take = [&](const std::string& timm_name, const std::string& name, at::Tensor value) {
    w.emplace_back(timm_name, host(value).to(torch::kFloat32));
    used.insert(name);
  };
  take("patch_embed.proj.weight", "embed.weight",
       model->embed->weight.view({d, channels, patch, patch}));
  take("patch_embed.proj.bias", "embed.bias", model->embed->bias);
  if (cls) take("cls_token", "cls", model->cls);
  if (pos_embed.defined()) w.emplace_back("pos_embed", pos_embed.to(torch::kFloat32));
  if (rope.freqs.defined()) w.emplace_back("rope.freqs", rope.freqs);
  for (int64_t i = 0; i < layers; ++i) {
    auto block = transformer->blocks[i]->as<TransformerBlockImpl>();
    const auto ours = "transformer.blocks." + std::to_string(i) + ".";
    const auto theirs = "blocks." + std::to_string(i) + ".";
    auto linear = [&](const std::string& timm_part, const std::string& our_part,
                      const torch::nn::Linear& layer) {
      take(theirs + timm_part + ".weight", ours + our_part + ".weight", layer->weight);
      take(theirs + timm_part + ".bias", ours + our_part + ".bias", layer->bias);
    };
    auto norm = [&](const std::string& part, const torch::nn::LayerNorm& layer) {
      TORCH_CHECK(layer->options.eps() == eps, "export --to timm: block ", i,
                  "'s LayerNorm eps is ", layer->options.eps(), ", the final norm's is ", eps);
      take(theirs + part + ".weight", ours + part + ".weight", layer->weight);
      take(theirs + part + ".bias", ours + part + ".bias", layer->bias);
    };
    norm("norm1", block->norm1);
    linear("attn.qkv", "attention.qkv", block->attention->qkv);
    linear("attn.proj", "attention.out", block->attention->out);
    norm("norm2", block->norm2);
    linear("mlp.fc1", "fc1", block->fc1);
    linear("mlp.fc2", "fc2", block->fc2);
    if (rotary)
      for (const char* gamma : {"gamma_1", "gamma_2"})
        w.emplace_back(theirs + gamma, torch::ones({d}, torch::kFloat32));
  }
  take("norm.weight", "transformer.norm.weight", transformer->norm->weight);
  take("norm.bias", "transformer.norm.bias", transformer->norm->bias);
  take("head.weight", "head.weight", model->head->weight);
  take("head.bias", "head.bias", model->head->bias);
  // Every parameter is mapped or is the encoder's (carried by pos_embed and rope.freqs).
  for (const auto& item : model->named_parameters()) {
    const auto& name = item.key();
    TORCH_CHECK(used.count(name) || name.rfind("transformer.encoder.", 0) == 0,
                "export --to timm: the parameter '", name, "' has no place in timm's ViT");
  }
  return out;
}

std::string export_run_to_timm(const std::string& run, const std::string& out) {
  const auto config_path = run + "/config.json";
  TORCH_CHECK(fs::is_regular_file(config_path), "export: '", run,
              "' is not a run folder with a config.json (runs trained by this posenc write it)");
  const auto config = load_config(config_path);
  const auto weights = fs::is_regular_file(run + "/weights.safetensors")
                           ? run + "/weights.safetensors"
                           : run + "/weights.pt";
  TORCH_CHECK(fs::is_regular_file(weights), "export: '", run,
              "' has no weights.safetensors or weights.pt (has the run finished?)");
  auto exported = timm_export(config, weights);
  const std::string folder = out.empty() ? run + "/timm" : out;
  fs::create_directories(folder);
  write_safetensors(folder + "/model.safetensors", exported.tensors, {{"format", "pt"}});
  nlohmann::ordered_json description = {{"model_name", exported.model_name},
                                        {"model_args", exported.model_args},
                                        {"input", exported.input},
                                        {"classes", exported.classes}};
  write_file_atomically(folder + "/timm.json", description.dump(2) + "\n");
  return folder;
}

}  // namespace posenc::train
