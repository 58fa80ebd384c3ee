// `posenc export RUN --to timm`: a trained image_classification ViT as timm's VisionTransformer
// (timm/models/vision_transformer.py, timm 1.0.31), such that
//
//   model = timm.create_model(model_name, pretrained=False, **model_args)
//   model.load_state_dict(safetensors.torch.load_file("model.safetensors"))   # strict
//
// gives posenc's logits on the same normalized images (tests/timm_export_check.py: within 1e-5,
// float32). The correspondence, block by block (posenc/nn/transformer.h, models.h):
//   embed Linear(C p p -> D) on (C, p, p)-ordered patches = PatchEmbed's Conv2d(C, D, p, stride p)
//     with weight.view(D, C, p, p)                      -> patch_embed.proj.{weight,bias}
//   cls [1, 1, D] (pooling: cls)                         -> cls_token, global_pool 'token'
//   mean pooling after the final LayerNorm               -> global_pool 'avg', fc_norm False
//   the encoder's additive part over the patch grid (a learned table, 2D sin-cos: any additive
//     encoder), evaluated at the training grid; the class token gets none
//                                                        -> pos_embed [1, N, D], no_embed_class
//   no additive part                                     -> pos_embed 'none'
//   blocks.i: norm1, attention.qkv ([3, H, Dh] rows, as timm's reshape), attention.out, norm2,
//     fc1, exact-erf GELU, fc2                           -> blocks.i.{norm1, attn.qkv, attn.proj,
//                                                           norm2, mlp.fc1, mlp.fc2}
//   transformer.norm, head                               -> norm, head
// Settings that must agree and are checked: LayerNorm eps 1e-6 (timm's; train with
// model.norm_eps: 1e-6), attention scale 1/sqrt(Dh) and no temperature, bidirectional, no
// attention-logit bias, MLP width int(D mlp_ratio), no prefix rows in the additive table.
// Refused, one line saying what differs (exit 2): a rotary encoder (timm's EVA / ViT-RoPE
// attention has no key bias, its k_bias is a zero buffer, while posenc's qkv learns one, which the
// rotation makes position-dependent: no timm architecture computes the same), bias encoders
// (ALiBi, relative tables: timm's ViT adds nothing to the logits), other tasks.
// Written (atomically): DIR/model.safetensors and DIR/timm.json {"model_name", "model_args",
// "input": {channels, image_size, pad, patch, mean, std}, "classes"}.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "posenc/train/safetensors.h"

namespace posenc::train {

struct TimmExport {
  std::string model_name;  ///< a registered timm name whose defaults model_args override
  nlohmann::ordered_json model_args;
  NamedTensors tensors;  ///< timm's state_dict names
  nlohmann::json input;  ///< the task's image_input()
  std::vector<std::string> classes;
};

/// The timm model for a run config and its weights (weights.pt or weights.safetensors).
TimmExport timm_export(const nlohmann::json& config, const std::string& weights);
/// RUN/config.json + RUN/weights.pt -> `out` (default RUN/timm); returns the folder written.
std::string export_run_to_timm(const std::string& run, const std::string& out);

}  // namespace posenc::train
