// `posenc export RUN --to timm`: a trained image_classification ViT as timm's VisionTransformer
// (timm/models/vision_transformer.py) or, when it rotates q and k, as timm's Eva
// (timm/models/eva.py, the ViT-RoPE / DINOv3 family; timm 1.0.31), such that
//
//   model = timm.create_model(model_name, pretrained=False, **model_args)
//   model.load_state_dict(safetensors.torch.load_file("model.safetensors"))   # strict
//
// gives posenc's logits on the same normalized images (tests/timm_export_check.py: within 1e-5,
// float32). The correspondence, block by block (posenc/nn/transformer.h, models.h):
//   embed Linear(C p p -> D) on (C, p, p)-ordered patches = PatchEmbed's Conv2d(C, D, p, stride p)
//     with weight.view(D, C, p, p)                      -> patch_embed.proj.{weight,bias}
//   cls [1, 1, D] (pooling: cls)                         -> cls_token, global_pool 'token'
//   mean pooling after the final LayerNorm               -> global_pool 'avg', fc_norm off
//   the encoder's additive part over the patch grid (a learned table, 2D sin-cos: any additive
//     encoder), evaluated at the training grid; the class token gets none
//                                                        -> pos_embed [1, N, D], no_embed_class
//   no additive part                                     -> pos_embed 'none' (Eva:
//                                                           use_abs_pos_emb False)
//   blocks.i: norm1, attention.qkv ([3, H, Dh] rows, as timm's reshape), attention.out, norm2,
//     fc1, exact-erf GELU, fc2                           -> blocks.i.{norm1, attn.qkv, attn.proj,
//                                                           norm2, mlp.fc1, mlp.fc2}
//   transformer.norm, head                               -> norm, head
// A rotary part (the encoder, or the one part of a composite that rotates, on both axes) makes it
// an Eva with attn_type 'rope' (AttentionRope: one fused qkv Linear whose bias includes the
// key's, as posenc's; EvaAttention's k_bias is a zero buffer, so it is not used), the plain GELU
// Mlp, no qk/scale norms, the final norm before pooling; the CLS token unrotated on both sides
// (posenc's prefix, timm's num_prefix_tokens). The RoPE twins:
//   'rope' with per_axis_frequencies, mrope_section [Dh/4, Dh/4] (contiguous), no partial
//     rotary, position_scale or xPos              -> rope_type 'cat' (RotaryEmbeddingCat over
//     patch indices), rope_temperature theta, rope_rotate_half = layout half, rope_grid_indexing
//     'ij' (section_axes [1, 0]: 'xy')
//   'rope_mixed' (interleaved pairs)              -> rope_type 'mixed', rope_grid_indexing 'xy'
//     (t_x the column); rope.freqs = posenc's [2, H, Dh/2] repeated over the depth (timm learns
//     one set per block)
//   'rope_dinov3' (temperature periods, 'separate' normalization)
//                                                 -> rope_type 'dinov3', rope_temperature,
//     rope_rotate_half, the training-time shift/jitter/rescale carried (eval mode ignores them)
// timm.create_model drops None arguments, so the Eva names' layer scale cannot be turned off:
// init_values 1.0 with blocks.i.gamma_{1,2} = 1 (x * 1.0 is exact). The model name carries the
// LayerNorm eps (a callable, not an argument): 1e-6 -> vit_small_patch16_rope_224 (or
// vit_small_patch16_rope_mixed_224), 1e-5 (posenc's default) -> vit_small_patch16_dinov3_qkvb;
// model_args override every other setting the name makes.
// Settings that must agree and are checked: LayerNorm eps 1e-6 (VisionTransformer; train with
// model.norm_eps: 1e-6) or 1e-6 / 1e-5 (Eva), the same in every norm, attention scale 1/sqrt(Dh)
// and no temperature, bidirectional, no attention-logit bias, MLP width int(D mlp_ratio), no
// prefix rows in the additive table.
// Refused, one line saying what differs (exit 2): rotary encoders without a timm twin (M-RoPE's
// one ladder over both axes, RoPE-Mixed with half pairs, DINOv3 min/max periods or min/max
// normalization, a composite part rotating by one axis or by both in another order,
// 'rope_fractional', ...), bias encoders (ALiBi, relative tables: timm's ViT adds nothing to the
// logits), other tasks.
// timm's data config (pretrained_cfg_overlay: input size, mean, std, crop_pct 1, squash,
// bilinear) makes timm's eval transform give posenc's tensors to the bit for images already
// image_size square; other sizes it resizes with PIL where posenc uses OpenCV (INTER_AREA when
// shrinking, bilinear otherwise): other pixels, 5e-3 .. 5e-2 in the logits of a 16 px model.
// Its input size is the size the model takes, image_size + 2 pad (IDX data: 28 + 2 x 2 = 32):
// posenc's black border has no timm transform, so the caller pads an image_size image by `pad`
// black pixels a side (timm.json's "input" keeps image_size and pad).
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
