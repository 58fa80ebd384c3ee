// Moving Fashion-MNIST generator and writer; see moving_fashion.h.
#include "moving_fashion.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <vector>

#include "video.h"
#include "vision/images.h"

namespace posenc::video {

namespace {

// Unit step (x right, y down) of each direction, in direction_names(8) order.
constexpr double kDiagonal = 0.70710678118654752440;  // 1 / sqrt(2)
constexpr double kStepX[8] = {1, -1, 0, 0, kDiagonal, -kDiagonal, kDiagonal, -kDiagonal};
constexpr double kStepY[8] = {0, 0, 1, -1, kDiagonal, kDiagonal, -kDiagonal, -kDiagonal};

void check_options(const vision::FashionMnist& source, int64_t count, const MovingOptions& o) {
  const std::string who = "generate_moving_clips: ";
  TORCH_CHECK(source.images.defined() && source.images.dim() == 3 && source.images.size(0) > 0, who,
              "source images must be a non-empty [M, h, w] tensor, got ",
              source.images.defined() ? source.images.sizes() : at::IntArrayRef{});
  TORCH_CHECK(source.labels.defined() && source.labels.numel() == source.images.size(0), who,
              "source needs one label per image (", source.images.size(0), "), got ",
              source.labels.defined() ? source.labels.numel() : 0);
  TORCH_CHECK(count >= 0, who, "count must be >= 0, got ", count);
  TORCH_CHECK(o.num_frames >= 1, who, "num_frames must be >= 1, got ", o.num_frames);
  TORCH_CHECK(o.item_size >= 1 && o.item_size <= o.canvas, who,
              "item_size must be in [1, canvas=", o.canvas, "], got ", o.item_size);
  TORCH_CHECK(o.min_speed > 0 && o.min_speed <= o.max_speed, who,
              "speeds must satisfy 0 < min_speed <= max_speed, got min_speed=", o.min_speed,
              ", max_speed=", o.max_speed);
  TORCH_CHECK(o.num_directions == 4 || o.num_directions == 8, who,
              "num_directions must be 4 or 8, got ", o.num_directions);
  TORCH_CHECK(!o.turn || (o.min_phase_frames >= 1 && o.num_frames - 1 >= 2 * o.min_phase_frames),
              who, "a turning clip needs min_phase_frames >= 1 frame steps on each side of the ",
              "turn: ", o.num_frames, " frames with min_phase_frames = ", o.min_phase_frames,
              " do not fit (need num_frames >= 2 min_phase_frames + 1)");
  // A turn keeps every axis's travel within speed * (T - 1): the two phases add up to T - 1 steps.
  const double travel = o.max_speed * static_cast<double>(o.num_frames - 1);
  TORCH_CHECK(travel <= static_cast<double>(o.canvas - o.item_size), who, "an item of ",
              o.item_size, " px moving up to ", o.max_speed, " px/frame for ", o.num_frames,
              " frames travels ", travel, " px, but a canvas of ", o.canvas, " leaves only ",
              o.canvas - o.item_size,
              " px; use a larger canvas, a smaller item, fewer frames or a lower max_speed");
}

// "a sneaker moves left"; with a second direction (>= 0) "a sneaker moves left, then up".
std::string caption_of(int64_t item, int64_t direction, int64_t direction2,
                       int64_t num_directions) {
  const std::string noun = vision::FashionMnist::class_names().at(static_cast<size_t>(item));
  const std::string article = std::string("aeiou").find(noun[0]) != std::string::npos ? "an" : "a";
  const auto& names = MovingClips::direction_names(num_directions);
  auto caption = article + " " + noun + " moves " + names[static_cast<size_t>(direction)];
  if (direction2 >= 0) caption += ", then " + names[static_cast<size_t>(direction2)];
  return caption;
}

// Pastes items [N, 1, S, S] into zero frames [N, T, 1, canvas, canvas]; start [N, 2] in [0, 1)
// picks each clip's first offset among those that keep the item inside for all T frames. The
// offset from the start at frame t is v1 * min(t, k) + v2 * max(0, t - k): without a turn k is
// T - 1 and v2 is 0, which is v1 * t.
at::Tensor render(const at::Tensor& items, const at::Tensor& direction, const at::Tensor& speed,
                  const at::Tensor& start, const at::Tensor& direction2,
                  const at::Tensor& turn_frame, const MovingOptions& o) {
  const int64_t count = items.size(0), size = o.item_size, steps = o.num_frames - 1;
  const double room = static_cast<double>(o.canvas - size);
  auto frames = torch::zeros({count, o.num_frames, 1, o.canvas, o.canvas}, torch::kFloat32);
  std::vector<double> dx(static_cast<size_t>(o.num_frames)), dy(dx.size());
  for (int64_t n = 0; n < count; ++n) {
    const int64_t d = direction[n].item<int64_t>();
    const double s = speed[n].item<double>();
    const double vx = kStepX[d] * s, vy = kStepY[d] * s;
    double wx = 0, wy = 0;
    int64_t k = steps;
    if (o.turn) {
      const int64_t d2 = direction2[n].item<int64_t>();
      wx = kStepX[d2] * s;
      wy = kStepY[d2] * s;
      k = turn_frame[n].item<int64_t>();
    }
    // offset x0 in [-min_t dx(t), room - max_t dx(t)], likewise y0 (dx(0) = 0)
    double lo_x = 0, hi_x = room, lo_y = 0, hi_y = room;
    for (int64_t t = 0; t < o.num_frames; ++t) {
      const auto i = static_cast<size_t>(t);
      const double before = static_cast<double>(std::min(t, k));
      const double after = static_cast<double>(std::max<int64_t>(0, t - k));
      dx[i] = vx * before + wx * after;
      dy[i] = vy * before + wy * after;
      lo_x = std::max(lo_x, -dx[i]);
      hi_x = std::min(hi_x, room - dx[i]);
      lo_y = std::max(lo_y, -dy[i]);
      hi_y = std::min(hi_y, room - dy[i]);
    }
    const double x0 = lo_x + start[n][0].item<double>() * (hi_x - lo_x);
    const double y0 = lo_y + start[n][1].item<double>() * (hi_y - lo_y);
    for (int64_t t = 0; t < o.num_frames; ++t) {
      const auto i = static_cast<size_t>(t);
      const auto x = std::clamp<int64_t>(std::lround(x0 + dx[i]), 0, o.canvas - size);
      const auto y = std::clamp<int64_t>(std::lround(y0 + dy[i]), 0, o.canvas - size);
      frames[n][t][0].narrow(0, y, size).narrow(1, x, size).copy_(items[n][0]);
    }
  }
  return frames;
}

}  // namespace

const std::vector<std::string>& MovingClips::direction_names(int64_t num_directions) {
  static const std::vector<std::string> four{"right", "left", "down", "up"};
  static const std::vector<std::string> eight{"right",      "left",      "down",     "up",
                                              "down-right", "down-left", "up-right", "up-left"};
  TORCH_CHECK(num_directions == 4 || num_directions == 8,
              "MovingClips::direction_names: num_directions must be 4 or 8, got ", num_directions);
  return num_directions == 4 ? four : eight;
}

MovingClips generate_moving_clips(const vision::FashionMnist& source, int64_t count,
                                  const MovingOptions& options) {
  check_options(source, count, options);
  auto generator = at::make_generator<at::CPUGeneratorImpl>(options.seed);
  const auto index = torch::randint(0, source.images.size(0), {count}, generator, torch::kLong);
  MovingClips clips;
  clips.direction = torch::randint(0, options.num_directions, {count}, generator, torch::kLong);
  auto speed =
      torch::rand({count}, generator, torch::kFloat64) * (options.max_speed - options.min_speed) +
      options.min_speed;
  auto start = torch::rand({count, 2}, generator, torch::kFloat64);
  clips.item = source.labels.index_select(0, index).to(torch::kLong);
  TORCH_CHECK(count == 0 ||
                  (clips.item.min().item<int64_t>() >= 0 && clips.item.max().item<int64_t>() < 10),
              "generate_moving_clips: source labels must be Fashion-MNIST classes 0..9");
  // [count, h, w] uint8 -> [count, 1, S, S] float in [0, 1]
  auto items = source.images.index_select(0, index).unsqueeze(1).to(torch::kFloat32).div(255);
  if (count > 0) {
    items = vision::resize_images(items, options.item_size, options.item_size).clamp(0, 1);
  }
  if (options.turn) {  // drawn after the rest, so clips without a turn stay as they were
    const int64_t nd = options.num_directions, steps = options.num_frames - 1;
    clips.direction2 =
        (clips.direction + torch::randint(1, nd, {count}, generator, torch::kLong)).remainder(nd);
    clips.turn_frame =
        torch::randint(options.min_phase_frames, steps - options.min_phase_frames + 1, {count},
                       generator, torch::kLong);
    if (!options.turn_frames.empty()) {
      TORCH_CHECK(static_cast<int64_t>(options.turn_frames.size()) == count,
                  "generate_moving_clips: turn_frames has ", options.turn_frames.size(),
                  " entries for ", count, " clips");
      for (int64_t n = 0; n < count; ++n) {
        const int64_t k = options.turn_frames[static_cast<size_t>(n)];
        TORCH_CHECK(k >= options.min_phase_frames && k <= steps - options.min_phase_frames,
                    "generate_moving_clips: turn_frames[", n, "] = ", k, " is outside [",
                    options.min_phase_frames, ", ", steps - options.min_phase_frames, "]");
        clips.turn_frame[n] = k;
      }
    }
  } else {
    TORCH_CHECK(options.turn_frames.empty(),
                "generate_moving_clips: turn_frames given without turn = true");
  }
  clips.frames =
      render(items, clips.direction, speed, start, clips.direction2, clips.turn_frame, options);
  for (int64_t n = 0; n < count; ++n) {
    clips.captions.push_back(caption_of(
        clips.item[n].item<int64_t>(), clips.direction[n].item<int64_t>(),
        options.turn ? clips.direction2[n].item<int64_t>() : -1, options.num_directions));
  }
  return clips;
}

void write_moving_clips(const std::string& directory, const MovingClips& clips, double fps) {
  TORCH_CHECK(clips.frames.defined() && clips.frames.dim() == 5,
              "write_moving_clips: frames must be [N, T, C, H, W], got ",
              clips.frames.defined() ? clips.frames.sizes() : at::IntArrayRef{});
  const int64_t count = clips.frames.size(0);
  TORCH_CHECK(clips.direction.numel() == count && clips.item.numel() == count &&
                  static_cast<int64_t>(clips.captions.size()) == count,
              "write_moving_clips: expected ", count, " directions, items and captions, got ",
              clips.direction.numel(), ", ", clips.item.numel(), ", ", clips.captions.size());
  std::error_code error;
  std::filesystem::create_directories(directory, error);
  TORCH_CHECK(!error, "write_moving_clips: cannot create '", directory, "': ", error.message());
  const std::string csv = directory + "/captions.csv", temporary = csv + ".tmp";
  std::ofstream out(temporary);
  TORCH_CHECK(out, "write_moving_clips: cannot write '", temporary, "'");
  out << "file,direction,item,caption\n";
  for (int64_t n = 0; n < count; ++n) {
    char name[32];
    std::snprintf(name, sizeof(name), "clip_%05lld.avi", static_cast<long long>(n));
    write_video(directory + "/" + name, clips.frames[n], fps);
    out << name << ',' << clips.direction[n].item<int64_t>() << ',' << clips.item[n].item<int64_t>()
        << ",\"" << clips.captions[n] << "\"\n";
  }
  out.close();
  TORCH_CHECK(out, "write_moving_clips: writing '", temporary, "' failed");
  TORCH_CHECK(std::rename(temporary.c_str(), csv.c_str()) == 0, "write_moving_clips: cannot ",
              "rename '", temporary, "' to '", csv, "'");
}

}  // namespace posenc::video
