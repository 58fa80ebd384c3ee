// modalities/video: tubelets (order and values hand-checked on arange tensors), MJPG write/read
// round trips, unreadable files, a real clip from Debian's python3-mecavideo (unpacked by
// scripts/setup.sh; sizes and frame counts as ffprobe and OpenCV report them), and the Moving
// Fashion-MNIST generator (determinism, items inside the canvas, motion in the labelled direction).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "support/fixtures.h"
#include "video/moving_fashion.h"
#include "video/video.h"
#include "vision/idx.h"
#include "vision/images.h"

namespace posenc::video {
namespace {

namespace fs = std::filesystem;
const std::string kMecavideo = std::string(POSENC_DATA_DIR) + "/mecavideo";
const std::string kFashionMnist = "/usr/share/datasets/fashion-mnist";
// MJPG is lossy; smooth test frames come back within this mean absolute error.
constexpr double kMjpgMeanError = 0.05;

fs::path temp_path(const std::string& name) {
  auto dir = fs::temp_directory_path() / "posenc_video_tests";
  fs::create_directories(dir);
  return dir / name;
}

double mean_abs_error(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().mean().item<double>();
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Three hand-made 28 x 28 items: a filled square (sneaker), a vertical bar (trouser), a
// diagonal ramp (ankle boot).
vision::FashionMnist synthetic_items() {
  auto images = torch::zeros({3, 28, 28}, torch::kUInt8);
  images[0].narrow(0, 6, 16).narrow(1, 6, 16).fill_(255);
  images[1].narrow(0, 2, 24).narrow(1, 10, 8).fill_(200);
  auto ramp = torch::arange(28).view({28, 1}) + torch::arange(28).view({1, 28});
  images[2].copy_((ramp * 4).clamp(0, 255).to(torch::kUInt8));
  return {images, torch::tensor({7, 1, 9}, torch::kLong)};
}

// A smooth RGB clip [T, 3, H, W] in [0.1, 0.9] that changes over time.
at::Tensor smooth_clip(int64_t frames, int64_t channels, int64_t height, int64_t width) {
  auto t = torch::arange(frames, torch::kFloat32).view({frames, 1, 1, 1});
  auto c = torch::arange(channels, torch::kFloat32).view({1, channels, 1, 1});
  auto y = torch::arange(height, torch::kFloat32).view({1, 1, height, 1});
  auto x = torch::arange(width, torch::kFloat32).view({1, 1, 1, width});
  return 0.5 + 0.4 * torch::sin(x / 7 + t * 0.5 + c) * torch::cos(y / 9);
}

TEST(VideoTubelets, HandCheckedLayout) {
  // one 2 x 2 x 2 tubelet of [T=2, C=2, H=2, W=2]; value = ((t * 2 + c) * 2 + h) * 2 + w.
  // (dt, dy, dx, c) order: (0,0,0,0)=0 (0,0,0,1)=4 (0,0,1,0)=1 (0,0,1,1)=5 (0,1,0,*)=2,6 ...
  auto frames = torch::arange(16, torch::kFloat32).view({2, 2, 2, 2});
  auto tubelets = tubeletize(frames, 2, 2);
  auto expected =
      torch::tensor({0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15}, torch::kFloat32);
  EXPECT_EQ(tubelets.tokens.sizes(), torch::IntArrayRef({1, 1, 16}));
  EXPECT_TRUE(torch::equal(tubelets.tokens[0][0], expected)) << tubelets.tokens;
}

TEST(VideoTubelets, OrderValuesAndPositions) {
  // [B=2, T=4, C=3, H=4, W=6], t=2, p=2 -> grid 2 x 2 x 3, tokens of 2*2*2*3 = 24 values
  auto frames = torch::arange(2 * 4 * 3 * 4 * 6, torch::kFloat32).view({2, 4, 3, 4, 6});
  auto tubelets = tubeletize(frames, 2, 2);
  ASSERT_EQ(tubelets.tokens.sizes(), torch::IntArrayRef({2, 12, 24}));
  EXPECT_TRUE(torch::equal(tubelets.positions.coords(), Positions::volume(2, 2, 3).coords()));
  EXPECT_EQ(tubelets.positions.axes(), (std::vector<std::string>{"t", "h", "w"}));
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t n = 0; n < 12; ++n) {
      const int64_t gt = n / 6, gh = (n / 3) % 2, gw = n % 3;  // t-major, then row-major
      std::vector<float> expected;
      for (int64_t dt = 0; dt < 2; ++dt)
        for (int64_t dy = 0; dy < 2; ++dy)
          for (int64_t dx = 0; dx < 2; ++dx)
            for (int64_t c = 0; c < 3; ++c)
              expected.push_back(frames[b][gt * 2 + dt][c][gh * 2 + dy][gw * 2 + dx].item<float>());
      EXPECT_TRUE(torch::equal(tubelets.tokens[b][n], torch::tensor(expected))) << b << " " << n;
    }
  }
  // token 8 = (t=1, h=0, w=2)
  EXPECT_TRUE(torch::equal(tubelets.positions.coords()[8],
                           torch::tensor({1.0, 0.0, 2.0}, torch::kFloat64)));
  // [T, C, H, W] is one clip
  auto single = tubeletize(frames[1], 2, 2);
  EXPECT_TRUE(torch::equal(single.tokens[0], tubelets.tokens[1]));
}

TEST(VideoTubelets, SizeMismatchErrors) {
  auto message = test::error_of([] { tubeletize(torch::zeros({5, 1, 8, 8}), 2, 4); });
  EXPECT_TRUE(contains(message, "tubeletize: 5 frames are not divisible by the tubelet length t=2"))
      << message;
  message = test::error_of([] { tubeletize(torch::zeros({1, 4, 1, 6, 8}), 2, 4); });
  EXPECT_TRUE(contains(message, "frame size 6x8 is not divisible by the tubelet side p=4"))
      << message;
  message = test::error_of([] { tubeletize(torch::zeros({4, 8, 8}), 2, 4); });
  EXPECT_TRUE(contains(message, "must be [B, T, C, H, W] or [T, C, H, W], got [4, 8, 8]"))
      << message;
  message = test::error_of([] { tubeletize(torch::zeros({4, 1, 8, 8}), 0, 4); });
  EXPECT_TRUE(contains(message, "tubelet sizes must be positive, got t=0, p=4")) << message;
}

TEST(VideoFiles, WriteReadRoundTrip) {
  const auto path = temp_path("round_trip.avi").string();
  auto frames = smooth_clip(6, 3, 32, 48);
  write_video(path, frames, 12);
  EXPECT_FALSE(fs::exists(path + ".tmp.avi"));
  auto clip = read_video(path);
  ASSERT_EQ(clip.frames.sizes(), frames.sizes());
  EXPECT_EQ(clip.frames.scalar_type(), torch::kFloat32);
  EXPECT_NEAR(clip.fps, 12.0, 1e-6);
  EXPECT_LT(mean_abs_error(clip.frames, frames), kMjpgMeanError);
  EXPECT_EQ(read_video(path, 4).frames.size(0), 4);
  EXPECT_EQ(read_video(path, 100).frames.size(0), 6);
  // gray: stored as three equal channels, read back as one
  auto gray = smooth_clip(5, 1, 24, 40);
  const auto gray_path = temp_path("round_trip_gray.avi").string();
  write_video(gray_path, gray, 8);
  auto gray_clip = read_video(gray_path, -1, true);
  ASSERT_EQ(gray_clip.frames.sizes(), gray.sizes());
  EXPECT_LT(mean_abs_error(gray_clip.frames, gray), kMjpgMeanError);
  auto as_rgb = read_video(gray_path).frames;
  EXPECT_EQ(as_rgb.size(1), 3);
  EXPECT_LT(mean_abs_error(as_rgb, gray.expand({5, 3, 24, 40})), kMjpgMeanError);
}

TEST(VideoFiles, MissingAndCorruptFilesAreErrors) {
  auto message = test::error_of([] { read_video("/nonexistent/clip.avi"); });
  EXPECT_TRUE(contains(message, "read_video: cannot open '/nonexistent/clip.avi': no such file"))
      << message;
  // random bytes named .avi
  const auto noise = temp_path("noise.avi");
  {
    std::ofstream out(noise, std::ios::binary);
    auto bytes = torch::randint(0, 256, {20000}, torch::kUInt8);
    out.write(reinterpret_cast<const char*>(bytes.data_ptr<uint8_t>()), bytes.numel());
  }
  message = test::error_of([&] { read_video(noise.string()); });
  EXPECT_TRUE(contains(
      message, "read_video: cannot open '" + noise.string() + "': not a video OpenCV can decode"))
      << message;
  // the first 4000 bytes of a real AVI: the header without its index and frames
  std::ifstream in(kMecavideo + "/Principe_inertie.avi", std::ios::binary);
  std::vector<char> head(4000);
  ASSERT_TRUE(in.read(head.data(), static_cast<std::streamsize>(head.size())));
  const auto truncated = temp_path("truncated.avi");
  std::ofstream(truncated, std::ios::binary).write(head.data(), 4000);
  message = test::error_of([&] { read_video(truncated.string()); });
  EXPECT_TRUE(contains(message, "read_video: cannot open '" + truncated.string() + "'") ||
              contains(message, "read_video: '" + truncated.string() + "' opened but no frame"))
      << message;
  // cut after a third of its bytes: the container still declares 28 frames; a silently shorter
  // clip was returned before the frame count was checked
  {
    std::ifstream whole(kMecavideo + "/Principe_inertie.avi", std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(whole)),
                            std::istreambuf_iterator<char>());
    const auto cut = temp_path("cut.avi");
    std::ofstream(cut, std::ios::binary)
        .write(bytes.data(), static_cast<std::streamsize>(bytes.size() / 3));
    message = test::error_of([&] { read_video(cut.string()); });
    EXPECT_TRUE(contains(message, "of the 28 frames its container declares (truncated or corrupt)"))
        << message;
    const auto taken = read_video(cut.string(), -1, false, /*allow_short=*/true);
    EXPECT_GT(taken.frames.size(0), 0);
    EXPECT_LT(taken.frames.size(0), 28);
  }
  // both real clips decode every frame their containers declare
  EXPECT_EQ(read_video(kMecavideo + "/Principe_inertie.avi").frames.size(0), 28);
  EXPECT_GT(read_video(kMecavideo + "/Effet_force_magnetique.ogv").frames.size(0), 0);
  message = test::error_of([] { read_video("/nonexistent/clip.avi", 0); });
  EXPECT_TRUE(contains(message, "max_frames must be positive (or < 0 for all), got 0")) << message;
}

TEST(VideoFiles, WriteErrorsNameThePath) {
  auto message = test::error_of([] {
    write_video("/nonexistent/dir/clip.avi", torch::zeros({2, 3, 8, 8}), 8);
  });
  EXPECT_TRUE(contains(message, "write_video: cannot open '/nonexistent/dir/clip.avi' for writing"))
      << message;
  message = test::error_of([] { write_video("x.avi", torch::zeros({2, 2, 8, 8}), 8); });
  EXPECT_TRUE(contains(message, "frames must have 1 or 3 channels, got 2")) << message;
  message = test::error_of([] { write_video("x.avi", torch::zeros({2, 3, 8, 8}), 0); });
  EXPECT_TRUE(contains(message, "fps must be positive, got 0")) << message;
  EXPECT_FALSE(fs::exists("x.avi"));
}

TEST(VideoFiles, RealMecavideoClip) {
  // pymecavideo's example: a puck gliding on an air table, 28 frames of 400 x 300 at 25 fps
  const std::string path = kMecavideo + "/Principe_inertie.avi";
  auto clip = read_video(path);
  ASSERT_EQ(clip.frames.sizes(), torch::IntArrayRef({28, 3, 300, 400}));
  EXPECT_DOUBLE_EQ(clip.fps, 25.0);
  EXPECT_GE(clip.frames.min().item<float>(), 0.0f);
  EXPECT_LE(clip.frames.max().item<float>(), 1.0f);
  const double mean = clip.frames.mean().item<double>();
  EXPECT_GT(mean, 0.05);
  EXPECT_LT(mean, 0.95);
  EXPECT_GT(mean_abs_error(clip.frames[0], clip.frames[27]), 1e-3);  // something moves
  // the first 8 frames in gray, as 2 x 20 x 20 tubelets
  auto gray = read_video(path, 8, true);
  ASSERT_EQ(gray.frames.sizes(), torch::IntArrayRef({8, 1, 300, 400}));
  auto tubelets = tubeletize(gray.frames, 2, 20);
  EXPECT_EQ(tubelets.tokens.sizes(), torch::IntArrayRef({1, 4 * 15 * 20, 800}));
  // an Ogg/Theora container too
  auto ogv = read_video(kMecavideo + "/Effet_force_magnetique.ogv");
  EXPECT_EQ(ogv.frames.sizes(), torch::IntArrayRef({34, 3, 304, 400}));
  EXPECT_DOUBLE_EQ(ogv.fps, 25.0);
}

TEST(VideoMovingFashion, DeterministicForASeed) {
  const auto items = synthetic_items();
  MovingOptions options;
  options.seed = 7;
  auto a = generate_moving_clips(items, 10, options);
  auto b = generate_moving_clips(items, 10, options);
  EXPECT_EQ(a.frames.sizes(), torch::IntArrayRef({10, 8, 1, 32, 32}));
  EXPECT_TRUE(torch::equal(a.frames, b.frames));
  EXPECT_TRUE(torch::equal(a.direction, b.direction));
  EXPECT_TRUE(torch::equal(a.item, b.item));
  EXPECT_EQ(a.captions, b.captions);
  options.seed = 8;
  auto c = generate_moving_clips(items, 10, options);
  EXPECT_FALSE(torch::equal(a.frames, c.frames));
}

TEST(VideoMovingFashion, ItemStaysInsideAndMovesInTheLabelledDirection) {
  MovingOptions options;
  options.num_directions = 8;
  options.num_frames = 6;
  options.canvas = 40;
  options.seed = 3;
  const auto items = synthetic_items();
  auto clips = generate_moving_clips(items, 64, options);
  ASSERT_EQ(clips.frames.sizes(), torch::IntArrayRef({64, 6, 1, 40, 40}));
  EXPECT_EQ(std::get<0>(at::_unique(clips.direction)).numel(), 8);  // every direction drawn
  // mass per frame: the whole resized item is in every frame (each label is one image here)
  auto mass = clips.frames.sum({2, 3, 4});  // [N, T]
  auto resized = vision::resize_images(items.images.unsqueeze(1).to(torch::kFloat32) / 255, 14, 14);
  auto item_mass = resized.clamp(0, 1).sum({1, 2, 3});  // [3], labels 7, 1, 9
  auto label_to_image = torch::full({10}, 0, torch::kLong);
  label_to_image.index_put_({items.labels}, torch::arange(3));
  auto expected_mass = item_mass.index_select(0, label_to_image.index_select(0, clips.item));
  EXPECT_LT((mass - expected_mass.view({-1, 1})).abs().max().item<float>(), 1e-3);
  // centroid displacement from the first to the last frame, along and across the direction
  auto coordinate = torch::arange(40, torch::kFloat32);
  auto cx = (clips.frames.sum({2, 3}) * coordinate).sum(-1) / mass;  // [N, T]
  auto cy = (clips.frames.sum({2, 4}) * coordinate).sum(-1) / mass;
  const double diagonal = 1 / std::sqrt(2.0);
  const double step_x[8] = {1, -1, 0, 0, diagonal, -diagonal, diagonal, -diagonal};
  const double step_y[8] = {0, 0, 1, -1, diagonal, diagonal, -diagonal, -diagonal};
  const double steps = options.num_frames - 1, rounding = 1.0;  // whole-pixel offsets: +-0.5 each
  for (int64_t n = 0; n < 64; ++n) {
    const int64_t d = clips.direction[n].item<int64_t>();
    const double dx = (cx[n][-1] - cx[n][0]).item<double>();
    const double dy = (cy[n][-1] - cy[n][0]).item<double>();
    const double along = dx * step_x[d] + dy * step_y[d];
    const double across = -dx * step_y[d] + dy * step_x[d];
    EXPECT_GE(along, options.min_speed * steps - rounding) << n << " " << clips.captions[n];
    EXPECT_LE(along, options.max_speed * steps + rounding) << n << " " << clips.captions[n];
    EXPECT_LE(std::abs(across), rounding) << n << " " << clips.captions[n];
  }
}

TEST(VideoMovingFashion, Captions) {
  MovingOptions options;
  auto clips = generate_moving_clips(synthetic_items(), 40, options);
  ASSERT_EQ(clips.captions.size(), 40u);
  const auto& names = vision::FashionMnist::class_names();
  bool saw_boot = false;
  for (int64_t n = 0; n < 40; ++n) {
    const auto item = clips.item[n].item<int64_t>();
    const auto direction = clips.direction[n].item<int64_t>();
    EXPECT_TRUE(item == 7 || item == 1 || item == 9) << item;
    const std::string article = item == 9 ? "an " : "a ";
    EXPECT_EQ(clips.captions[n],
              article + names[item] + " moves " + MovingClips::direction_names(4)[direction]);
    saw_boot = saw_boot || clips.captions[n].rfind("an ankle boot moves ", 0) == 0;
  }
  EXPECT_TRUE(saw_boot);
  EXPECT_EQ(MovingClips::direction_names(4),
            (std::vector<std::string>{"right", "left", "down", "up"}));
  EXPECT_EQ(MovingClips::direction_names(8)[7], "up-left");
}

TEST(VideoMovingFashion, TurningClipsChangeDirectionAtTheTurnFrame) {
  MovingOptions options;
  options.turn = true;
  options.min_phase_frames = 2;
  options.seed = 5;
  const auto items = synthetic_items();
  auto clips = generate_moving_clips(items, 64, options);
  ASSERT_EQ(clips.direction2.sizes(), torch::IntArrayRef({64}));
  ASSERT_EQ(clips.turn_frame.sizes(), torch::IntArrayRef({64}));
  EXPECT_FALSE(clips.direction.eq(clips.direction2).any().item<bool>());
  EXPECT_EQ(clips.turn_frame.min().item<int64_t>(), 2);  // 8 frames: k in [2, 5], all drawn
  EXPECT_EQ(clips.turn_frame.max().item<int64_t>(), 5);
  // the centroid moves along the first direction up to frame k, along the second after it
  auto mass = clips.frames.sum({2, 3, 4});  // [N, T]
  auto coordinate = torch::arange(32, torch::kFloat32);
  auto cx = (clips.frames.sum({2, 3}) * coordinate).sum(-1) / mass;
  auto cy = (clips.frames.sum({2, 4}) * coordinate).sum(-1) / mass;
  const double step_x[4] = {1, -1, 0, 0}, step_y[4] = {0, 0, 1, -1};
  const auto& names = MovingClips::direction_names(4);
  for (int64_t n = 0; n < 64; ++n) {
    const int64_t d1 = clips.direction[n].item<int64_t>(), d2 = clips.direction2[n].item<int64_t>();
    const int64_t k = clips.turn_frame[n].item<int64_t>();
    auto along = [&](int64_t from, int64_t to, int64_t d) {
      return (cx[n][to] - cx[n][from]).item<double>() * step_x[d] +
             (cy[n][to] - cy[n][from]).item<double>() * step_y[d];
    };
    const double first = along(0, k, d1), second = along(k, 7, d2);
    EXPECT_GE(first, options.min_speed * k - 1.0) << n;
    EXPECT_LE(first, options.max_speed * k + 1.0) << n;
    EXPECT_GE(second, options.min_speed * (7 - k) - 1.0) << n;
    EXPECT_LE(second, options.max_speed * (7 - k) + 1.0) << n;
    EXPECT_TRUE(contains(clips.captions[n], " moves " + names[d1] + ", then " + names[d2]))
        << clips.captions[n];
  }
  // turn frames chosen by the caller: the same clips otherwise; out of range is an error
  options.turn_frames.assign(64, 3);
  auto chosen = generate_moving_clips(items, 64, options);
  EXPECT_TRUE(chosen.turn_frame.eq(3).all().item<bool>());
  EXPECT_TRUE(torch::equal(chosen.direction2, clips.direction2));
  options.turn_frames[5] = 6;
  auto message = test::error_of([&] { generate_moving_clips(items, 64, options); });
  EXPECT_TRUE(contains(message, "turn_frames[5] = 6 is outside [2, 5]")) << message;
  options.turn_frames.clear();
  // clips without a turn are the ones drawn before turning existed
  options.turn = false;
  auto straight = generate_moving_clips(items, 64, options);
  EXPECT_FALSE(straight.direction2.defined());
  EXPECT_TRUE(torch::equal(straight.direction, clips.direction));
  options.turn = true;
  options.min_phase_frames = 4;  // 8 frames = 7 steps < 2 x 4
  message = test::error_of([&] { generate_moving_clips(items, 1, options); });
  EXPECT_TRUE(contains(message, "8 frames with min_phase_frames = 4 do not fit")) << message;
}

TEST(VideoMovingFashion, OptionErrors) {
  const auto items = synthetic_items();
  MovingOptions options;
  options.item_size = 16;  // 2.5 px/frame x 7 steps = 17.5 px > 32 - 16
  auto message = test::error_of([&] { generate_moving_clips(items, 1, options); });
  EXPECT_TRUE(contains(message, "travels 17.5 px, but a canvas of 32 leaves only 16 px"))
      << message;
  options = MovingOptions{};
  options.num_directions = 5;
  message = test::error_of([&] { generate_moving_clips(items, 1, options); });
  EXPECT_TRUE(contains(message, "num_directions must be 4 or 8, got 5")) << message;
  options = MovingOptions{};
  options.min_speed = 3;
  message = test::error_of([&] { generate_moving_clips(items, 1, options); });
  EXPECT_TRUE(contains(message, "got min_speed=3, max_speed=2.5")) << message;
  message = test::error_of([] { MovingClips::direction_names(3); });
  EXPECT_TRUE(contains(message, "num_directions must be 4 or 8, got 3")) << message;
}

TEST(VideoMovingFashion, RealItemsWrittenAndReadBack) {
  auto source = vision::load_fashion_mnist(false, kFashionMnist);
  MovingOptions options;
  options.seed = 11;
  auto clips = generate_moving_clips(source, 3, options);
  const auto dir = temp_path("moving_fashion");
  fs::remove_all(dir);
  write_moving_clips(dir.string(), clips, 8);
  std::ifstream csv(dir / "captions.csv");
  std::stringstream text;
  text << csv.rdbuf();
  std::stringstream expected;
  expected << "file,direction,item,caption\n";
  for (int64_t n = 0; n < 3; ++n) {
    const std::string name = "clip_0000" + std::to_string(n) + ".avi";
    expected << name << "," << clips.direction[n].item<int64_t>() << ","
             << clips.item[n].item<int64_t>() << ",\"" << clips.captions[n] << "\"\n";
    auto clip = read_video((dir / name).string(), -1, true);
    ASSERT_EQ(clip.frames.sizes(), torch::IntArrayRef({8, 1, 32, 32}));
    EXPECT_NEAR(clip.fps, 8.0, 1e-6);
    EXPECT_LT(mean_abs_error(clip.frames, clips.frames[n]), kMjpgMeanError);
  }
  EXPECT_EQ(text.str(), expected.str());
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 4);  // no .tmp
}

}  // namespace
}  // namespace posenc::video
