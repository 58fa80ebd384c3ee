// A folder of images in torchvision's ImageFolder layout (torchvision.datasets.ImageFolder):
//
//   root/<class a>/x.png, root/<class a>/sub/y.jpg, root/<class b>/z.webp, ...
//
// classes = the subfolder names, sorted (bytewise, as Python's sorted()), label = the index in
// that list; the files of a class are found recursively (symbolic links followed, as
// torchvision's os.walk(followlinks=True)) and sorted by path, class after class. Names that
// start with '.' (.DS_Store, .git) are passed over, files and folders alike. A directory link to
// a folder the walk reaches anyway (the root, a class, a folder already scanned: a loop, which
// os.walk follows until ELOOP, filing the root's images under the linking class) is refused in
// one line, in both bad_images modes; EXIF orientation is not applied (IMREAD_UNCHANGED), as
// PIL's Image.open + convert("RGB") in torchvision's and timm's loaders does not apply it.
//
// Decoding (OpenCV's imdecode, any format it reads) into the cache every step reads from:
//   8-bit pixels kept, 16-bit scaled by 1/257 (to 8 bits, rounded), other depths refused (PIL,
//   torchvision's and timm's loader, clips a 16-bit gray PNG at 255 instead: 257 -> 255, not 1;
//   a CMYK JPEG is OpenCV's CMYK -> BGR, within 1 level of PIL's convert("RGB"), measured);
//   gray -> replicated to 3 channels (channels = 3), BGR -> RGB, BGRA -> RGB with the alpha
//   dropped (not composited: the colour values as stored, as PIL's convert("RGB") that
//   torchvision's default loader calls); channels = 1: colour -> luma 0.299 R + 0.587 G +
//   0.114 B (OpenCV's cvtColor, ITU-R BT.601, as PIL's convert("L")).
//   Resized to size x size (stretched, aspect not kept): INTER_AREA when both sides shrink,
//   bilinear otherwise; an image already size x size is left as it is (bit for bit).
// Every image is decoded once, before training, by `threads` threads; the cache holds them
// resized as uint8 [N, C, size, size] (N C size^2 bytes), refused above max_cache_bytes with the
// bytes it would need.
//
// Bad files, each one line naming the file: not a regular file (FIFO, socket, device, a link to
// nothing), unreadable (permissions, I/O error), empty (0 bytes), larger than kMaxImageFileBytes,
// an extension that is not an image format's (kImageExtensions), undecodable (corrupt),
// truncated (a PNG without its IEND chunk, a JPEG without its end-of-image marker: OpenCV would
// fill the missing rows with grey and only warn). BadImages::kStop (the default) stops at the
// first in path order; kSkip leaves them out and counts them. A class with no image left is an
// error in both modes (its label could never be learned or tested).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace cv {
class Mat;
}

namespace posenc::vision {

/// What to do with a bad file (above).
enum class BadImages { kStop, kSkip };
/// "stop" / "skip"; anything else is an error naming the value.
BadImages bad_images_from_string(const std::string& name);

/// The extensions of image formats (lower case, compared case-insensitively).
inline const std::vector<std::string>& image_extensions() {
  static const std::vector<std::string> extensions{".png", ".jpg",  ".jpeg", ".jpe", ".bmp",
                                                   ".dib", ".ppm",  ".pgm",  ".pbm", ".pnm",
                                                   ".tif", ".tiff", ".webp", ".jp2"};
  return extensions;
}
/// The largest image file read (1 GiB); a larger one is a bad file.
inline constexpr int64_t kMaxImageFileBytes = int64_t{1} << 30;
/// The largest class count (a folder with more subfolders is refused).
inline constexpr int64_t kMaxImageClasses = 100000;

struct ImageFolderOptions {
  int64_t size = 224;    ///< side of the square the images are resized to
  int64_t channels = 3;  ///< 1 (gray) or 3 (RGB)
  BadImages bad = BadImages::kStop;
  int64_t threads = 0;                         ///< decoding threads (0: the machine's cores)
  int64_t max_cache_bytes = int64_t{4} << 30;  ///< the cache's limit (task.cache_mb)
};

struct ImageFolder {
  at::Tensor images;                 ///< [N, C, size, size] uint8
  at::Tensor labels;                 ///< [N] int64, indices into classes
  std::vector<std::string> classes;  ///< the class names, sorted
  std::vector<std::string> files;    ///< the N files, in the images' order
  int64_t skipped = 0;               ///< bad files left out (kSkip)
  std::string first_skipped;         ///< the first of them and why ("" when none)
};

/// The class subfolders of `root`, sorted; an error when there is none.
std::vector<std::string> image_folder_classes(const std::string& root);

/// Every image of `root` (ImageFolder layout) decoded into the cache. `classes`: the classes to
/// expect (e.g. the training folder's, for its val/ folder: the same names in the same order), or
/// empty for root's own.
ImageFolder load_image_folder(const std::string& root, const ImageFolderOptions& options,
                              const std::vector<std::string>& classes = {});

/// One image file -> uint8 [C, size, size], with the checks and conversions above; errors are
/// one line naming the file.
at::Tensor decode_image_file(const std::string& path, int64_t channels, int64_t size);

/// Decoded pixels (OpenCV's BGR, BGRA, gray or gray + alpha; 8 or 16 bit) -> uint8
/// [C, size, size]: 16 bit scaled by 1/257, converted to gray or RGB, resized (area when
/// shrinking both sides, bilinear otherwise), copied out of the Mat. `source` names the input in
/// errors ("image: 'a.png'"). Video frames take the same path (video_folder.cpp).
at::Tensor pixels_to_chw(cv::Mat image, int64_t channels, int64_t size, const std::string& source);

}  // namespace posenc::vision
