// StreamClassifier: one stream of video, audio, text and marker tokens, laid out by build_stream
// (posenc/core/stream.h), into one transformer; mean pooling; K logits. The model of experiment 8
// (does a spoken word agree with the clip's motion and its caption?).
//
//   video tubelets [B, Nv, Dv] -> Linear  + modality row 0 --+
//   audio frames   [B, Na, Da] -> Linear  + modality row 1 --+--> tokens in the layout's order
//   text bytes     [B, Nt]     -> Embedding + modality row 2 +    (the n-th kVideo token of the
//   markers (<|vision_bos|>, ...) -> one learned row per kind-+     layout is video[:, n], ...)
//   -> transformer (the stream's positions, token kinds to the encoder's plan) -> mean over real
//   tokens -> Linear (or Linear -> GELU -> Linear with head_hidden > 0) -> logits [B, K]
//
// The layout decides the order and the positions decide what attention sees, so the same tokens
// can be placed time-aligned (TMRoPE: a video carrying its audio, chunks interleaved) or one
// modality after the other, with M-RoPE or 1D positions, without changing the model.
#pragma once

#include <torch/arg.h>
#include <torch/nn/modules/embedding.h>

#include <vector>

#include "posenc/core/stream.h"
#include "posenc/nn/transformer.h"

namespace posenc {

struct StreamClassifierOptions {
  StreamClassifierOptions(int64_t video_dim, int64_t audio_dim, int64_t num_outputs,
                          TransformerOptions transformer)
      : video_dim_(video_dim),
        audio_dim_(audio_dim),
        num_outputs_(num_outputs),
        transformer_(std::move(transformer)) {}
  /// Values per video tubelet (Dv).
  TORCH_ARG(int64_t, video_dim);
  /// Values per audio token (Da, e.g. 4 mel frames x 32 bands).
  TORCH_ARG(int64_t, audio_dim);
  /// Logits K (1: a binary decision).
  TORCH_ARG(int64_t, num_outputs);
  TORCH_ARG(TransformerOptions, transformer);
  /// Text vocabulary (default 256: bytes).
  TORCH_ARG(int64_t, vocab_size) = 256;
  /// Hidden width of a two-layer head (0: one linear layer). A decision that compares two
  /// things the pooled features hold (is the spoken word the direction seen?) is not linear in
  /// them; a hidden layer makes it so.
  TORCH_ARG(int64_t, head_hidden) = 0;
};

struct StreamInput {
  at::Tensor video;         ///< [B, Nv, Dv] (Nv = the layout's kVideo tokens; may be 0)
  at::Tensor audio;         ///< [B, Na, Da] (Na = the layout's kAudio tokens)
  at::Tensor text;          ///< [B, Nt] int64 (Nt = the layout's kText tokens)
  at::Tensor text_padding;  ///< [B, Nt] bool, true where a byte is real (optional)
  /// Per stream token: what it is (kVideo, kAudio, kText or a marker). Inputs of each modality
  /// are taken in order: the n-th kVideo token is video[:, n].
  std::vector<SegmentKind> kinds;
  Positions positions;  ///< one position per stream token (the layout's or any other)
};

class StreamClassifierImpl : public torch::nn::Module {
 public:
  StreamClassifierImpl(StreamClassifierOptions options, PositionalEncoding encoder);
  /// -> logits [B, K].
  at::Tensor forward(const StreamInput& input);

  StreamClassifierOptions options;
  torch::nn::Linear video_embed{nullptr}, audio_embed{nullptr}, head{nullptr};
  torch::nn::Linear head_hidden{nullptr};  ///< with options.head_hidden() > 0
  torch::nn::Embedding text_embed{nullptr}, modality_embed{nullptr}, marker_embed{nullptr};
  Transformer transformer{nullptr};
};
TORCH_MODULE(StreamClassifier);

}  // namespace posenc
