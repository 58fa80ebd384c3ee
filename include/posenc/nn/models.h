// Task heads on the pre-norm transformer (posenc/nn/transformer.h). Each takes its positional
// encoding through the interface and never asks which one it holds.
//
//   TokenClassifier    tokens [B, N, Td] -> Linear -> transformer -> pool -> logits [B, K]
//                      ViT on image patches (Dosovitskiy et al. 2021) and the video classifier on
//                      tubelets (ViViT, Arnab et al. 2021); pooling by a CLS token (a prefix
//                      token without position) or the mean over tokens
//   LanguageModel      bytes [B, N] -> Embedding -> causal transformer -> logits [B, N, V]
//                      (byte-level LM; generation with a key-value cache)
//   Forecaster         readings [B, N, C] with a mask of observed ones -> predictions [B, N, C];
//                      unobserved slots (the future) enter as a learned query token and their
//                      timestamps, so the model is told *when* to predict; forward_packed
//                      takes tokens (patch, variate) of several samples per row (Moirai's
//                      packing, sample ids) with positions on axes (time, variate)
//   TextVideoMatcher   one stream [video tubelets | caption bytes] -> score [B]: whether the
//                      caption describes the clip. Stream positions (e.g. M-RoPE, Qwen2-VL) go to
//                      the attention; optional per-modality additive encoders act on each segment
//                      before they are joined (the "separate encoders" baseline)
#pragma once

#include <torch/arg.h>
#include <torch/nn/modules/embedding.h>

#include <string>
#include <vector>

#include "posenc/nn/transformer.h"

namespace posenc {

enum class Pooling { kMean, kCls };
std::string to_string(Pooling pooling);
Pooling pooling_from_string(const std::string& name);

struct TokenClassifierOptions {
  TokenClassifierOptions(int64_t token_dim, int64_t num_classes, TransformerOptions transformer)
      : token_dim_(token_dim), num_classes_(num_classes), transformer_(std::move(transformer)) {}
  /// Values per input token (C * p * p for patches, C * t * p * p for tubelets).
  TORCH_ARG(int64_t, token_dim);
  /// Classes K.
  TORCH_ARG(int64_t, num_classes);
  TORCH_ARG(TransformerOptions, transformer);
  /// kMean (default) or kCls.
  TORCH_ARG(Pooling, pooling) = Pooling::kMean;
};

class TokenClassifierImpl : public torch::nn::Module {
 public:
  TokenClassifierImpl(TokenClassifierOptions options, PositionalEncoding encoder);
  /// tokens [B, N, Td], positions of the N tokens -> logits [B, K].
  at::Tensor forward(const at::Tensor& tokens, const Positions& positions);

  TokenClassifierOptions options;
  torch::nn::Linear embed{nullptr}, head{nullptr};
  torch::Tensor cls;  ///< [1, 1, D] with kCls
  Transformer transformer{nullptr};
};
TORCH_MODULE(TokenClassifier);

struct LanguageModelOptions {
  explicit LanguageModelOptions(TransformerOptions transformer)
      : transformer_(std::move(transformer)) {}
  /// Causal is forced on.
  TORCH_ARG(TransformerOptions, transformer);
  /// Vocabulary V (default 256: bytes).
  TORCH_ARG(int64_t, vocab_size) = 256;
};

class LanguageModelImpl : public torch::nn::Module {
 public:
  LanguageModelImpl(LanguageModelOptions options, PositionalEncoding encoder);
  /// tokens [B, N] int64 -> logits [B, N, V]. With caches, positions are the new tokens'.
  at::Tensor forward(const at::Tensor& tokens, const Positions& positions,
                     std::vector<KVCache>* caches = nullptr);
  /// Greedy continuation of prompt [B, N] by `steps` tokens, with a key-value cache -> [B, steps].
  at::Tensor generate(const at::Tensor& prompt, int64_t steps);

  LanguageModelOptions options;
  torch::nn::Embedding embed{nullptr};
  Transformer transformer{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(LanguageModel);

struct ForecasterOptions {
  ForecasterOptions(int64_t channels, TransformerOptions transformer)
      : channels_(channels), transformer_(std::move(transformer)) {}
  /// Values per reading C.
  TORCH_ARG(int64_t, channels);
  TORCH_ARG(TransformerOptions, transformer);
};

class ForecasterImpl : public torch::nn::Module {
 public:
  ForecasterImpl(ForecasterOptions options, PositionalEncoding encoder);
  /// values [B, N, C]; observed [B, N] bool (false: predict this slot) -> [B, N, C].
  at::Tensor forward(const at::Tensor& values, const at::Tensor& observed,
                     const Positions& positions);
  /// Several samples packed per row (Moirai's packing): sample_ids [B, N], each sample one
  /// contiguous run (attention keeps to it: PlanRequest::sample_ids) -> [B, N, C]. A row's
  /// padding is a sample of its own (timeseries::pack_samples), so no key padding is needed and
  /// no query row is left without keys.
  at::Tensor forward_packed(const at::Tensor& values, const at::Tensor& observed,
                            const Positions& positions, const at::Tensor& sample_ids);

  ForecasterOptions options;
  torch::nn::Linear embed{nullptr}, head{nullptr};
  torch::Tensor query;  ///< [D]: the input of an unobserved slot
  Transformer transformer{nullptr};
};
TORCH_MODULE(Forecaster);

struct TextVideoMatcherOptions {
  TextVideoMatcherOptions(int64_t tubelet_dim, TransformerOptions transformer)
      : tubelet_dim_(tubelet_dim), transformer_(std::move(transformer)) {}
  /// Values per tubelet.
  TORCH_ARG(int64_t, tubelet_dim);
  TORCH_ARG(TransformerOptions, transformer);
  /// Text vocabulary (default 256: bytes).
  TORCH_ARG(int64_t, vocab_size) = 256;
};

struct MatchInput {
  at::Tensor video;            ///< [B, Nv, Td] tubelets
  Positions video_positions;   ///< (t, h, w) of the tubelets, for a per-modality encoder
  at::Tensor text;             ///< [B, Nt] int64 bytes
  at::Tensor text_padding;     ///< [B, Nt] bool, true where a byte is real (optional)
  Positions text_positions;    ///< 1D positions of the bytes, for a per-modality encoder
  Positions stream_positions;  ///< Nv + Nt positions of the joined stream (e.g. M-RoPE's t,h,w)
  /// Each stream token's modality (video first, then text), for a compose encoder's
  /// per-modality parts; empty: filled in as Nv video then Nt text tokens.
  std::vector<SegmentKind> stream_kinds;
};

class TextVideoMatcherImpl : public torch::nn::Module {
 public:
  /// stream_encoder acts in the joint attention; text/video encoders (additive, optional) on
  /// each segment before the join.
  TextVideoMatcherImpl(TextVideoMatcherOptions options, PositionalEncoding stream_encoder,
                       PositionalEncoding text_encoder = nullptr,
                       PositionalEncoding video_encoder = nullptr);
  /// -> scores [B] (logits: caption matches clip).
  at::Tensor forward(const MatchInput& input);

  TextVideoMatcherOptions options;
  torch::nn::Embedding text_embed{nullptr}, modality_embed{nullptr};
  torch::nn::Linear video_embed{nullptr}, head{nullptr};
  PositionalEncoding text_encoder{nullptr}, video_encoder{nullptr};
  Transformer transformer{nullptr};
};
TORCH_MODULE(TextVideoMatcher);

}  // namespace posenc
