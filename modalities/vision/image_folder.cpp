// ImageFolder scanning, checks and parallel decoding into the uint8 cache; see image_folder.h.
#include "image_folder.h"

#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <filesystem>
#include <iostream>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#include <set>
#include <thread>

#include "posenc/io/input_file.h"

namespace posenc::vision {

namespace fs = std::filesystem;

namespace {

std::string lower(std::string text) {
  for (auto& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

bool hidden(const fs::path& path) {
  const auto name = path.filename().string();
  return !name.empty() && name[0] == '.';
}

// One line of an exception (c10::Error without its backtrace).
std::string one_line(const std::exception& e) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e))
    return c10_error->what_without_backtrace();
  return e.what();
}

// The end of a PNG: the IEND chunk (length 0, "IEND", its CRC AE 42 60 82).
bool png_complete(const std::string& bytes) {
  static const unsigned char iend[12] = {0, 0, 0, 0, 'I', 'E', 'N', 'D', 0xAE, 0x42, 0x60, 0x82};
  return bytes.size() >= 12 &&
         std::equal(iend, iend + 12, bytes.end() - 12,
                    [](unsigned char a, char b) { return a == static_cast<unsigned char>(b); });
}

// The end of a JPEG: the EOI marker FF D9, allowing up to 64 trailing bytes (padding some
// cameras and tools append).
bool jpeg_complete(const std::string& bytes) {
  const size_t from = bytes.size() > 66 ? bytes.size() - 66 : 0;
  for (size_t i = bytes.size(); i-- > from + 1;) {
    if (static_cast<unsigned char>(bytes[i - 1]) == 0xFF &&
        static_cast<unsigned char>(bytes[i]) == 0xD9)
      return true;
  }
  return false;
}

bool starts_with(const std::string& bytes, const unsigned char* magic, size_t n) {
  return bytes.size() >= n &&
         std::equal(magic, magic + n, bytes.begin(),
                    [](unsigned char a, char b) { return a == static_cast<unsigned char>(b); });
}

}  // namespace

BadImages bad_images_from_string(const std::string& name) {
  if (name == "stop") return BadImages::kStop;
  if (name == "skip") return BadImages::kSkip;
  TORCH_CHECK(false, "task: bad_images must be 'stop' or 'skip', got '", name, "'");
}

std::vector<std::string> image_folder_classes(const std::string& root) {
  std::error_code error;
  TORCH_CHECK(fs::is_directory(root, error), "image folder: '", root,
              "' is not a folder (expected class subfolders: root/<class>/<image>)");
  std::vector<std::string> classes;
  for (const auto& entry : fs::directory_iterator(root)) {
    if (hidden(entry.path()) || !entry.is_directory()) continue;
    classes.push_back(entry.path().filename().string());
    TORCH_CHECK(static_cast<int64_t>(classes.size()) <= kMaxImageClasses, "image folder: '", root,
                "' has more than ", kMaxImageClasses, " class subfolders (kMaxImageClasses)");
  }
  TORCH_CHECK(!classes.empty(), "image folder: '", root,
              "' has no class subfolders (expected root/<class>/<image>)");
  std::sort(classes.begin(), classes.end());
  return classes;
}

at::Tensor pixels_to_chw(cv::Mat image, int64_t channels, int64_t size, const std::string& source) {
  if (image.depth() == CV_16U) {
    cv::Mat eight;
    image.convertTo(eight, CV_8U, 1.0 / 257);
    image = eight;
  }
  TORCH_CHECK(image.depth() == CV_8U, source, " has pixels of OpenCV depth ", image.depth(),
              "; only 8- and 16-bit integer images are read");
  cv::Mat converted;
  const int stored = image.channels();
  TORCH_CHECK(stored == 1 || stored == 2 || stored == 3 || stored == 4, source, " has ", stored,
              " channels; expected 1 (gray), 2 (gray + alpha), 3 (BGR) or 4 (BGRA)");
  if (stored == 2) {  // gray + alpha: the gray
    cv::extractChannel(image, image, 0);
  }
  if (channels == 1) {
    if (image.channels() == 1)
      converted = image;
    else
      cv::cvtColor(image, converted,
                   image.channels() == 4 ? cv::COLOR_BGRA2GRAY : cv::COLOR_BGR2GRAY);
  } else if (image.channels() == 1) {
    cv::cvtColor(image, converted, cv::COLOR_GRAY2RGB);
  } else {
    cv::cvtColor(image, converted, image.channels() == 4 ? cv::COLOR_BGRA2RGB : cv::COLOR_BGR2RGB);
  }
  if (converted.rows != size || converted.cols != size) {
    cv::Mat resized;
    const bool shrink = converted.rows > size && converted.cols > size;
    cv::resize(converted, resized, cv::Size(static_cast<int>(size), static_cast<int>(size)), 0, 0,
               shrink ? cv::INTER_AREA : cv::INTER_LINEAR);
    converted = resized;
  }
  if (!converted.isContinuous()) converted = converted.clone();
  auto hwc = torch::from_blob(converted.data, {size, size, channels}, torch::kUInt8);
  // a copy out of the cv::Mat, always: with C = 1 the permute is already contiguous, and
  // .contiguous() would return a view of memory the Mat frees on return
  return hwc.permute({2, 0, 1}).clone(at::MemoryFormat::Contiguous);
}

at::Tensor decode_image_file(const std::string& path, int64_t channels, int64_t size) {
  TORCH_CHECK(channels == 1 || channels == 3, "image: channels must be 1 or 3, got ", channels);
  TORCH_CHECK(size > 0, "image: size must be positive, got ", size);
  const auto extension = lower(fs::path(path).extension().string());
  const auto& known = image_extensions();
  TORCH_CHECK(std::find(known.begin(), known.end(), extension) != known.end(), "image: '", path,
              "' does not have an image extension (", extension.empty() ? "none" : extension,
              "; expected .png, .jpg, .jpeg, .bmp, .tif, .webp, .ppm, ...)");
  const auto bytes = read_regular_file(path, "image", kMaxImageFileBytes, "kMaxImageFileBytes");
  TORCH_CHECK(!bytes.empty(), "image: '", path, "' is empty (0 bytes)");
  static const unsigned char png_magic[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  static const unsigned char jpeg_magic[3] = {0xFF, 0xD8, 0xFF};
  TORCH_CHECK(!starts_with(bytes, png_magic, 8) || png_complete(bytes), "image: '", path,
              "' is truncated (a PNG without its IEND chunk)");
  TORCH_CHECK(!starts_with(bytes, jpeg_magic, 3) || jpeg_complete(bytes), "image: '", path,
              "' is truncated (a JPEG without its end-of-image marker)");
  cv::Mat image;
  try {
    const cv::Mat buffer(1, static_cast<int>(bytes.size()), CV_8U, const_cast<char*>(bytes.data()));
    image = cv::imdecode(buffer, cv::IMREAD_UNCHANGED);
  } catch (const cv::Exception& e) {
    TORCH_CHECK(false, "image: '", path, "' cannot be decoded (", e.err, ")");
  }
  TORCH_CHECK(!image.empty(), "image: '", path,
              "' cannot be decoded (corrupt, or not an image format OpenCV reads)");
  return pixels_to_chw(image, channels, size, "image: '" + path + "'");
}

ImageFolder load_image_folder(const std::string& root, const ImageFolderOptions& options,
                              const std::vector<std::string>& expected_classes) {
  TORCH_CHECK(options.channels == 1 || options.channels == 3, "task: channels must be 1 or 3, got ",
              options.channels);
  TORCH_CHECK(options.size > 0, "task: image_size must be positive, got ", options.size);
  ImageFolder folder;
  folder.classes = image_folder_classes(root);
  if (!expected_classes.empty()) {
    TORCH_CHECK(folder.classes == expected_classes, "image folder: '", root, "' has ",
                folder.classes.size(), " classes (first '", folder.classes.front(),
                "'), not the training folder's ", expected_classes.size(), " (first '",
                expected_classes.front(), "'): the class subfolders must be the same");
  }
  // Every file, class after class, sorted by path. Directory links are followed, but never to a
  // folder already in the walk (the root, a class, a folder scanned before): a link back would
  // repeat images until ELOOP, under another class's label.
  std::set<fs::path> folders{fs::canonical(root)};
  for (const auto& name : folder.classes) {
    const auto class_root = fs::path(root) / name, target = fs::canonical(class_root);
    TORCH_CHECK(folders.insert(target).second, "image folder: the class folder '",
                class_root.string(), "' leads to '", target.string(),
                "', the image folder itself or another class's folder (a directory link)");
  }
  std::vector<int64_t> labels;
  for (size_t c = 0; c < folder.classes.size(); ++c) {
    const fs::path class_root = fs::path(root) / folder.classes[c];
    std::vector<std::string> files;
    auto it = fs::recursive_directory_iterator(class_root,
                                               fs::directory_options::follow_directory_symlink);
    for (; it != fs::recursive_directory_iterator(); ++it) {
      if (hidden(it->path())) {
        if (it->is_directory()) it.disable_recursion_pending();
        continue;
      }
      std::error_code error;
      if (it->is_directory(error)) {
        const auto target = fs::canonical(it->path());
        TORCH_CHECK(folders.insert(target).second, "image folder: '", it->path().string(),
                    "' leads to '", target.string(),
                    "', a folder the walk has reached already (through a directory link: its "
                    "images would be read twice, or without end in a loop)");
        continue;
      }
      files.push_back(it->path().string());  // regular or not: decode_image_file says which
    }
    std::sort(files.begin(), files.end());
    TORCH_CHECK(!files.empty(), "image folder: the class folder '", class_root.string(),
                "' holds no files (every class needs images)");
    for (auto& f : files) {
      folder.files.push_back(std::move(f));
      labels.push_back(static_cast<int64_t>(c));
    }
  }
  const int64_t n = static_cast<int64_t>(folder.files.size());
  const int64_t per_image = options.channels * options.size * options.size;
  TORCH_CHECK(n <= options.max_cache_bytes / per_image, "image folder: '", root, "' holds ", n,
              " images; at ", options.size, " x ", options.size, " x ", options.channels,
              " they need ", (n * per_image) >> 20,
              " MiB of cache, over task.cache_mb = ", options.max_cache_bytes >> 20,
              " (raise it, or lower task.image_size)");
  auto images = torch::empty({n, options.channels, options.size, options.size}, torch::kUInt8);
  std::vector<std::string> errors(static_cast<size_t>(n));
  std::atomic<int64_t> next{0};
  std::atomic<bool> stop{false};
  auto work = [&] {
    while (!stop) {
      const int64_t i = next++;  // every index taken is decoded: all before a bad one are
      if (i >= n) break;
      try {
        images[i].copy_(decode_image_file(folder.files[i], options.channels, options.size));
      } catch (const std::exception& e) {
        errors[i] = one_line(e);
        // kStop: later files need not be decoded; earlier ones were all taken before this one
        // (the first bad file in path order is the one reported, whatever the threads' timing)
        if (options.bad == BadImages::kStop) stop = true;
      }
    }
  };
  const int64_t cores = std::max<int64_t>(1, std::thread::hardware_concurrency());
  const int64_t threads = std::min(n, options.threads > 0 ? options.threads : cores);
  {
    // LibTorch's own intra-op threads stay out of the copies (each is one small image).
    std::vector<std::thread> pool;
    for (int64_t t = 1; t < threads; ++t) pool.emplace_back(work);
    work();
    for (auto& thread : pool) thread.join();
  }
  std::vector<int64_t> kept;
  for (int64_t i = 0; i < n; ++i) {
    if (errors[i].empty()) {
      kept.push_back(i);
      continue;
    }
    if (options.bad == BadImages::kStop)
      TORCH_CHECK(false, errors[i], " (task.bad_images: skip leaves bad files out)");
    if (folder.skipped++ == 0) folder.first_skipped = errors[i];
  }
  if (folder.skipped > 0) {
    std::vector<std::string> files;
    std::vector<int64_t> kept_labels;
    std::vector<bool> has(folder.classes.size(), false);
    for (int64_t i : kept) {
      files.push_back(folder.files[i]);
      kept_labels.push_back(labels[i]);
      has[labels[i]] = true;
    }
    for (size_t c = 0; c < has.size(); ++c)
      TORCH_CHECK(has[c], "image folder: the class '", folder.classes[c], "' of '", root,
                  "' has no readable image left (", folder.skipped,
                  " bad files skipped, first: ", folder.first_skipped, ")");
    images = images.index_select(0, torch::tensor(kept, torch::kLong));
    folder.files = std::move(files);
    labels = std::move(kept_labels);
    std::cerr << "image folder: '" << root << "': skipped " << folder.skipped << " bad file(s) of "
              << n << " (first: " << folder.first_skipped << ")\n";
  }
  folder.images = images;
  folder.labels = torch::tensor(labels, torch::kLong);
  return folder;
}

}  // namespace posenc::vision
