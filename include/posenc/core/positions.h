// Positions — the one position type of posenc: coordinates with named axes.
//
// A token's position is a point with A coordinates, one per named axis:
//   text      {"t"}            a token index (integer-valued)
//   images    {"h", "w"}       a patch's row and column
//   series    {"time"}         a real timestamp (seconds from an origin, gaps kept)
//   video     {"t", "h", "w"}  frame, row and column
// coords: [N, A] (shared by the batch) or [B, N, A] (per sequence), floating point. The builders
// use float64 so integer positions up to 2^53 and epoch-second timestamps are exact; encoders
// compute angles from them in float64 and cast the result, never the positions.
//
// Encoders consume Positions and check the axes they need (a 1D encoder wants exactly one axis).
// This follows the "positions as coordinates" view of the anchors survey (shared/reference).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <string>
#include <vector>

namespace posenc {

class Positions {
 public:
  Positions() = default;
  /// coords: [N, A] or [B, N, A], floating point and finite; axes: A distinct, non-empty names.
  Positions(at::Tensor coords, std::vector<std::string> axes);

  /// 0+offset, 1+offset, ..., length-1+offset on one axis (a token sequence).
  static Positions sequence(int64_t length, double offset = 0.0, std::string axis = "t");
  /// Explicit 1D values (token indices, timestamps) on one axis.
  static Positions values(const std::vector<double>& values, std::string axis = "t");
  /// A patch grid, row-major (row outer): coords [(height * width), 2] = (row, column),
  /// axes ("h", "w").
  static Positions grid(int64_t height, int64_t width);
  /// A video volume, frame outer then row-major: coords [(frames * height * width), 3],
  /// axes ("t", "h", "w").
  static Positions volume(int64_t frames, int64_t height, int64_t width);

  const at::Tensor& coords() const { return coords_; }
  const std::vector<std::string>& axes() const { return axes_; }
  bool defined() const { return coords_.defined(); }
  bool batched() const { return coords_.dim() == 3; }
  int64_t num_axes() const { return static_cast<int64_t>(axes_.size()); }
  /// N: positions per sequence.
  int64_t size() const;
  /// Index of an axis by name; an error lists the axes there are.
  int64_t axis_index(const std::string& name) const;
  /// One axis' coordinates: [N] or [B, N].
  at::Tensor axis(int64_t index) const;
  at::Tensor axis(const std::string& name) const { return axis(axis_index(name)); }
  /// The same positions moved by `offset` on every axis (e.g. the cache length during decoding).
  Positions shifted(double offset) const;
  /// The same positions with their coordinates on `device` (no copy when they are there; the
  /// values were checked when built, so no new check: no device sync).
  Positions to(c10::Device device) const;
  /// The largest coordinate over all axes (for dynamic scaling: seq_len = max + 1).
  double max() const;
  /// "Positions[N=5, axes=(t)]" — for error messages.
  std::string describe() const;

  /// Checks that there are exactly `expected` axes; `who` names the caller in the error.
  void check_num_axes(const std::string& who, int64_t expected) const;
  /// Checks that every coordinate is an integer in [0, limit), for lookup tables.
  void check_integer_range(const std::string& who, int64_t limit) const;

 private:
  at::Tensor coords_;
  std::vector<std::string> axes_;
};

}  // namespace posenc
