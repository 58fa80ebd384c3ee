// A folder of the user's clips with a CSV of labels, decoded into the cache a video classifier
// trains from (the video_classification task's `videos` / `labels` keys).
//
// Labels file (RFC 4180 CSV: fields may be double-quoted, "" inside quotes is one "; a UTF-8 BOM
// and CR line ends are taken; blank lines are passed over; a field not in quotes loses its
// surrounding whitespace, "a.avi, right" is the class "right", a quoted field is kept as written).
// The header row is exactly
//   path,label            or            path,label,start,end
// (anything else is an unknown label format: the file is refused). path: the clip, relative to
// the clip folder (task.videos; the CSV's own folder when none is given) unless absolute; label:
// the class name, any non-empty text; start, end: the part of the clip to sample, in seconds from
// the clip's first frame (an empty cell: 0 and the clip's end). Classes = the distinct labels of
// the training file, sorted (bytewise, as Python's sorted()); label = the index in that list.
//
// Sampling (per clip, OpenCV's cv::VideoCapture through FFmpeg, any container and codec it reads):
//   frame times: CAP_PROP_POS_MSEC of each decoded frame (FFmpeg: the frame's presentation
//     timestamp from the stream's start, so variable frame rates keep their real times); they
//     must increase strictly, else the clip is refused (a container without timestamps);
//   sample times tau_j = start + j / fps, j = 0 .. frames - 1 (fps = task.fps);
//   frame j = the frame on screen at tau_j: the last decoded frame with time <= tau_j + 1 us
//     (the first frame when tau_j comes before it);
//   the clip's end = min(end, last frame's time + 1 / the container's frame rate) (the last gap
//     when the container declares none); a tau_j at or after it is padding: the last sampled
//     frame repeated, with its time (the content stood still), counted in `padded`;
//   times[j] = time of frame j - time of frame 0 (seconds; 0 for the first sample).
// Frames are decoded from the clip's start (exact, no keyframe seek) up to the last one needed.
// Each sampled frame: BGR -> RGB (or gray -> 3 equal channels; channels = 1: luma 0.299 R +
// 0.587 G + 0.114 B, OpenCV's cvtColor), resized to size x size as vision::decode_image_file
// does (stretched; INTER_AREA when both sides shrink, bilinear otherwise; a frame already that
// size is kept bit for bit).
// Every clip is decoded once, before the first step, by `threads` threads (one VideoCapture each);
// the cache holds uint8 [N, frames, C, size, size] (N frames C size^2 bytes) + float64 times
// [N, frames], refused above max_cache_bytes with the bytes it would need.
//
// Bad input, each one line naming the file and the CSV line: a row with another number of fields
// than the header, an empty path or label, a start or end that is not a finite number, start < 0,
// start >= end, a clip that is missing or not a regular file, a clip OpenCV cannot open
// (unreadable, corrupt container, not a video), a clip with zero frames, frame times that do not
// increase, a start at or after the clip's end, a frame size that changes mid-clip, fewer frames
// decoded than the container declares before the samples were covered (truncated); a val file's
// label the training file does not have. BadVideos::kStop (the default) stops at the first in
// file order; kSkip leaves those rows out and counts them. A class with no clip left is an error
// in both modes. Damage inside one frame's compressed data that the codec conceals (a JPEG frame
// with garbage in it) decodes as the codec draws it and is not detected, as for images.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace posenc::video {

/// What to do with a bad row or clip (above).
enum class BadVideos { kStop, kSkip };
/// "stop" / "skip"; anything else is an error naming the value.
BadVideos bad_videos_from_string(const std::string& name);

/// The largest labels file read (256 MiB) and the most rows in it.
inline constexpr int64_t kMaxLabelsFileBytes = int64_t{256} << 20;
inline constexpr int64_t kMaxLabelRows = 10000000;
/// The largest class count.
inline constexpr int64_t kMaxVideoClasses = 100000;

/// One row of a labels file.
struct VideoRow {
  std::string path;   ///< resolved (absolute, or relative to the working folder)
  std::string label;  ///< the class name
  double start = 0;   ///< seconds
  double end = std::numeric_limits<double>::infinity();  ///< seconds (infinity: the clip's end)
  int64_t line = 0;                                      ///< 1-based line in the CSV
};

struct VideoLabels {
  std::vector<VideoRow> rows;        ///< good rows, in file order
  std::vector<std::string> errors;   ///< one line per bad row (kSkip), in file order
  std::vector<std::string> classes;  ///< the distinct labels of `rows`, sorted
};

/// Reads a labels file (format above). `clip_folder`: what relative paths resolve against ("" for
/// the CSV's own folder). With kStop a bad row is an error; with kSkip it is left out and its
/// message kept in `errors`. Missing clip files are found here (a regular file is required).
VideoLabels read_video_labels(const std::string& csv_path, const std::string& clip_folder,
                              BadVideos bad);

struct VideoFolderOptions {
  int64_t frames = 8;    ///< samples per clip
  double fps = 8;        ///< samples per second
  int64_t size = 112;    ///< side of the square the frames are resized to
  int64_t channels = 3;  ///< 1 (gray) or 3 (RGB)
  BadVideos bad = BadVideos::kStop;
  int64_t threads = 0;                         ///< decoding threads (0: the machine's cores)
  int64_t max_cache_bytes = int64_t{4} << 30;  ///< the cache's limit (task.cache_mb)
};

/// One clip sampled as above.
struct SampledClip {
  at::Tensor frames;   ///< [frames, C, size, size] uint8
  at::Tensor times;    ///< [frames] float64 seconds since the first sample
  int64_t padded = 0;  ///< samples at or after the clip's end (the last frame repeated)
};

/// Samples [start, end) of one clip file; errors are one line naming the file.
SampledClip sample_clip(const std::string& path, double start, double end,
                        const VideoFolderOptions& options);

struct VideoFolder {
  at::Tensor frames;                 ///< [N, frames, C, size, size] uint8
  at::Tensor times;                  ///< [N, frames] float64 seconds since each clip's first sample
  at::Tensor labels;                 ///< [N] int64, indices into classes
  std::vector<std::string> classes;  ///< the class names, sorted
  std::vector<VideoRow> rows;        ///< the N rows, in the clips' order
  int64_t skipped = 0;               ///< bad rows and clips left out (kSkip)
  std::string first_skipped;         ///< the first of them and why ("" when none)
  int64_t padded_clips = 0;          ///< clips shorter than frames / fps (padded)
};

/// Every clip of `labels` (read from `csv_path`) sampled into the cache. `classes`: the classes
/// the labels index (the training file's, for a val file: each of its labels must be one of
/// them), or empty for labels.classes.
VideoFolder decode_video_labels(const VideoLabels& labels, const std::string& csv_path,
                                const VideoFolderOptions& options,
                                const std::vector<std::string>& classes = {});

/// read_video_labels + decode_video_labels.
VideoFolder load_video_folder(const std::string& csv_path, const std::string& clip_folder,
                              const VideoFolderOptions& options,
                              const std::vector<std::string>& classes = {});

}  // namespace posenc::video
