// Video folders (modalities/video/video_folder.h, video_classification's `videos` / `labels`
// keys): clips written here with OpenCV's VideoWriter (Motion-JPEG in AVI, FFmpeg backend) whose
// frame k is one flat grey level 10 k, so the sampled frame is known from its pixels. Checked:
// the frame on screen at start + j / fps is taken and its real time kept (10 fps sources sampled
// at 5 and 25 per second, an offset start, an end), a clip that ends sooner repeats its last
// frame and says so, gray and resizing; the labels file's format (header, quotes, BOM, CRLF,
// paths relative to the CSV or to the clip folder); each kind of bad input is one line naming
// the file and the CSV line, or skipped with a count (missing clip, corrupt, truncated, zero
// frames, unknown label format, start >= end, a number that is none, a field count, an empty
// class, a val label the training file lacks); the task's positions carry the seconds.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <torch/torch.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/videoio.hpp>

#include "posenc/train/task.h"
#include "video/video_folder.h"
#include "vision/image_folder.h"
#include "vision/images.h"

namespace posenc::video {
namespace {

namespace fs = std::filesystem;

fs::path fresh_folder(const std::string& name) {
  auto path =
      fs::temp_directory_path() / ("posenc_video_folder_" + std::to_string(getpid()) + "_" + name);
  fs::remove_all(path);
  fs::create_directories(path);
  return path;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// `count` frames of w x h at `fps`, frame k one flat grey level 10 k (MJPG keeps a flat level to
// within a step or two).
void write_clip(const fs::path& path, int count, double fps = 10, int w = 32, int h = 24) {
  fs::create_directories(path.parent_path());
  cv::VideoWriter writer(path.string(), cv::CAP_FFMPEG, cv::VideoWriter::fourcc('M', 'J', 'P', 'G'),
                         fps, cv::Size(w, h), true);
  ASSERT_TRUE(writer.isOpened()) << path;
  for (int k = 0; k < count; ++k)
    writer.write(cv::Mat(h, w, CV_8UC3, cv::Scalar::all(std::min(255, 10 * k))));
}

void write_text(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary) << text;
}

// The frame index k each sample shows (its grey level / 10, rounded).
std::vector<int64_t> frame_indices(const at::Tensor& frames) {
  auto level = frames.to(torch::kDouble).mean({1, 2, 3}).div(10).round().to(torch::kLong);
  return std::vector<int64_t>(level.data_ptr<int64_t>(), level.data_ptr<int64_t>() + level.numel());
}

std::vector<double> as_vector(const at::Tensor& t) {
  auto d = t.to(torch::kDouble).contiguous();
  return std::vector<double>(d.data_ptr<double>(), d.data_ptr<double>() + d.numel());
}

void expect_times(const at::Tensor& times, const std::vector<double>& expected) {
  auto got = as_vector(times);
  ASSERT_EQ(got.size(), expected.size());
  // POS_MSEC is pts * time_base: k / 10 s to within double rounding
  for (size_t j = 0; j < got.size(); ++j) EXPECT_NEAR(got[j], expected[j], 1e-9) << "sample " << j;
}

VideoFolderOptions options_of(int64_t frames, double fps, int64_t size = 8,
                              BadVideos bad = BadVideos::kStop) {
  VideoFolderOptions options;
  options.frames = frames;
  options.fps = fps;
  options.size = size;
  options.threads = 2;
  options.bad = bad;
  return options;
}

constexpr double kForever = std::numeric_limits<double>::infinity();

TEST(VideoFolder, SamplesTheFrameOnScreenAtEachTime) {
  auto root = fresh_folder("sampling");
  write_clip(root / "a.avi", 20);  // 10 fps: frame k at k / 10 s, 2.0 s in all
  // 5 per second from 0.3 s: 0.3, 0.5, 0.7, 0.9 -> frames 3, 5, 7, 9
  auto slow = sample_clip((root / "a.avi").string(), 0.3, kForever, options_of(4, 5));
  EXPECT_EQ(frame_indices(slow.frames), (std::vector<int64_t>{3, 5, 7, 9}));
  expect_times(slow.times, {0, 0.2, 0.4, 0.6});
  EXPECT_EQ(slow.padded, 0);
  // 25 per second from 0: 0, .04, .08, .12, .16, .20, .24, .28 -> 0 0 0 1 1 2 2 2 (repeats keep
  // the shown frame's own time)
  auto fast = sample_clip((root / "a.avi").string(), 0, kForever, options_of(8, 25));
  EXPECT_EQ(frame_indices(fast.frames), (std::vector<int64_t>{0, 0, 0, 1, 1, 2, 2, 2}));
  expect_times(fast.times, {0, 0, 0, 0.1, 0.1, 0.2, 0.2, 0.2});
  // a start between frames shows the frame before it; times count from that frame
  auto between = sample_clip((root / "a.avi").string(), 0.25, kForever, options_of(2, 10));
  EXPECT_EQ(frame_indices(between.frames), (std::vector<int64_t>{2, 3}));
  expect_times(between.times, {0, 0.1});
  // the last frame is on screen until 2.0 s: 1.95 takes it, not padding
  auto last = sample_clip((root / "a.avi").string(), 1.85, kForever, options_of(2, 10));
  EXPECT_EQ(frame_indices(last.frames), (std::vector<int64_t>{18, 19}));
  EXPECT_EQ(last.padded, 0);
}

TEST(VideoFolder, ShortClipRepeatsItsLastFrameAndCountsIt) {
  auto root = fresh_folder("short");
  write_clip(root / "a.avi", 20);
  // 1 per second from 0.5: 0.5, 1.5 inside; 2.5, 3.5 past the 2.0 s end -> padding
  auto clip = sample_clip((root / "a.avi").string(), 0.5, kForever, options_of(4, 1));
  EXPECT_EQ(frame_indices(clip.frames), (std::vector<int64_t>{5, 15, 15, 15}));
  expect_times(clip.times, {0, 1, 1, 1});
  EXPECT_EQ(clip.padded, 2);
  // an end closes the window the same way: 1.5 is at or after end = 1.0
  auto ended = sample_clip((root / "a.avi").string(), 0.5, 1.0, options_of(4, 1));
  EXPECT_EQ(frame_indices(ended.frames), (std::vector<int64_t>{5, 5, 5, 5}));
  EXPECT_EQ(ended.padded, 3);
  // a start past the end: one line naming the file
  EXPECT_EQ(
      error_of([&] { sample_clip((root / "a.avi").string(), 2.5, kForever, options_of(2, 1)); }),
      "video: '" + (root / "a.avi").string() + "': start 2.5 s is at or after the clip's end 2 s");
}

TEST(VideoFolder, GrayAndResize) {
  auto root = fresh_folder("gray");
  write_clip(root / "a.avi", 4, 10, 40, 30);
  auto options = options_of(2, 10, 10);
  auto rgb = sample_clip((root / "a.avi").string(), 0, kForever, options);
  EXPECT_EQ(rgb.frames.sizes(), (std::vector<int64_t>{2, 3, 10, 10}));
  options.channels = 1;
  auto gray = sample_clip((root / "a.avi").string(), 0, kForever, options);
  EXPECT_EQ(gray.frames.sizes(), (std::vector<int64_t>{2, 1, 10, 10}));
  EXPECT_EQ(frame_indices(gray.frames), (std::vector<int64_t>{0, 1}));
  // colour: OpenCV's BGR comes out as RGB (a red clip: channel 0 high, channel 2 low)
  {
    cv::VideoWriter writer((root / "red.avi").string(), cv::CAP_FFMPEG,
                           cv::VideoWriter::fourcc('M', 'J', 'P', 'G'), 10, cv::Size(16, 16), true);
    for (int k = 0; k < 2; ++k) writer.write(cv::Mat(16, 16, CV_8UC3, cv::Scalar(0, 0, 200)));
  }
  auto red = sample_clip((root / "red.avi").string(), 0, kForever, options_of(1, 10, 16));
  auto mean = red.frames.to(torch::kDouble).mean({0, 2, 3});  // per channel
  EXPECT_NEAR(mean[0].item<double>(), 200, 8);
  EXPECT_NEAR(mean[2].item<double>(), 0, 8);
}

TEST(VideoFolder, LabelsFileFormat) {
  auto root = fresh_folder("labels");
  write_clip(root / "clips" / "a, b.avi", 10);
  write_clip(root / "clips" / "c.avi", 10);
  // BOM, CRLF, a quoted path with a comma and a quoted label with a doubled quote, empty cells
  write_text(root / "clips" / "labels.csv",
             "\xEF\xBB\xBFpath,label,start,end\r\n\"a, b.avi\",\"say \"\"hi\"\"\",0.2,\r\n\r\n"
             "c.avi,wave,,0.5\r\n");
  auto labels = read_video_labels((root / "clips" / "labels.csv").string(), "", BadVideos::kStop);
  ASSERT_EQ(labels.rows.size(), 2u);
  EXPECT_EQ(labels.rows[0].path, (root / "clips" / "a, b.avi").string());
  EXPECT_EQ(labels.rows[0].label, "say \"hi\"");
  EXPECT_EQ(labels.rows[0].start, 0.2);
  EXPECT_EQ(labels.rows[0].end, kForever);
  EXPECT_EQ(labels.rows[0].line, 2);
  EXPECT_EQ(labels.rows[1].start, 0);
  EXPECT_EQ(labels.rows[1].end, 0.5);
  EXPECT_EQ(labels.rows[1].line, 4);
  EXPECT_EQ(labels.classes, (std::vector<std::string>{"say \"hi\"", "wave"}));
  // paths relative to a clip folder given apart from the CSV
  write_text(root / "elsewhere.csv", "path,label\nc.avi,wave\n");
  auto apart = read_video_labels((root / "elsewhere.csv").string(), (root / "clips").string(),
                                 BadVideos::kStop);
  EXPECT_EQ(apart.rows[0].path, (root / "clips" / "c.avi").string());
  // the whole folder into the cache
  auto folder = load_video_folder((root / "clips" / "labels.csv").string(), "", options_of(3, 10));
  EXPECT_EQ(folder.frames.sizes(), (std::vector<int64_t>{2, 3, 3, 8, 8}));
  EXPECT_EQ(frame_indices(folder.frames[0]), (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(frame_indices(folder.frames[1]), (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(as_vector(folder.labels), (std::vector<double>{0, 1}));
  EXPECT_EQ(folder.padded_clips, 0);
}

// Spaces after the commas (a hand-written file): unquoted fields are trimmed, so " right" and
// "right" are one class and " c.avi " is c.avi; a quoted field keeps its spaces.
TEST(VideoFolder, UnquotedLabelsAndPathsAreTrimmedQuotedOnesKept) {
  auto root = fresh_folder("trimmed");
  write_clip(root / "c.avi", 10);
  write_clip(root / " d.avi", 10);
  write_text(root / "labels.csv",
             "path, label\n c.avi , right \nc.avi,right\r\nc.avi,\tleft\n\" d.avi\",\" right\"\n"
             "  \n");
  auto labels = read_video_labels((root / "labels.csv").string(), "", BadVideos::kStop);
  ASSERT_EQ(labels.rows.size(), 4u);
  EXPECT_EQ(labels.rows[0].path, (root / "c.avi").string());
  EXPECT_EQ(labels.rows[0].label, "right");
  EXPECT_EQ(labels.rows[1].label, "right");
  EXPECT_EQ(labels.rows[2].label, "left");
  EXPECT_EQ(labels.rows[3].path, (root / " d.avi").string());
  EXPECT_EQ(labels.rows[3].label, " right");
  EXPECT_EQ(labels.classes, (std::vector<std::string>{" right", "left", "right"}));
  auto folder = load_video_folder((root / "labels.csv").string(), "", options_of(2, 10));
  EXPECT_EQ(as_vector(folder.labels), (std::vector<double>{2, 2, 1, 0}));
}

// Each kind of bad input: the one line it stops with (kStop), and kSkip keeping the rest.
TEST(VideoFolder, EachKindOfBadInputIsOneLineOrSkipped) {
  auto root = fresh_folder("bad");
  const auto dir = root.string();
  write_clip(root / "good_a.avi", 10);
  write_clip(root / "good_b.avi", 10);
  {  // a clip that opens and holds no frame
    cv::VideoWriter writer((root / "zero.avi").string(), cv::CAP_FFMPEG,
                           cv::VideoWriter::fourcc('M', 'J', 'P', 'G'), 10, cv::Size(32, 24), true);
  }
  write_text(root / "noise.avi", std::string(4000, '\x5a'));  // not a video
  // truncated: 100 frames of noise (large frames), cut at 60%
  {
    cv::VideoWriter writer((root / "long.avi").string(), cv::CAP_FFMPEG,
                           cv::VideoWriter::fourcc('M', 'J', 'P', 'G'), 10, cv::Size(64, 48), true);
    cv::RNG rng(1);
    for (int k = 0; k < 100; ++k) {
      cv::Mat frame(48, 64, CV_8UC3);
      rng.fill(frame, cv::RNG::UNIFORM, 0, 255);
      writer.write(frame);
    }
  }
  std::ifstream in(root / "long.avi", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  write_text(root / "cut.avi", bytes.substr(0, bytes.size() * 6 / 10));
  const auto csv = (root / "labels.csv").string();
  struct Case {
    std::string row, expected;
  };
  const std::vector<Case> cases = {
      {"nope.avi,b,,",
       "labels: '" + csv + "' line 3: the clip '" + dir + "/nope.avi' does not exist"},
      {"good_b.avi,b,2,1", "labels: '" + csv + "' line 3: start 2 s is not before end 1 s"},
      {"good_b.avi,b,1,1", "labels: '" + csv + "' line 3: start 1 s is not before end 1 s"},
      {"good_b.avi,b,-1,", "labels: '" + csv + "' line 3: start -1 s is negative"},
      {"good_b.avi,b,soon,",
       "labels: '" + csv + "' line 3: start 'soon' is not a finite number of seconds"},
      {"good_b.avi,b,,inf",
       "labels: '" + csv + "' line 3: end 'inf' is not a finite number of seconds"},
      {"good_b.avi,b", "labels: '" + csv + "' line 3: 2 fields, the header has 4"},
      {",b,,", "labels: '" + csv + "' line 3: the path is empty"},
      {"good_b.avi,,,", "labels: '" + csv + "' line 3: the label is empty"},
      {".,b,,", "labels: '" + csv + "' line 3: the clip '" + dir + "/.' is not a regular file"},
      {"zero.avi,b,,", "video: '" + dir +
                           "/zero.avi' has zero frames (it opens, but no frame decodes) (" + csv +
                           " line 3)"},
      {"noise.avi,b,,",
       "video: '" + dir +
           "/noise.avi' cannot be opened (not a video OpenCV reads, or a corrupt container) (" +
           csv + " line 3)"},
      {"cut.avi,b,8,", "video: '" + dir +
                           "/cut.avi' decoded 57 of the 100 frames its container declares "
                           "(truncated or corrupt) (" +
                           csv + " line 3)"},
  };
  for (const auto& c : cases) {
    write_text(csv, "path,label,start,end\ngood_a.avi,a,,\n" + c.row + "\ngood_b.avi,b,,\n");
    const auto stop = error_of([&] { load_video_folder(csv, "", options_of(2, 10)); });
    EXPECT_EQ(stop.find('\n'), std::string::npos) << stop;
    const bool from_labels = c.expected.rfind("labels:", 0) == 0;
    EXPECT_EQ(stop, c.expected + (from_labels ? " (task.bad_videos: skip leaves bad rows out)"
                                              : " (task.bad_videos: skip leaves bad clips out)"))
        << c.row;
    auto skip = load_video_folder(csv, "", options_of(2, 10, 8, BadVideos::kSkip));
    EXPECT_EQ(skip.skipped, 1) << c.row;
    EXPECT_EQ(skip.first_skipped.rfind(c.expected, 0), 0u) << skip.first_skipped;
    EXPECT_EQ(skip.frames.size(0), 2) << c.row;
    EXPECT_EQ(skip.classes, (std::vector<std::string>{"a", "b"}));
    EXPECT_EQ(as_vector(skip.labels), (std::vector<double>{0, 1}));
  }
  // the truncated clip is fine where the window ends before the cut
  write_text(csv, "path,label,start,end\ncut.avi,a,0,1\ngood_b.avi,b,,\n");
  EXPECT_EQ(load_video_folder(csv, "", options_of(2, 10)).frames.size(0), 2);
  // unknown label format: the file itself, in both modes
  write_text(csv, "file,class\ngood_a.avi,a\n");
  const std::string format = "labels: '" + csv +
                             "' line 1: the header 'file,class' is not path,label or "
                             "path,label,start,end (unknown label format)";
  EXPECT_EQ(error_of([&] { load_video_folder(csv, "", options_of(2, 10)); }), format);
  EXPECT_EQ(error_of([&] { load_video_folder(csv, "", options_of(2, 10, 8, BadVideos::kSkip)); }),
            format);
  write_text(csv, "");
  EXPECT_NE(error_of([&] { load_video_folder(csv, "", options_of(2, 10)); }).find("is empty"),
            std::string::npos);
  write_text(csv, "path,label\n\"good_a.avi,a\n");
  EXPECT_EQ(
      error_of([&] { load_video_folder(csv, "", options_of(2, 10)); }),
      "labels: '" + csv + "' line 2: a quoted field is not closed before the end of the file");
  const auto missing =
      error_of([&] { load_video_folder(dir + "/none.csv", "", options_of(2, 10)); });
  EXPECT_NE(missing.find("'" + dir + "/none.csv'"), std::string::npos) << missing;
  EXPECT_EQ(missing.find('\n'), std::string::npos) << missing;
}

TEST(VideoFolder, FifoAndUnreadableClipsNameTheFile) {
  auto root = fresh_folder("fifo");
  write_clip(root / "a.avi", 10);
  write_clip(root / "b.avi", 10);
  ASSERT_EQ(mkfifo((root / "pipe.avi").c_str(), 0600), 0);
  const auto csv = (root / "labels.csv").string();
  write_text(csv, "path,label\na.avi,a\npipe.avi,b\nb.avi,b\n");
  EXPECT_EQ(error_of([&] { load_video_folder(csv, "", options_of(2, 10)); }),
            "labels: '" + csv + "' line 3: the clip '" + (root / "pipe.avi").string() +
                "' is not a regular file (task.bad_videos: skip leaves bad rows out)");
  // root reads a mode-000 file anyway (CAP_DAC_OVERRIDE); as any other user it is one line
  if (geteuid() == 0) GTEST_SKIP() << "running as root: permissions do not stop reads";
  ASSERT_EQ(chmod((root / "b.avi").c_str(), 0), 0);
  write_text(csv, "path,label\na.avi,a\nb.avi,b\na.avi,b\n");
  const auto locked = error_of([&] { load_video_folder(csv, "", options_of(2, 10)); });
  EXPECT_NE(locked.find((root / "b.avi").string()), std::string::npos) << locked;
  EXPECT_NE(locked.find(csv + " line 3"), std::string::npos) << locked;
  EXPECT_EQ(load_video_folder(csv, "", options_of(2, 10, 8, BadVideos::kSkip)).skipped, 1);
}

TEST(VideoFolder, EmptyClassIsAnErrorInBothModes) {
  auto root = fresh_folder("empty_class");
  write_clip(root / "a.avi", 10);
  write_text(root / "noise.avi", "not a video");
  const auto csv = (root / "labels.csv").string();
  // every clip of class b is bad: skipping them leaves b empty
  write_text(csv, "path,label\na.avi,a\nnoise.avi,b\nmissing.avi,b\n");
  const auto skip =
      error_of([&] { load_video_folder(csv, "", options_of(2, 10, 8, BadVideos::kSkip)); });
  EXPECT_EQ(skip.rfind("video folder: the class 'b' of '" + csv +
                           "' has no clip left (2 bad rows "
                           "skipped, first: labels: '" +
                           csv + "' line 4: the clip '",
                       0),
            0u)
      << skip;
  // a val file without one of the training classes
  write_text(csv, "path,label\na.avi,a\n");
  EXPECT_EQ(error_of([&] {
              load_video_folder(csv, "", options_of(2, 10), {"a", "b"});
            }),
            "video folder: the class 'b' of '" + csv + "' has no clip (every class needs clips)");
  // a val label the training file does not have
  EXPECT_EQ(error_of([&] {
              load_video_folder(csv, "", options_of(2, 10), {"b", "c"});
            }),
            "labels: '" + csv +
                "' line 2: the label 'a' is not one of the training file's classes (2, first 'b')");
}

TEST(VideoFolder, CacheLimitIsNamed) {
  auto root = fresh_folder("cache");
  write_clip(root / "a.avi", 4);
  write_text(root / "labels.csv", "path,label\na.avi,a\na.avi,b\n");
  auto options = options_of(8, 10, 512);
  options.max_cache_bytes = int64_t{1} << 20;
  EXPECT_EQ(error_of([&] { load_video_folder((root / "labels.csv").string(), "", options); }),
            "video folder: '" + (root / "labels.csv").string() +
                "' lists 2 clips; at 8 frames of 512 x 512 x 3 they need 12 MiB of cache, over "
                "task.cache_mb = 1 (raise it, or lower task.frames or task.image_size)");
}

// `count` frames at `fps`, frame k one flat grey level `step` k.
void write_levels(const fs::path& path, int count, double fps, int step) {
  fs::create_directories(path.parent_path());
  cv::VideoWriter writer(path.string(), cv::CAP_FFMPEG, cv::VideoWriter::fourcc('M', 'J', 'P', 'G'),
                         fps, cv::Size(16, 16), true);
  ASSERT_TRUE(writer.isOpened()) << path;
  for (int k = 0; k < count; ++k)
    writer.write(cv::Mat(16, 16, CV_8UC3, cv::Scalar::all(std::min(255, step * k))));
}

// The task: the time axis is time_scale x the sampled frames' own seconds. Three clips show the
// same grey levels 0, 20, 40, 60: x at 10 fps sampled at 5 per second (0, .2, .4, .6 s), z at 5
// fps sampled at 5 (the same times), w at 2.5 fps sampled at 2.5 (0, .4, .8, 1.2 s).
TEST(VideoFolder, TaskPositionsAreSecondsFromTheFrames) {
  auto root = fresh_folder("task");
  write_levels(root / "clips" / "x.avi", 20, 10, 10);
  write_levels(root / "clips" / "z.avi", 10, 5, 20);
  write_levels(root / "clips" / "w.avi", 10, 2.5, 20);
  write_text(root / "clips" / "labels.csv",
             "path,label\nx.avi,a\nz.avi,b\nx.avi,a\nz.avi,b\nx.avi,a\nz.avi,b\n");
  nlohmann::json config = nlohmann::json::parse(R"({
    "name": "clips", "seed": 0,
    "task": {"type": "video_classification", "frames": 4, "fps": 5, "image_size": 8,
             "patch": 4, "tubelet_frames": 2, "val_fraction": 0.34, "decode_threads": 2},
    "model": {"dim": 24, "num_heads": 2, "num_layers": 1, "mlp_ratio": 2},
    "encoder": {"type": "axial_sincos", "num_axes": 3}
  })");
  config["task"]["videos"] = (root / "clips").string();
  auto task = train::make_task(config);
  EXPECT_EQ(task->class_names(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(task->train_size(), 4);  // round(0.34 * 3) = 1 clip of each class held out
  const auto clip = [&](const std::string& name) { return (root / "clips" / name).string(); };
  torch::NoGradGuard no_grad;
  auto same_weights = [&](const std::unique_ptr<train::Task>& other) {
    auto from = task->model()->named_parameters();
    for (auto& p : other->model()->named_parameters()) p.value().copy_(from[p.key()]);
    other->model()->eval();
    return other->classify_files({clip("w.avi")});
  };
  task->model()->eval();
  auto x = task->classify_files({clip("x.avi"), clip("z.avi")});
  EXPECT_TRUE(torch::equal(x[0], x[1]));  // the same frames at the same real times
  auto slower = config;
  slower["task"]["fps"] = 2.5;
  auto w = same_weights(train::make_task(slower));
  EXPECT_FALSE(torch::allclose(w[0], x[0]));  // the same frames twice as far apart in time
  slower["task"]["time_scale"] = 0.5;         // positions per second: 0, .2, .4, .6 again
  auto w_scaled = same_weights(train::make_task(slower));
  EXPECT_TRUE(torch::allclose(w_scaled[0], x[0], 1e-6, 1e-6));
  // clips with other times in one batch: per-clip positions, each as it is alone
  auto mixed = task->classify_files({clip("x.avi"), clip("w.avi")});
  auto w_alone = task->classify_files({clip("w.avi")});
  EXPECT_TRUE(torch::allclose(mixed[1], w_alone[0], 1e-6, 1e-6));
  EXPECT_TRUE(torch::allclose(mixed[0], x[0], 1e-6, 1e-6));
  // bad keys are one line
  auto bad = config;
  bad["task"]["fps"] = 0;
  EXPECT_EQ(error_of([&] { train::make_task(bad); }),
            "task: fps must be in (0, 1000] samples per second, got 0");
  bad = config;
  bad["task"]["frames"] = 3;
  EXPECT_EQ(error_of([&] { train::make_task(bad); }),
            "task: frames = 3 must be a multiple of tubelet_frames >= 1, got 2");
  bad = config;
  bad["task"]["bad_videos"] = "ignore";
  EXPECT_EQ(error_of([&] { train::make_task(bad); }),
            "task: bad_videos must be 'stop' or 'skip', got 'ignore'");
}

// A gray frame is copied out of OpenCV's buffer: with C = 1, [S, S, 1] -> [1, S, S] is already
// contiguous, so .contiguous() kept a view of the freed cv::Mat and frame 0 of a black clip read
// back as 4.87 on average once the allocator reused the memory (1 in 1-300 calls here).
TEST(VideoFolder, GrayFramesAreCopiedOutOfOpenCV) {
  auto root = fresh_folder("gray_copy");
  write_clip(root / "a.avi", 4, 10, 40, 30);
  auto options = options_of(2, 10, 10);
  for (int rep = 0; rep < 100; ++rep) {
    options.channels = 3;
    auto rgb = sample_clip((root / "a.avi").string(), 0, kForever, options);
    options.channels = 1;
    auto gray = sample_clip((root / "a.avi").string(), 0, kForever, options);
    ASSERT_EQ(frame_indices(rgb.frames), (std::vector<int64_t>{0, 1})) << "call " << rep;
    ASSERT_EQ(frame_indices(gray.frames), (std::vector<int64_t>{0, 1})) << "call " << rep;
    ASSERT_EQ(gray.frames[0].max().item<int64_t>(), 0) << "call " << rep;
  }
}

// The same for vision::decode_image_file (eval --image keeps every decoded image until it stacks
// them; the folder's threads copy each into the cache while others allocate) and
// vision::load_image: a gray image must own its pixels (they read back as the last image's, 220,
// before the fix).
TEST(VideoFolder, DecodedGrayImagesOwnTheirPixels) {
  auto root = fresh_folder("gray_images");
  std::vector<at::Tensor> decoded, loaded;
  for (int level = 0; level < 12; ++level) {
    const auto path = (root / (std::to_string(level) + ".png")).string();
    ASSERT_TRUE(cv::imwrite(path, cv::Mat(20, 20, CV_8UC1, cv::Scalar(level * 20))));
    decoded.push_back(vision::decode_image_file(path, 1, 20));
    loaded.push_back(vision::load_image(path));  // float [1, 20, 20] in [0, 1]
  }
  for (int level = 0; level < 12; ++level) {
    EXPECT_EQ(decoded[level].min().item<int64_t>(), level * 20) << level;
    EXPECT_EQ(decoded[level].max().item<int64_t>(), level * 20) << level;
    EXPECT_EQ(loaded[level].sizes(), (std::vector<int64_t>{1, 20, 20}));
    EXPECT_EQ(loaded[level].min().item<float>(), loaded[level].max().item<float>()) << level;
    EXPECT_NEAR(loaded[level].max().item<float>() * 255, level * 20, 1e-3) << level;
  }
}

}  // namespace
}  // namespace posenc::video
