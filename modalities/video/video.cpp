// Video files through OpenCV and tubelets; see video.h.
#include "video.h"

#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <opencv2/imgproc.hpp>
#include <opencv2/videoio.hpp>
#include <opencv2/videoio/registry.hpp>
#include <sstream>
#include <system_error>
#include <vector>

namespace posenc::video {

namespace {

// FFmpeg when OpenCV has it: CAP_ANY would also try GStreamer and the image-sequence reader,
// which print pages of warnings for a file none of them opens.
int video_backend() {
  return cv::videoio_registry::hasBackend(cv::CAP_FFMPEG) ? cv::CAP_FFMPEG : cv::CAP_ANY;
}

// One decoded frame (BGR, BGRA or gray, 8 or 16 bit) -> [H, W, C] uint8/uint16 tensor, RGB or
// gray. Copies out of the cv::Mat.
at::Tensor frame_to_tensor(const cv::Mat& frame, bool grayscale) {
  cv::Mat converted;
  const int channels = frame.channels();
  if (grayscale) {
    if (channels == 1) {
      converted = frame;
    } else {
      cv::cvtColor(frame, converted, channels == 4 ? cv::COLOR_BGRA2GRAY : cv::COLOR_BGR2GRAY);
    }
  } else if (channels == 1) {
    cv::cvtColor(frame, converted, cv::COLOR_GRAY2RGB);
  } else {
    cv::cvtColor(frame, converted, channels == 4 ? cv::COLOR_BGRA2RGB : cv::COLOR_BGR2RGB);
  }
  if (!converted.isContinuous()) converted = converted.clone();
  const auto dtype = converted.depth() == CV_16U ? torch::kUInt16 : torch::kUInt8;
  return torch::from_blob(converted.data, {converted.rows, converted.cols, converted.channels()},
                          dtype)
      .clone();
}

}  // namespace

Clip read_video(const std::string& path, int64_t max_frames, bool grayscale, bool allow_short) {
  TORCH_CHECK(max_frames != 0, "read_video: max_frames must be positive (or < 0 for all), got 0");
  std::error_code error;
  TORCH_CHECK(std::filesystem::is_regular_file(path, error), "read_video: cannot open '", path,
              "': no such file");
  cv::VideoCapture capture(path, video_backend());
  TORCH_CHECK(capture.isOpened(), "read_video: cannot open '", path,
              "': not a video OpenCV can decode (unreadable or corrupt container)");
  std::vector<at::Tensor> frames;  // each [H, W, C]
  cv::Mat frame;
  while ((max_frames < 0 || static_cast<int64_t>(frames.size()) < max_frames) &&
         capture.read(frame) && !frame.empty()) {
    frames.push_back(frame_to_tensor(frame, grayscale));
    TORCH_CHECK(frames.back().sizes() == frames.front().sizes(), "read_video: '", path,
                "' changes frame size at frame ", frames.size() - 1, ": ", frames.back().sizes(),
                ", expected ", frames.front().sizes());
  }
  TORCH_CHECK(!frames.empty(), "read_video: '", path,
              "' opened but no frame could be decoded (truncated or corrupt stream?)");
  // A truncated or damaged file decodes short without an error from OpenCV: compare with the
  // frame count the container declares (never a silently shorter clip).
  const double declared = capture.get(cv::CAP_PROP_FRAME_COUNT);
  const auto decoded = static_cast<int64_t>(frames.size());
  if ((max_frames < 0 || decoded < max_frames) && std::isfinite(declared) && declared > 0 &&
      static_cast<double>(decoded) < declared) {
    std::ostringstream why;
    why << "read_video: '" << path << "' decoded " << decoded << " of the "
        << static_cast<int64_t>(declared)
        << " frames its container declares (truncated or corrupt)";
    TORCH_CHECK(allow_short, why.str(), "; pass allow_short to take the decoded frames");
    TORCH_WARN(why.str(), "; taking the ", decoded, " decoded frames (allow_short)");
  }
  const double scale = frames.front().scalar_type() == torch::kUInt16 ? 65535.0 : 255.0;
  Clip clip;
  // [T, H, W, C] -> [T, C, H, W]
  clip.frames = torch::stack(frames).permute({0, 3, 1, 2}).to(torch::kFloat32).div_(scale);
  clip.frames = clip.frames.contiguous();
  const double fps = capture.get(cv::CAP_PROP_FPS);
  clip.fps = std::isfinite(fps) && fps > 0 ? fps : 0.0;
  return clip;
}

void write_video(const std::string& path, const at::Tensor& frames, double fps) {
  TORCH_CHECK(frames.dim() == 4, "write_video: frames must be [T, C, H, W], got ", frames.sizes());
  TORCH_CHECK(frames.size(0) > 0, "write_video: no frames to write (T = 0)");
  TORCH_CHECK(frames.size(1) == 1 || frames.size(1) == 3,
              "write_video: frames must have 1 or 3 channels, got ", frames.size(1));
  TORCH_CHECK(frames.is_floating_point(), "write_video: frames must be floating point in [0, 1], ",
              "got ", frames.scalar_type());
  TORCH_CHECK(std::isfinite(fps) && fps > 0, "write_video: fps must be positive, got ", fps);
  const int64_t height = frames.size(2), width = frames.size(3);
  // [T, C, H, W] float -> [T, H, W, 3] uint8, BGR as OpenCV writes it
  auto bgr = frames.detach().to(torch::kCPU, torch::kFloat32).clamp(0, 1).mul(255).round();
  bgr = bgr.expand({frames.size(0), 3, height, width}).flip({1}).permute({0, 2, 3, 1});
  bgr = bgr.to(torch::kUInt8).contiguous();
  const std::string temporary = path + ".tmp.avi";
  cv::VideoWriter writer(temporary, video_backend(), cv::VideoWriter::fourcc('M', 'J', 'P', 'G'),
                         fps, cv::Size(static_cast<int>(width), static_cast<int>(height)), true);
  TORCH_CHECK(writer.isOpened(), "write_video: cannot open '", path, "' for writing (via '",
              temporary, "'; does the directory exist?)");
  for (int64_t i = 0; i < bgr.size(0); ++i) {
    cv::Mat frame(static_cast<int>(height), static_cast<int>(width), CV_8UC3,
                  bgr[i].data_ptr<uint8_t>());
    writer.write(frame);
  }
  writer.release();
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    std::remove(temporary.c_str());
    TORCH_CHECK(false, "write_video: cannot rename '", temporary, "' to '", path, "'");
  }
}

Tubelets tubeletize(const at::Tensor& frames, int64_t t, int64_t p) {
  TORCH_CHECK(frames.dim() == 4 || frames.dim() == 5,
              "tubeletize: frames must be [B, T, C, H, W] or [T, C, H, W], got ", frames.sizes());
  TORCH_CHECK(t > 0 && p > 0, "tubeletize: tubelet sizes must be positive, got t=", t, ", p=", p);
  const auto clips = frames.dim() == 4 ? frames.unsqueeze(0) : frames;
  const int64_t b = clips.size(0), length = clips.size(1), c = clips.size(2);
  const int64_t h = clips.size(3), w = clips.size(4);
  TORCH_CHECK(length % t == 0, "tubeletize: ", length,
              " frames are not divisible by the tubelet length t=", t);
  TORCH_CHECK(h % p == 0 && w % p == 0, "tubeletize: frame size ", h, "x", w,
              " is not divisible by the tubelet side p=", p, " (resize or crop to a multiple)");
  const int64_t gt = length / t, gh = h / p, gw = w / p;
  // [B, gt, t, C, gh, p, gw, p] -> [B, gt, gh, gw, t, p, p, C] -> [B, gt*gh*gw, t*p*p*C]
  auto tokens = clips.reshape({b, gt, t, c, gh, p, gw, p})
                    .permute({0, 1, 4, 6, 2, 5, 7, 3})
                    .reshape({b, gt * gh * gw, t * p * p * c});
  return {tokens, Positions::volume(gt, gh, gw)};
}

}  // namespace posenc::video
