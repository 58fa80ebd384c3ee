// Labels files, clip sampling and parallel decoding into the uint8 cache; see video_folder.h.
#include "video_folder.h"

#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <opencv2/imgproc.hpp>
#include <opencv2/videoio.hpp>
#include <opencv2/videoio/registry.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "posenc/io/input_file.h"
#include "vision/image_folder.h"

namespace posenc::video {

namespace fs = std::filesystem;

namespace {

// A frame time within 1 us of a sample time counts as at it (POS_MSEC is pts * time_base in
// double, j / fps another rounding of the same instant).
constexpr double kTimeSlack = 1e-6;

// One line of an exception (c10::Error without its backtrace).
std::string one_line(const std::exception& e) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e))
    return c10_error->what_without_backtrace();
  return e.what();
}

// FFmpeg when OpenCV has it (as read_video): CAP_ANY would also try GStreamer and the
// image-sequence reader on a file none of them opens.
int video_backend() {
  return cv::videoio_registry::hasBackend(cv::CAP_FFMPEG) ? cv::CAP_FFMPEG : cv::CAP_ANY;
}

std::string trim(const std::string& text) {
  size_t begin = 0, end = text.size();
  while (begin < end && std::isspace(static_cast<unsigned char>(text[begin]))) ++begin;
  while (end > begin && std::isspace(static_cast<unsigned char>(text[end - 1]))) --end;
  return text.substr(begin, end - begin);
}

struct CsvRecord {
  std::vector<std::string> fields;
  int64_t line = 0;  // where the record starts, 1-based
};

// RFC 4180 records: fields split at commas outside double quotes, "" inside quotes is one ",
// records end at a newline outside quotes (a CR before it dropped); blank lines are passed over.
// A field not in quotes loses its surrounding whitespace ("c.avi, right" is "right", as the
// time-series CSV reader reads it), a quoted one is kept as written (" right" in quotes).
std::vector<CsvRecord> parse_csv(const std::string& text, const std::string& path) {
  std::vector<CsvRecord> records;
  size_t i = 0;
  if (text.compare(0, 3, "\xEF\xBB\xBF") == 0) i = 3;  // UTF-8 BOM
  int64_t line = 1;
  CsvRecord record{{}, line};
  std::string field;
  bool quoted = false, field_was_quoted = false;
  auto end_field = [&] { record.fields.push_back(field_was_quoted ? field : trim(field)); };
  auto end_record = [&] {
    end_field();
    const bool blank = record.fields.size() == 1 && record.fields[0].empty() && !field_was_quoted;
    if (!blank) records.push_back(record);
    TORCH_CHECK(static_cast<int64_t>(records.size()) <= kMaxLabelRows + 1, "labels: '", path,
                "' has more than ", kMaxLabelRows, " rows (kMaxLabelRows)");
    record = CsvRecord{{}, line};
    field.clear();
    field_was_quoted = false;
  };
  for (; i < text.size(); ++i) {
    const char c = text[i];
    if (quoted) {
      if (c == '"' && i + 1 < text.size() && text[i + 1] == '"') {
        field += '"';
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        if (c == '\n') ++line;
        field += c;
      }
    } else if (c == '"' && field.empty() && !field_was_quoted) {
      quoted = field_was_quoted = true;
    } else if (c == ',') {
      end_field();
      field.clear();
      field_was_quoted = false;
    } else if (c == '\n') {
      if (!field.empty() && field.back() == '\r') field.pop_back();
      ++line;
      end_record();
    } else {
      field += c;
    }
  }
  TORCH_CHECK(!quoted, "labels: '", path, "' line ", record.line,
              ": a quoted field is not closed before the end of the file");
  if (!field.empty() && field.back() == '\r') field.pop_back();
  if (!record.fields.empty() || !field.empty() || field_was_quoted) end_record();
  return records;
}

// A start or end cell: empty -> fallback; else a finite number (surrounding spaces allowed).
double seconds_cell(const std::string& cell, double fallback, const std::string& column,
                    const std::string& where) {
  const auto text = trim(cell);
  if (text.empty()) return fallback;
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  TORCH_CHECK(end == text.c_str() + text.size() && std::isfinite(value), where, ": ", column, " '",
              cell, "' is not a finite number of seconds");
  return value;
}

// A decoded frame -> uint8 [C, size, size], converted and resized as an image file is.
at::Tensor frame_to_cache(const cv::Mat& frame, int64_t channels, int64_t size,
                          const std::string& path) {
  return vision::pixels_to_chw(frame, channels, size, "video: '" + path + "'");
}

void check_options(const VideoFolderOptions& options) {
  TORCH_CHECK(options.channels == 1 || options.channels == 3,
              "task: channels must be 1 (gray) or 3 (RGB), got ", options.channels);
  TORCH_CHECK(options.size >= 1 && options.size <= 4096,
              "task: image_size must be in [1, 4096], got ", options.size);
  TORCH_CHECK(options.frames >= 1 && options.frames <= 1000,
              "task: frames must be in [1, 1000], got ", options.frames);
  TORCH_CHECK(std::isfinite(options.fps) && options.fps > 0 && options.fps <= 1000,
              "task: fps must be in (0, 1000] samples per second, got ", options.fps);
}

}  // namespace

BadVideos bad_videos_from_string(const std::string& name) {
  if (name == "stop") return BadVideos::kStop;
  if (name == "skip") return BadVideos::kSkip;
  TORCH_CHECK(false, "task: bad_videos must be 'stop' or 'skip', got '", name, "'");
}

VideoLabels read_video_labels(const std::string& csv_path, const std::string& clip_folder,
                              BadVideos bad) {
  const auto text =
      read_regular_file(csv_path, "labels file", kMaxLabelsFileBytes, "kMaxLabelsFileBytes");
  const auto records = parse_csv(text, csv_path);
  TORCH_CHECK(!records.empty(), "labels: '", csv_path,
              "' is empty (expected the header path,label or path,label,start,end, then a row "
              "per clip)");
  std::vector<std::string> header;
  for (const auto& name : records[0].fields) header.push_back(trim(name));
  const bool with_times = header == std::vector<std::string>{"path", "label", "start", "end"};
  const bool plain = header == std::vector<std::string>{"path", "label"};
  std::string joined;
  for (const auto& name : records[0].fields) joined += (joined.empty() ? "" : ",") + name;
  TORCH_CHECK(with_times || plain, "labels: '", csv_path, "' line ", records[0].line,
              ": the header '", joined,
              "' is not path,label or path,label,start,end (unknown label format)");
  TORCH_CHECK(records.size() > 1, "labels: '", csv_path, "' has a header but no rows");
  const fs::path base =
      clip_folder.empty() ? fs::path(csv_path).parent_path() : fs::path(clip_folder);
  VideoLabels labels;
  std::set<std::string> classes;
  for (size_t r = 1; r < records.size(); ++r) {
    const auto& record = records[r];
    std::ostringstream where_stream;
    where_stream << "labels: '" << csv_path << "' line " << record.line;
    const auto where = where_stream.str();
    try {
      TORCH_CHECK(record.fields.size() == header.size(), where, ": ", record.fields.size(),
                  " fields, the header has ", header.size());
      VideoRow row;
      row.line = record.line;
      const auto& path = record.fields[0];
      row.label = record.fields[1];
      TORCH_CHECK(!path.empty(), where, ": the path is empty");
      TORCH_CHECK(!row.label.empty(), where, ": the label is empty");
      // a class counts even when its rows are bad: all of them skipped is an empty class
      classes.insert(row.label);
      TORCH_CHECK(static_cast<int64_t>(classes.size()) <= kMaxVideoClasses, where, ": more than ",
                  kMaxVideoClasses, " classes (kMaxVideoClasses)");
      row.path = fs::path(path).is_absolute() ? path : (base / path).string();
      if (with_times) {
        row.start = seconds_cell(record.fields[2], 0.0, "start", where);
        row.end = seconds_cell(record.fields[3], row.end, "end", where);
        TORCH_CHECK(row.start >= 0, where, ": start ", row.start, " s is negative");
        TORCH_CHECK(row.start < row.end, where, ": start ", row.start, " s is not before end ",
                    row.end, " s");
      }
      std::error_code error;
      const auto status = fs::status(row.path, error);
      TORCH_CHECK(fs::exists(status), where, ": the clip '", row.path, "' does not exist");
      TORCH_CHECK(fs::is_regular_file(status), where, ": the clip '", row.path,
                  "' is not a regular file");
      labels.rows.push_back(std::move(row));
    } catch (const c10::Error& e) {
      if (bad == BadVideos::kStop)
        TORCH_CHECK(false, e.what_without_backtrace(),
                    " (task.bad_videos: skip leaves bad rows out)");
      labels.errors.push_back(e.what_without_backtrace());
    }
  }
  labels.classes.assign(classes.begin(), classes.end());  // std::set: sorted bytewise
  return labels;
}

SampledClip sample_clip(const std::string& path, double start, double end,
                        const VideoFolderOptions& options) {
  check_options(options);
  TORCH_CHECK(std::isfinite(start) && start >= 0 && start < end, "video: '", path, "': start ",
              start, " s must be >= 0 and before end ", end, " s");
  require_regular_file(path, "video");
  cv::VideoCapture capture;
  try {
    capture.open(path, video_backend());
  } catch (const cv::Exception& e) {
    TORCH_CHECK(false, "video: '", path, "' cannot be opened (", e.err, ")");
  }
  TORCH_CHECK(capture.isOpened(), "video: '", path,
              "' cannot be opened (not a video OpenCV reads, or a corrupt container)");
  const double declared_count = capture.get(cv::CAP_PROP_FRAME_COUNT);
  const double declared_fps = capture.get(cv::CAP_PROP_FPS);
  const int64_t count = options.frames;
  auto target = [&](int64_t j) { return start + static_cast<double>(j) / options.fps; };

  SampledClip clip;
  clip.frames = torch::empty({count, options.channels, options.size, options.size}, torch::kUInt8);
  std::vector<double> picked(static_cast<size_t>(count), 0.0);
  int64_t taken = 0;
  int64_t converted_index = -1;  // the decoded frame last converted (reused when taken again)
  at::Tensor converted;
  auto take = [&](const cv::Mat& frame, int64_t index, double time) {
    if (index != converted_index) {
      converted = frame_to_cache(frame, options.channels, options.size, path);
      converted_index = index;
    }
    clip.frames[taken].copy_(converted);
    picked[static_cast<size_t>(taken++)] = time;
  };

  cv::Mat previous, current;
  double previous_time = 0, gap = 0;
  int64_t decoded = 0;
  bool end_of_stream = false;
  while (taken < count && target(taken) < end) {
    bool read = false;
    try {
      read = capture.read(current) && !current.empty();
    } catch (const cv::Exception& e) {
      TORCH_CHECK(false, "video: '", path, "' frame ", decoded, " cannot be decoded (", e.err, ")");
    }
    if (!read) {
      end_of_stream = true;
      break;
    }
    const double time = capture.get(cv::CAP_PROP_POS_MSEC) / 1000.0;
    TORCH_CHECK(std::isfinite(time), "video: '", path, "' frame ", decoded,
                " has no usable time (CAP_PROP_POS_MSEC ", time * 1000, ")");
    if (decoded > 0) {
      TORCH_CHECK(time > previous_time, "video: '", path, "' frame ", decoded, " has time ", time,
                  " s, not after frame ", decoded - 1, "'s ", previous_time,
                  " s (a container without usable timestamps)");
      TORCH_CHECK(current.size == previous.size && current.type() == previous.type(), "video: '",
                  path, "' changes frame size at frame ", decoded, ": ", current.cols, "x",
                  current.rows, ", expected ", previous.cols, "x", previous.rows);
      gap = time - previous_time;
    }
    // samples before this frame show the previous one (this one, before the first frame)
    while (taken < count && target(taken) < end && target(taken) + kTimeSlack < time) {
      if (decoded == 0)
        take(current, 0, time);
      else
        take(previous, decoded - 1, previous_time);
    }
    std::swap(previous, current);
    previous_time = time;
    ++decoded;
  }
  TORCH_CHECK(decoded > 0, "video: '", path, "' has zero frames (it opens, but no frame decodes)");
  if (end_of_stream && taken < count) {
    // More than one frame short of what the container declares: truncated or damaged (one short
    // is allowed: for containers without a frame count OpenCV estimates it from the duration).
    TORCH_CHECK(
        !(std::isfinite(declared_count) && static_cast<double>(decoded) + 1 < declared_count),
        "video: '", path, "' decoded ", decoded, " of the ", static_cast<int64_t>(declared_count),
        " frames its container declares (truncated or corrupt)");
    const double duration =
        std::isfinite(declared_fps) && declared_fps > 0 ? 1.0 / declared_fps : gap;
    const double stream_end = previous_time + duration;
    while (taken < count && target(taken) < std::min(end, stream_end) - kTimeSlack)
      take(previous, decoded - 1, previous_time);
    TORCH_CHECK(taken > 0, "video: '", path, "': start ", start,
                " s is at or after the clip's end ", stream_end, " s");
  }
  clip.padded = count - taken;
  for (int64_t j = taken; j < count; ++j) {  // the last sampled frame, standing still
    clip.frames[j].copy_(clip.frames[taken - 1]);
    picked[static_cast<size_t>(j)] = picked[static_cast<size_t>(taken - 1)];
  }
  clip.times = torch::tensor(picked, torch::kDouble).sub_(picked[0]);
  return clip;
}

VideoFolder decode_video_labels(const VideoLabels& labels, const std::string& csv_path,
                                const VideoFolderOptions& options,
                                const std::vector<std::string>& expected_classes) {
  check_options(options);
  VideoFolder folder;
  folder.classes = expected_classes.empty() ? labels.classes : expected_classes;
  TORCH_CHECK(!folder.classes.empty(), "labels: '", csv_path, "' has no usable row (",
              labels.errors.size(),
              " bad, first: ", labels.errors.empty() ? "none" : labels.errors.front(), ")");
  folder.skipped = static_cast<int64_t>(labels.errors.size());
  if (!labels.errors.empty()) folder.first_skipped = labels.errors.front();
  std::vector<int64_t> row_labels;
  for (const auto& row : labels.rows) {
    const auto at = std::lower_bound(folder.classes.begin(), folder.classes.end(), row.label);
    TORCH_CHECK(at != folder.classes.end() && *at == row.label, "labels: '", csv_path, "' line ",
                row.line, ": the label '", row.label,
                "' is not one of the training file's classes (", folder.classes.size(), ", first '",
                folder.classes.front(), "')");
    row_labels.push_back(at - folder.classes.begin());
  }
  const int64_t n = static_cast<int64_t>(labels.rows.size());
  const int64_t per_clip = options.frames * options.channels * options.size * options.size;
  TORCH_CHECK(n <= options.max_cache_bytes / per_clip, "video folder: '", csv_path, "' lists ", n,
              " clips; at ", options.frames, " frames of ", options.size, " x ", options.size,
              " x ", options.channels, " they need ", (n * per_clip) >> 20,
              " MiB of cache, over task.cache_mb = ", options.max_cache_bytes >> 20,
              " (raise it, or lower task.frames or task.image_size)");
  auto frames = torch::empty({n, options.frames, options.channels, options.size, options.size},
                             torch::kUInt8);
  auto times = torch::empty({n, options.frames}, torch::kDouble);
  std::vector<std::string> errors(static_cast<size_t>(n));
  std::vector<int64_t> padded(static_cast<size_t>(n), 0);
  std::atomic<int64_t> next{0};
  std::atomic<bool> stop{false};
  auto work = [&] {
    while (!stop) {
      const int64_t i = next++;  // every index taken is decoded: all before a bad one are
      if (i >= n) break;
      const auto& row = labels.rows[static_cast<size_t>(i)];
      try {
        auto clip = sample_clip(row.path, row.start, row.end, options);
        frames[i].copy_(clip.frames);
        times[i].copy_(clip.times);
        padded[static_cast<size_t>(i)] = clip.padded;
      } catch (const std::exception& e) {
        std::ostringstream line;
        line << one_line(e) << " (" << csv_path << " line " << row.line << ")";
        errors[static_cast<size_t>(i)] = line.str();
        // kStop: later clips need not be decoded; the first bad row in file order is reported
        if (options.bad == BadVideos::kStop) stop = true;
      }
    }
  };
  const int64_t cores = std::max<int64_t>(1, std::thread::hardware_concurrency());
  const int64_t threads =
      std::max<int64_t>(1, std::min(n, options.threads > 0 ? options.threads : cores));
  {
    std::vector<std::thread> pool;
    for (int64_t t = 1; t < threads; ++t) pool.emplace_back(work);
    work();
    for (auto& thread : pool) thread.join();
  }
  std::vector<int64_t> kept;
  std::vector<bool> has(folder.classes.size(), false);
  for (int64_t i = 0; i < n; ++i) {
    const auto& error = errors[static_cast<size_t>(i)];
    if (error.empty()) {
      kept.push_back(i);
      has[static_cast<size_t>(row_labels[static_cast<size_t>(i)])] = true;
      folder.padded_clips += padded[static_cast<size_t>(i)] > 0 ? 1 : 0;
      continue;
    }
    if (options.bad == BadVideos::kStop)
      TORCH_CHECK(false, error, " (task.bad_videos: skip leaves bad clips out)");
    if (folder.skipped++ == 0) folder.first_skipped = error;
  }
  for (size_t c = 0; c < has.size(); ++c)
    TORCH_CHECK(has[c], "video folder: the class '", folder.classes[c], "' of '", csv_path,
                "' has no clip", folder.skipped > 0 ? " left (" : "",
                folder.skipped > 0 ? std::to_string(folder.skipped) +
                                         " bad rows skipped, first: " + folder.first_skipped + ")"
                                   : std::string(),
                " (every class needs clips)");
  if (static_cast<int64_t>(kept.size()) < n) {
    auto index = torch::tensor(kept, torch::kLong);
    frames = frames.index_select(0, index);
    times = times.index_select(0, index);
  }
  std::vector<int64_t> kept_labels;
  for (int64_t i : kept) {
    folder.rows.push_back(labels.rows[static_cast<size_t>(i)]);
    kept_labels.push_back(row_labels[static_cast<size_t>(i)]);
  }
  if (folder.skipped > 0)
    std::cerr << "video folder: '" << csv_path << "': skipped " << folder.skipped
              << " bad row(s) of " << n + static_cast<int64_t>(labels.errors.size())
              << " (first: " << folder.first_skipped << ")\n";
  if (folder.padded_clips > 0)
    std::cerr << "video folder: '" << csv_path << "': " << folder.padded_clips << " of "
              << kept.size() << " clip(s) end before " << options.frames << " samples at "
              << options.fps << " per second: the last frame repeated\n";
  folder.frames = frames;
  folder.times = times;
  folder.labels = torch::tensor(kept_labels, torch::kLong);
  return folder;
}

VideoFolder load_video_folder(const std::string& csv_path, const std::string& clip_folder,
                              const VideoFolderOptions& options,
                              const std::vector<std::string>& classes) {
  return decode_video_labels(read_video_labels(csv_path, clip_folder, options.bad), csv_path,
                             options, classes);
}

}  // namespace posenc::video
