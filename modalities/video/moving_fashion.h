// Moving Fashion-MNIST: a labelled synthetic video set in the spirit of Moving MNIST
// (Srivastava et al. 2015), with one Fashion-MNIST item per clip moving in a straight line at a
// constant speed over a black canvas, and a caption naming what moves and where
// ("a sneaker moves left"). Direction is only visible across frames, so a model must use the
// time axis of its positions to tell "left" from "right".
//
// Each clip: a random item of `source`, resized to item_size x item_size (bilinear, antialiased);
// a random direction of num_directions (4: right, left, down, up; 8 adds down-right, down-left,
// up-right, up-left); a speed uniform in [min_speed, max_speed] px per frame along it (diagonal
// moves split it over the two axes); and a start drawn uniformly among the points that keep the
// item fully inside the canvas in every frame (no bouncing). The item's offset is rounded to whole
// pixels in each frame, so every frame holds the whole item: its mass is constant over time.
// Turning clips (turn = true, experiment 8): each clip changes direction once, at a turn frame k
// uniform in [min_phase_frames, T - 1 - min_phase_frames], to a second direction uniform among the
// other num_directions - 1 at the same speed: the offset at frame t is
// p0 + v1 * min(t, k) + v2 * max(0, t - k), and p0 keeps the whole path inside the canvas. The
// caption names both: "a sneaker moves left, then up". Clips without a turn are drawn exactly as
// before (the turn's random draws come after the others).
// Image axes: x grows to the right (columns), y grows downward (rows).
// Deterministic for a seed (a torch CPU generator seeded with it).
// Geometry: an item travels up to max_speed * (num_frames - 1) px along an axis, which must fit in
// the canvas - item_size px left free; the defaults travel 2.5 * 7 = 17.5 of 32 - 14 = 18 px.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "vision/idx.h"

namespace posenc::video {

struct MovingOptions {
  int64_t num_frames = 8;        ///< T, frames per clip
  int64_t canvas = 32;           ///< square canvas side, px
  int64_t item_size = 14;        ///< item resized to item_size x item_size (14: half of 28)
  double min_speed = 1.5;        ///< px per frame, > 0
  double max_speed = 2.5;        ///< px per frame, >= min_speed
  int64_t num_directions = 4;    ///< 4 (right, left, down, up) or 8 (adds the diagonals)
  uint64_t seed = 0;             ///< same seed, same clips
  bool turn = false;             ///< each clip changes direction once (see above)
  int64_t min_phase_frames = 2;  ///< with turn: frame steps before and after the turn, >= 1
  /// With turn: each clip's turn frame, chosen by the caller (empty: drawn uniformly). One per
  /// clip, each in [min_phase_frames, T - 1 - min_phase_frames]; the draws happen all the same, so
  /// everything else about the clips stays as without it.
  std::vector<int64_t> turn_frames;
};

struct MovingClips {
  at::Tensor frames;      ///< [N, T, 1, canvas, canvas] float32 in [0, 1]
  at::Tensor direction;   ///< [N] int64 in [0, num_directions), indexes direction_names()
  at::Tensor item;        ///< [N] int64 Fashion-MNIST class, indexes FashionMnist::class_names()
  at::Tensor direction2;  ///< turn only: [N] int64, the direction after the turn (!= direction)
  at::Tensor turn_frame;  ///< turn only: [N] int64, the frame k where the direction changes
  /// N captions, "a sneaker moves left" (turning: "a sneaker moves left, then up")
  std::vector<std::string> captions;
  /// {"right", "left", "down", "up"} for 4; 8 adds {"down-right", "down-left", "up-right",
  /// "up-left"}.
  static const std::vector<std::string>& direction_names(int64_t num_directions);
};

/// `count` clips from the items of `source` (images [M, h, w] uint8, labels [M]).
/// An error explains options under which an item cannot stay inside the canvas.
MovingClips generate_moving_clips(const posenc::vision::FashionMnist& source, int64_t count,
                                  const MovingOptions& options);

/// Writes <directory>/clip_00000.avi, clip_00001.avi, ... (write_video, MJPG at `fps`) and
/// <directory>/captions.csv with the header "file,direction,item,caption": the file name, the
/// direction and item labels (integers) and the caption. Each file is written atomically;
/// the directory is created when missing.
void write_moving_clips(const std::string& directory, const MovingClips& clips, double fps = 8);

}  // namespace posenc::video
