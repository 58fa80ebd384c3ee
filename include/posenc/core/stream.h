// Mixed streams of text, images, video and audio: segments laid into one sequence with M-RoPE
// positions under one of two rules (StreamOptions::rule).
//
// StreamRule::kQwen2VL (default): as Qwen2-VL assigns them (Wang et al. 2024, "Qwen2-VL"; HF
// get_rope_index, transformers 4.x rule):
//   text token       (s, s, s) with s the running index: every axis the same, so M-RoPE
//                    reduces to 1D RoPE on text
//   vision segment   its token grid t x h x w (after spatial merging; t outer, then h, then w)
//                    gets (t * interval, h, w) + start, start = (max position so far) + 1
//   text after it    resumes at (max position so far) + 1
//   interval         1, or for video seconds_per_frame * tokens_per_second (Qwen2.5-VL); t *
//                    interval is truncated to an integer in HF's float32 arithmetic,
//                    trunc(fl32(t * fl32(tps * spf))) (25 fps: step 25 -> 4, not 3), unless
//                    floor_time is false (real-time axis, exact)
//   left padding     pad slots get position 0 (as transformers 5.x); real tokens get the
//                    positions of the unpadded stream
// rope_delta = max + 1 - real tokens: the next generated token sits at cache_length + rope_delta.
// Note: transformers 5.24 resumes text after a video at start + max(h, w) instead (ignoring the
// time extent); images agree under both rules. No marker tokens: a vision segment is its grid.
//
// StreamRule::kQwen25Omni: TMRoPE, time-aligned M-RoPE of Qwen2.5-Omni (Xu et al. 2025,
// "Qwen2.5-Omni Technical Report", arXiv:2503.20215; HF Qwen2_5OmniThinkerModel.get_rope_index
// with get_llm_pos_ids_for_vision and get_chunked_index, transformers 5.24
// modeling_qwen2_5_omni.py; checked against tests/fixtures/tmrope.json, whose notes state every
// rule). P = position_id_per_seconds (25), C = int(P * seconds_per_chunk) = 50 positions per
// chunk. Every block starts at next = (max over t, h, w of the previously appended block) + 1:
//   text             (s, s, s), s running, as above
//   audio            <|audio_bos|> <|AUDIO|> x M <|audio_eos|>: M + 2 tokens on the running line
//                    (t = h = w; one position per 40 ms audio token = 1/P s)
//   image            <|vision_bos|> at s; with v = s + 1 the grid (v + f*P, v + h, v + w);
//                    <|vision_eos|> at max(grid) + 1
//   video            as the image with t_off[f] = trunc(fl32(fl32(f * fl32(spg)) * P)), spg =
//                    seconds per temporal grid step (= temporal_patch_size / fps = 2 / fps), the
//                    float32 arithmetic of HF's (arange(grid_t) * spg.float() * P).long()
//   video + audio    <|vision_bos|> <|audio_bos|> BOTH at s; v = s + 1; video tokens
//                    V = (v + t_off[f], v + h, v + w), audio tokens A_k = (v + k) x 3, one time
//                    origin; each of V (by t - v) and A (by k) is cut into chunks: the counter c
//                    starts at 1, a token with value >= c * C closes the chunk before it and c += 1
//                    (one step per token, HF's get_chunked_index); tokens are laid out as video
//                    chunk 0, audio chunk 0, video chunk 1, audio chunk 1, ... (a side with fewer
//                    chunks simply stops); <|audio_eos|> <|vision_eos|> BOTH at e = (max of the
//                    LAST APPENDED chunk) + 1, which can fall below the block's max (video
//                    outlasting the audio in the final chunk); the next block starts at e + 1
//   padding          pad slots hold 1 (HF initialises position_ids with ones); real tokens get
//                    the positions of the unpadded stream
// rope_delta = (max over all real tokens and axes) + 1 - real tokens (markers count).
// Token order inside a video with audio follows the model's chunking of the float32-truncated
// offsets. Qwen2_5OmniProcessor lays input_ids out from float64 offsets; the two differ only
// when rounding straddles a chunk boundary (fixture note "Oddity C": fps 2.6, 40 frames), where
// HF itself puts positions on the wrong tokens. HF applies use_audio_in_video to every video of
// a call; here each video segment follows its own rule (with audio or not).
#pragma once

#include <string>
#include <vector>

#include "posenc/core/positions.h"

namespace posenc {

/// What a token is. The first five are also segment kinds; the four markers only occur per
/// token in StreamLayout::kinds (the Omni rule emits them around their segment's tokens).
enum class SegmentKind {
  kText,
  kImage,
  kVideo,
  kPadding,
  kAudio,      ///< <|AUDIO|> tokens (Omni rule only)
  kVisionBos,  ///< marker <|vision_bos|> (= <|vision_start|>) before an image or video
  kVisionEos,  ///< marker <|vision_eos|> after an image or video
  kAudioBos,   ///< marker <|audio_bos|> before an audio (or a video's audio track)
  kAudioEos,   ///< marker <|audio_eos|> after it
};
/// "text", "image", "video", "padding", "audio", "vision_bos", "vision_eos", "audio_bos",
/// "audio_eos".
std::string to_string(SegmentKind kind);

enum class StreamRule {
  kQwen2VL,     ///< Qwen2-VL / Qwen2.5-VL M-RoPE, no marker tokens (default)
  kQwen25Omni,  ///< Qwen2.5-Omni TMRoPE: markers, audio, videos carrying their audio
};
/// "qwen2_vl", "qwen2.5_omni".
std::string to_string(StreamRule rule);

struct Segment {
  SegmentKind kind = SegmentKind::kText;
  int64_t tokens = 0;  ///< text, padding: number of tokens; audio: <|AUDIO|> tokens (no markers)
  int64_t frames = 1, height = 0, width = 0;  ///< vision: the patch grid (grid_thw)
  /// video: seconds per temporal grid step (Qwen2.5-VL second_per_grid_ts, Omni
  /// second_per_grids); Qwen2-VL rule: > 0 puts real time on the t axis; Omni rule: required
  double seconds_per_frame = 0.0;
  int64_t audio_tokens = 0;  ///< video (Omni rule): tokens of the audio track it carries (0: none)

  static Segment text(int64_t tokens);
  static Segment padding(int64_t tokens);
  static Segment image(int64_t height, int64_t width);
  static Segment video(int64_t frames, int64_t height, int64_t width,
                       double seconds_per_frame = 0.0);
  /// Omni rule: `tokens` audio tokens (see omni_audio_tokens for a count from mel frames).
  static Segment audio(int64_t tokens);
  /// Omni rule: a video interleaved in time chunks with its own audio track of `audio_tokens`.
  static Segment video_with_audio(int64_t frames, int64_t height, int64_t width,
                                  double seconds_per_grid, int64_t audio_tokens);
};

struct StreamOptions {
  StreamRule rule = StreamRule::kQwen2VL;  ///< which model's layout and positions
  int64_t spatial_merge_size = 1;  ///< vision grids shrink by this in h and w (Qwen2-VL/Omni: 2)
  double tokens_per_second = 4.0;  ///< Qwen2-VL rule: t-axis units per second of video (2.5-VL)
  bool floor_time = true;          ///< Qwen2-VL rule: HF floors t * interval to an integer
  /// Qwen2-VL rule: text after a vision segment resumes at start + max(h, w) (transformers 5's
  /// get_rope_index) instead of (max position so far) + 1 (transformers 4, Qwen's code); the two
  /// differ after a video whose time extent is the longest. rope_delta stays max + 1 - tokens.
  bool resume_at_grid_side = false;
  double position_id_per_seconds = 25.0;  ///< Omni rule: t positions per second (P)
  double seconds_per_chunk = 2.0;         ///< Omni rule: video/audio interleaving chunk length

  /// Qwen2.5-Omni-7B's values: rule kQwen25Omni, spatial_merge_size 2, P 25, 2 s chunks.
  static StreamOptions qwen2_5_omni();
};

struct StreamLayout {
  Positions positions;                 ///< [N, 3], axes (t, h, w)
  std::vector<SegmentKind> kinds;      ///< per token (Omni: markers included)
  std::vector<int64_t> segment_index;  ///< per token: the index of the segment it belongs to
  int64_t rope_delta = 0;
};

/// Lays the segments out in order and assigns their positions.
StreamLayout build_stream(const std::vector<Segment>& segments, const StreamOptions& options = {});

/// Audio tokens of a Qwen2.5-Omni audio of `mel_frames` mel frames (10 ms each): HF
/// _get_feat_extract_output_lengths, ((mel_frames - 1) // 2 + 1 - 2) // 2 + 1 with floor
/// division (conv stride 2, then average pool stride 2); 0 for fewer than 3 frames.
/// 100 frames (1 s) -> 25, 37 -> 9, 60 -> 15, 64 -> 16.
int64_t omni_audio_tokens(int64_t mel_frames);

/// Omni rule: the t offset of temporal grid step `frame` of a video, computed in float32 as HF
/// does: trunc(fl32(fl32(frame * fl32(seconds_per_grid)) * fl32(position_id_per_seconds))).
/// 0.32 s per grid, frame 5 -> 39 (exact arithmetic would give 40).
int64_t omni_time_offset(int64_t frame, double seconds_per_grid, double position_id_per_seconds);

}  // namespace posenc
