// Moving Fashion-MNIST generator and writer; see moving_fashion.h.
#include "moving_fashion.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

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
  const double travel = o.max_speed * static_cast<double>(o.num_frames - 1);
  TORCH_CHECK(travel <= static_cast<double>(o.canvas - o.item_size), who, "an item of ",
              o.item_size, " px moving up to ", o.max_speed, " px/frame for ", o.num_frames,
              " frames travels ", travel, " px, but a canvas of ", o.canvas, " leaves only ",
              o.canvas - o.item_size,
              " px; use a larger canvas, a smaller item, fewer frames or a lower max_speed");
}

std::string caption_of(int64_t item, int64_t direction, int64_t num_directions) {
  const std::string noun = vision::FashionMnist::class_names().at(static_cast<size_t>(item));
  const std::string article = std::string("aeiou").find(noun[0]) != std::string::npos ? "an" : "a";
  return article + " " + noun + " moves " +
         MovingClips::direction_names(num_directions)[static_cast<size_t>(direction)];
}

// Pastes items [N, 1, S, S] into zero frames [N, T, 1, canvas, canvas]; start [N, 2] in [0, 1)
// picks each clip's first offset among those that keep the item inside for all T frames.
at::Tensor render(const at::Tensor& items, const at::Tensor& direction, const at::Tensor& speed,
                  const at::Tensor& start, const MovingOptions& o) {
  const int64_t count = items.size(0), size = o.item_size;
  const double room = static_cast<double>(o.canvas - size), steps = double(o.num_frames - 1);
  auto frames = torch::zeros({count, o.num_frames, 1, o.canvas, o.canvas}, torch::kFloat32);
  for (int64_t n = 0; n < count; ++n) {
    const int64_t d = direction[n].item<int64_t>();
    const double vx = kStepX[d] * speed[n].item<double>(), vy = kStepY[d] * speed[n].item<double>();
    // offset x0 in [max(0, -vx * steps), room - max(0, vx * steps)], likewise y0
    const double lo_x = std::max(0.0, -vx * steps), hi_x = room - std::max(0.0, vx * steps);
    const double lo_y = std::max(0.0, -vy * steps), hi_y = room - std::max(0.0, vy * steps);
    const double x0 = lo_x + start[n][0].item<double>() * (hi_x - lo_x);
    const double y0 = lo_y + start[n][1].item<double>() * (hi_y - lo_y);
    for (int64_t t = 0; t < o.num_frames; ++t) {
      const auto x = std::clamp<int64_t>(std::lround(x0 + vx * double(t)), 0, o.canvas - size);
      const auto y = std::clamp<int64_t>(std::lround(y0 + vy * double(t)), 0, o.canvas - size);
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
  clips.frames = render(items, clips.direction, speed, start, options);
  for (int64_t n = 0; n < count; ++n) {
    clips.captions.push_back(caption_of(
        clips.item[n].item<int64_t>(), clips.direction[n].item<int64_t>(), options.num_directions));
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
