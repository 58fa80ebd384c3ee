// Image folders (modalities/vision/image_folder.h, the image_classification task's `images` key):
// files made here by OpenCV (PNG, JPEG, 16-bit, gray, RGBA) decode as stated; each kind of bad
// file (corrupt, truncated, empty, empty class, wrong extension, not a regular file, unreadable)
// is one line naming the file, or skipped with a count, and a directory link back into the walk
// (a loop, a second way to a folder) is one line in both modes; and Fashion-MNIST written out as
// PNG files trains to exactly the numbers the same images give from IDX files (PNG is lossless: the
// same pixels in the same order, so the same seed gives the same batches and the same weights).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <torch/torch.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <opencv2/imgcodecs.hpp>

#include "posenc/train/export_timm.h"
#include "posenc/train/trainer.h"
#include "support/run_files.h"
#include "vision/idx.h"
#include "vision/image_folder.h"

namespace posenc::vision {
namespace {

namespace fs = std::filesystem;

fs::path fresh_folder(const std::string& name) {
  auto path =
      fs::temp_directory_path() / ("posenc_image_folder_" + std::to_string(getpid()) + "_" + name);
  fs::remove_all(path);
  fs::create_directories(path);
  return path;
}

// One line of whatever the call threw ("" when it did not throw).
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

std::vector<unsigned char> encode(const std::string& extension, const cv::Mat& image) {
  std::vector<unsigned char> bytes;
  EXPECT_TRUE(cv::imencode(extension, image, bytes));
  return bytes;
}

void write_bytes(const fs::path& path, const std::vector<unsigned char>& bytes) {
  fs::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

// A w x h BGR image with a gradient and a seed-dependent colour.
cv::Mat colour_image(int w, int h, int seed) {
  cv::Mat image(h, w, CV_8UC3);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      image.at<cv::Vec3b>(y, x) = cv::Vec3b(static_cast<uchar>((x * 16 + seed * 40) % 256),
                                            static_cast<uchar>((y * 16 + seed * 70) % 256),
                                            static_cast<uchar>((x + y) * 8 % 256));
  return image;
}

// A good folder: class "a" (2 PNG), class "b" (1 JPEG + 1 PNG in a subfolder).
fs::path good_folder(const std::string& name) {
  auto root = fresh_folder(name);
  write_bytes(root / "a" / "1.png", encode(".png", colour_image(8, 8, 1)));
  write_bytes(root / "a" / "2.png", encode(".png", colour_image(12, 10, 2)));
  write_bytes(root / "b" / "x.jpg", encode(".jpg", colour_image(8, 8, 3)));
  write_bytes(root / "b" / "sub" / "y.png", encode(".png", colour_image(8, 8, 4)));
  return root;
}

ImageFolderOptions options_of(int64_t size, BadImages bad = BadImages::kStop) {
  ImageFolderOptions options;
  options.size = size;
  options.threads = 2;
  options.bad = bad;
  return options;
}

TEST(ImageFolder, ClassesSortedFilesRecursiveHiddenPassedOver) {
  auto root = good_folder("layout");
  write_bytes(root / "a" / ".DS_Store", {1, 2, 3});
  fs::create_directories(root / ".cache" / "z");
  auto folder = load_image_folder(root.string(), options_of(8));
  EXPECT_EQ(folder.classes, (std::vector<std::string>{"a", "b"}));
  ASSERT_EQ(folder.files.size(), 4u);
  EXPECT_EQ(folder.files[2], (root / "b" / "sub" / "y.png").string());  // sorted by path
  EXPECT_TRUE(torch::equal(folder.labels, torch::tensor({0, 0, 1, 1}, torch::kLong)));
  EXPECT_EQ(folder.images.sizes(), torch::IntArrayRef({4, 3, 8, 8}));
  EXPECT_EQ(folder.images.scalar_type(), torch::kUInt8);
  // an 8 x 8 PNG is kept bit for bit, BGR -> RGB
  auto image = colour_image(8, 8, 1);
  const auto pixel = image.at<cv::Vec3b>(3, 5);
  EXPECT_EQ(folder.images[0][0][3][5].item<int>(), pixel[2]);
  EXPECT_EQ(folder.images[0][2][3][5].item<int>(), pixel[0]);
  // a val/ folder must have the same classes
  auto other = fresh_folder("other_classes");
  write_bytes(other / "a" / "1.png", encode(".png", colour_image(8, 8, 1)));
  write_bytes(other / "c" / "1.png", encode(".png", colour_image(8, 8, 1)));
  auto message = error_of([&] { load_image_folder(other.string(), options_of(8), {"a", "b"}); });
  EXPECT_NE(message.find("the class subfolders must be the same"), std::string::npos) << message;
}

TEST(ImageFolder, GrayAlphaSixteenBitAndResize) {
  auto root = fresh_folder("conversions");
  cv::Mat gray(4, 4, CV_8UC1, cv::Scalar(77));
  write_bytes(root / "g.png", encode(".png", gray));
  cv::Mat rgba(4, 4, CV_8UC4, cv::Scalar(10, 20, 30, 0));  // B G R A, fully transparent
  write_bytes(root / "a.png", encode(".png", rgba));
  cv::Mat deep(4, 4, CV_16UC1, cv::Scalar(257 * 200));
  write_bytes(root / "d.png", encode(".png", deep));
  // gray replicated to RGB; alpha dropped, the colour kept; 16 bits / 257
  auto g = decode_image_file((root / "g.png").string(), 3, 4);
  EXPECT_TRUE(torch::equal(g, torch::full({3, 4, 4}, 77, torch::kUInt8)));
  auto a = decode_image_file((root / "a.png").string(), 3, 4);
  EXPECT_EQ(a[0][0][0].item<int>(), 30);
  EXPECT_EQ(a[2][0][0].item<int>(), 10);
  auto d = decode_image_file((root / "d.png").string(), 1, 4);
  EXPECT_TRUE(torch::equal(d, torch::full({1, 4, 4}, 200, torch::kUInt8)));
  // colour to luma: 0.299 R + 0.587 G + 0.114 B = 8.97 + 11.74 + 1.14 = 21.85 -> 22
  auto luma = decode_image_file((root / "a.png").string(), 1, 4);
  EXPECT_EQ(luma[0][0][0].item<int>(), 22);
  // resized (a constant image stays constant)
  auto big = decode_image_file((root / "g.png").string(), 3, 9);
  EXPECT_TRUE(torch::equal(big, torch::full({3, 9, 9}, 77, torch::kUInt8)));
}

// Each bad file: stop names it (one line); skip leaves it out and counts it.
struct BadCase {
  std::string name, file, expected;
  std::function<void(const fs::path&)> make;
};

TEST(ImageFolder, EachKindOfBadFileIsOneLineOrSkipped) {
  auto png = encode(".png", colour_image(8, 8, 5));
  auto jpeg = encode(".jpg", colour_image(8, 8, 6));
  std::vector<BadCase> cases{
      {"corrupt", "b/bad.png", "cannot be decoded",
       [&](const fs::path& p) {
         auto bytes = png;
         for (size_t i = 40; i < bytes.size() - 12; ++i) bytes[i] ^= 0x5A;  // IDAT scrambled
         write_bytes(p, bytes);
       }},
      {"truncated_png", "b/bad.png", "is truncated (a PNG without its IEND chunk)",
       [&](const fs::path& p) {
         write_bytes(p, std::vector<unsigned char>(png.begin(), png.begin() + png.size() / 2));
       }},
      {"truncated_jpeg", "b/bad.jpg", "is truncated (a JPEG without its end-of-image marker)",
       [&](const fs::path& p) {
         write_bytes(p, std::vector<unsigned char>(jpeg.begin(), jpeg.begin() + jpeg.size() / 2));
       }},
      {"empty_file", "b/bad.png", "is empty (0 bytes)",
       [&](const fs::path& p) { write_bytes(p, {}); }},
      {"wrong_extension", "b/notes.txt", "does not have an image extension (.txt",
       [&](const fs::path& p) {
         write_bytes(p, {'h', 'i'});
       }},
      {"not_an_image", "b/bad.png", "cannot be decoded",
       [&](const fs::path& p) {
         write_bytes(p, {'h', 'e', 'l', 'l', 'o'});
       }},
      {"fifo", "b/pipe.png", "is a FIFO",
       [&](const fs::path& p) { ASSERT_EQ(mkfifo(p.c_str(), 0600), 0); }},
      {"dangling_link", "b/link.png", "link.png",
       [&](const fs::path& p) { fs::create_symlink("/nonexistent/posenc/x.png", p); }},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    auto root = good_folder("bad_" + c.name);
    const auto bad = root / c.file;
    c.make(bad);
    auto stop = error_of([&] { load_image_folder(root.string(), options_of(8)); });
    EXPECT_NE(stop.find(bad.string()), std::string::npos) << stop;
    EXPECT_NE(stop.find(c.expected), std::string::npos) << stop;
    EXPECT_EQ(stop.find('\n'), std::string::npos) << stop;
    auto skipped = load_image_folder(root.string(), options_of(8, BadImages::kSkip));
    EXPECT_EQ(skipped.skipped, 1);
    EXPECT_EQ(skipped.images.size(0), 4);
    EXPECT_NE(skipped.first_skipped.find(bad.string()), std::string::npos);
  }
}

// A directory symlink back to the root or to a folder already scanned: torchvision's os.walk
// (followlinks=True) and a plain recursive walk follow it until the kernel's ELOOP, so class "a"
// took every image of the folder 40 times, class b's among them under a's label (bad_images:
// skip trained on 329 files from 8); refused in one line naming the link.
TEST(ImageFolder, DirectoryLinkLoopIsOneLine) {
  for (const std::string target : {"..", "../b", "."}) {
    SCOPED_TRACE(target);
    auto root = good_folder("link_loop");
    fs::create_directory_symlink(target, root / "a" / "loop");
    for (auto bad : {BadImages::kStop, BadImages::kSkip}) {
      auto message = error_of([&] { load_image_folder(root.string(), options_of(8, bad)); });
      EXPECT_NE(message.find("image folder: '" + (root / "a" / "loop").string() + "' leads to"),
                std::string::npos)
          << message;
      EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    }
  }
  // a class folder that is a link to another class (or to the root): its images twice
  auto twin = good_folder("link_class");
  fs::create_directory_symlink(twin / "a", twin / "c");
  auto message = error_of([&] { load_image_folder(twin.string(), options_of(8)); });
  EXPECT_NE(message.find("image folder: the class folder '" + (twin / "c").string() + "' leads to"),
            std::string::npos)
      << message;
  // a link to a folder outside the image folder is followed (a data set assembled from links)
  auto root = good_folder("link_outside");
  auto outside = fresh_folder("link_outside_target");
  write_bytes(outside / "3.png", encode(".png", colour_image(8, 8, 9)));
  fs::create_directory_symlink(outside, root / "a" / "more");
  auto folder = load_image_folder(root.string(), options_of(8));
  EXPECT_EQ(folder.files.size(), 5u);
  EXPECT_TRUE(torch::equal(folder.labels, torch::tensor({0, 0, 0, 1, 1}, torch::kLong)));
}

TEST(ImageFolder, UnreadableFileNamesIt) {
  // root reads a mode-000 file anyway (CAP_DAC_OVERRIDE): the FIFO and dangling-link cases above
  // are the unreadable entries a root test can make; this one runs as any other user.
  if (geteuid() == 0) GTEST_SKIP() << "running as root: permissions do not stop reads";
  auto root = good_folder("unreadable");
  const auto bad = root / "b" / "locked.png";
  write_bytes(bad, encode(".png", colour_image(8, 8, 7)));
  ASSERT_EQ(chmod(bad.c_str(), 0), 0);
  auto stop = error_of([&] { load_image_folder(root.string(), options_of(8)); });
  EXPECT_NE(stop.find(bad.string()), std::string::npos) << stop;
  EXPECT_EQ(load_image_folder(root.string(), options_of(8, BadImages::kSkip)).skipped, 1);
}

TEST(ImageFolder, EmptyClassIsAnErrorInBothModes) {
  auto root = good_folder("empty_class");
  fs::create_directories(root / "c");
  for (auto bad : {BadImages::kStop, BadImages::kSkip}) {
    auto message = error_of([&] { load_image_folder(root.string(), options_of(8, bad)); });
    EXPECT_NE(message.find("the class folder '" + (root / "c").string() + "' holds no files"),
              std::string::npos)
        << message;
  }
  // a class whose only file is bad: skipping it would leave the class empty
  auto lone = good_folder("lone_bad");
  write_bytes(lone / "c" / "bad.png", {'x'});
  auto message =
      error_of([&] { load_image_folder(lone.string(), options_of(8, BadImages::kSkip)); });
  EXPECT_NE(message.find("the class 'c' of '" + lone.string() + "' has no readable image left"),
            std::string::npos)
      << message;
}

TEST(ImageFolder, CacheLimitIsNamed) {
  auto root = good_folder("cache_limit");
  auto options = options_of(512);
  options.max_cache_bytes = 1 << 20;  // 4 images of 3 x 512 x 512 need 3 MiB
  auto message = error_of([&] { load_image_folder(root.string(), options); });
  EXPECT_NE(message.find("need 3 MiB of cache, over task.cache_mb = 1"), std::string::npos)
      << message;
}

// --- Fashion-MNIST from IDX and from PNG files: the same run -------------------------------

void write_idx(const fs::path& path, const at::Tensor& data) {
  std::vector<unsigned char> bytes{0, 0, 0x08, static_cast<unsigned char>(data.dim())};
  for (int64_t d = 0; d < data.dim(); ++d) {
    const auto size = static_cast<uint32_t>(data.size(d));
    for (int shift = 24; shift >= 0; shift -= 8)
      bytes.push_back(static_cast<unsigned char>(size >> shift));
  }
  auto flat = data.contiguous();
  bytes.insert(bytes.end(), flat.data_ptr<uint8_t>(), flat.data_ptr<uint8_t>() + flat.numel());
  write_bytes(path, bytes);  // plain IDX under the .gz name: zlib's gzread reads it as it is
}

// The first `count` images of a split, ordered by label (stable): the order an ImageFolder of
// them has. Written as IDX (idx/) and as PNG files (png/<split>/<label>_<name>/<index>.png).
void write_split(const fs::path& root, bool train, int64_t count) {
  auto split = load_fashion_mnist(train, "/usr/share/datasets/fashion-mnist");
  auto labels = split.labels.narrow(0, 0, count);
  auto order = std::get<1>(labels.sort(/*stable=*/true, 0, false));
  auto images = split.images.narrow(0, 0, count).index_select(0, order).contiguous();
  auto sorted_labels = labels.index_select(0, order);
  const std::string prefix = train ? "train" : "t10k";
  write_idx(root / "idx" / (prefix + "-images-idx3-ubyte.gz"), images);
  write_idx(root / "idx" / (prefix + "-labels-idx1-ubyte.gz"), sorted_labels.to(torch::kUInt8));
  for (int64_t i = 0; i < count; ++i) {
    const auto label = sorted_labels[i].item<int64_t>();
    cv::Mat image(28, 28, CV_8UC1, images[i].data_ptr<uint8_t>());
    char name[16];
    std::snprintf(name, sizeof name, "%05lld.png", static_cast<long long>(i));
    write_bytes(root / "png" / prefix /
                    (std::to_string(label) + "_" + FashionMnist::class_names()[label]) / name,
                encode(".png", image));
  }
}

// IDX data is padded by 2 px a side by default: the model takes 32 px, and timm.json's data
// config must say 32 (it said 28, image_size, which timm's patch embedding refuses: "Input height
// (28) doesn't match model (32)"). tests/timm_export_check.py runs a padded export through timm.
TEST(ImageFolder, TimmExportOfPaddedIdxStatesTheSizeTheModelTakes) {
  auto root = fresh_folder("idx_pad");
  auto images = torch::randint(0, 256, {16, 28, 28}, torch::kLong).to(torch::kUInt8);
  auto labels = torch::arange(16, torch::kLong).remainder(10).to(torch::kUInt8);
  for (const std::string prefix : {"train", "t10k"}) {
    write_idx(root / "idx" / (prefix + "-images-idx3-ubyte.gz"), images);
    write_idx(root / "idx" / (prefix + "-labels-idx1-ubyte.gz"), labels);
  }
  nlohmann::json config = nlohmann::json::parse(R"({
    "name": "idx_pad", "seed": 0,
    "task": {"type": "image_classification", "patch": 8, "eval_scales": [1.0]},
    "model": {"dim": 8, "num_heads": 1, "num_layers": 1, "mlp_ratio": 2, "norm_eps": 1e-6},
    "encoder": {"type": "axial_sincos"},
    "train": {"epochs": 1, "batch_size": 8, "lr": 0.001, "log_every": 1}
  })");
  config["task"]["data_dir"] = (root / "idx").string();
  train::RunOptions options;
  options.quiet = true;
  options.output = (root / "run").string();
  ASSERT_TRUE(train::run_training(config, options).finished);
  const auto exported = train::timm_export(config, options.output + "/weights.pt");
  EXPECT_EQ(exported.input.at("image_size").get<int64_t>(), 28);
  EXPECT_EQ(exported.input.at("pad").get<int64_t>(), 2);
  EXPECT_EQ(exported.model_args.at("img_size").get<int64_t>(), 32);
  EXPECT_EQ(exported.model_args.at("pretrained_cfg_overlay").at("input_size"),
            nlohmann::json::parse("[1, 32, 32]"));
}

TEST(ImageFolder, FashionMnistAsPngFilesTrainsAsFromIdx) {
  auto root = fresh_folder("fashion");
  write_split(root, true, 320);
  write_split(root, false, 128);
  nlohmann::json base = nlohmann::json::parse(R"({
    "name": "folder_vs_idx", "seed": 0,
    "task": {"type": "image_classification", "eval_scales": [1.0, 1.5]},
    "model": {"dim": 32, "num_heads": 2, "num_layers": 1, "mlp_ratio": 2},
    "encoder": {"type": "rope", "mrope_section": [4, 4], "per_axis_frequencies": true,
                "rope_theta": 100},
    "train": {"epochs": 2, "batch_size": 32, "lr": 0.003, "warmup_steps": 4, "log_every": 4}
  })");
  auto from_idx = base;
  from_idx["task"]["data_dir"] = (root / "idx").string();
  auto from_png = base;
  auto& task = from_png["task"];
  task["images"] = (root / "png" / "train").string();
  task["val_images"] = (root / "png" / "t10k").string();
  task["image_size"] = 28;
  task["channels"] = 1;
  task["pad"] = 2;  // IDX's default
  task["mean"] = 0.2860;
  task["std"] = 0.3530;
  train::RunOptions idx_run, png_run;
  idx_run.quiet = png_run.quiet = true;
  idx_run.output = (root / "run_idx").string();
  png_run.output = (root / "run_png").string();
  auto a = train::run_training(from_idx, idx_run);
  auto b = train::run_training(from_png, png_run);
  ASSERT_TRUE(a.finished && b.finished);
  EXPECT_EQ(a.steps, b.steps);
  ASSERT_EQ(a.final_metrics.size(), b.final_metrics.size());
  for (size_t i = 0; i < a.final_metrics.size(); ++i)
    EXPECT_EQ(a.final_metrics[i].second, b.final_metrics[i].second) << a.final_metrics[i].first;
  ASSERT_EQ(a.generalization.size(), b.generalization.size());
  for (size_t i = 0; i < a.generalization.size(); ++i)
    EXPECT_EQ(train::metric_value(a.generalization[i].metrics, "accuracy"),
              train::metric_value(b.generalization[i].metrics, "accuracy"));
  auto wa = train::read_weights(idx_run.output + "/weights.pt");
  auto wb = train::read_weights(png_run.output + "/weights.pt");
  ASSERT_EQ(wa.size(), wb.size());
  for (const auto& [name, tensor] : wa) EXPECT_TRUE(torch::equal(tensor, wb.at(name))) << name;
  // the class names, in label order, in both run folders
  std::ifstream classes(png_run.output + "/classes.json");
  const auto names = nlohmann::json::parse(classes);
  ASSERT_EQ(names.size(), 10u);
  EXPECT_EQ(names[0], "0_t-shirt");
  EXPECT_EQ(names[9], "9_ankle boot");

  // a seeded val_fraction split instead of val_images: per class, and the same every time
  auto split = from_png;
  split["task"].erase("val_images");
  split["task"]["val_fraction"] = 0.25;
  auto task_a = train::make_task(split);
  auto task_b = train::make_task(split);
  EXPECT_EQ(task_a->train_size(), task_b->train_size());
  EXPECT_GT(task_a->train_size(), 320 * 0.7);
  EXPECT_LT(task_a->train_size(), 320 * 0.8);
}

// The class names come from the data (folder names, sorted) each time the task is built, and
// the weights' outputs from the folder as it was at training (classes.json in the run folder): a
// class folder renamed since (here a -> c: the sorted order becomes b, c) named the outputs
// wrongly without a word in eval --image, in eval's accuracy and in timm.json's classes. Each is
// refused in one line naming classes.json and the first class that differs.
TEST(ImageFolder, EvalRefusesClassesThatChangedSinceTraining) {
  auto root = good_folder("renamed");
  nlohmann::json config = nlohmann::json::parse(R"({
    "name": "renamed", "seed": 0,
    "task": {"type": "image_classification", "image_size": 8, "val_fraction": 0.5},
    "model": {"dim": 8, "num_heads": 1, "num_layers": 1, "mlp_ratio": 2, "norm_eps": 1e-6},
    "encoder": {"type": "axial_sincos"},
    "train": {"epochs": 1, "batch_size": 2, "lr": 0.001, "log_every": 1}
  })");
  config["task"]["images"] = (root / "classes").string();
  fs::create_directories(root / "classes");
  fs::rename(root / "a", root / "classes" / "a");
  fs::rename(root / "b", root / "classes" / "b");
  train::RunOptions options;
  options.quiet = true;
  options.output = (root / "run").string();
  ASSERT_TRUE(train::run_training(config, options).finished);
  const auto weights = options.output + "/weights.pt";
  const std::vector<std::string> image = {(root / "classes" / "a" / "1.png").string()};
  std::vector<std::string> classes;
  train::RunOptions eval;
  eval.quiet = true;
  train::classify_image_files(config, eval, weights, image, &classes);
  EXPECT_EQ(classes, (std::vector<std::string>{"a", "b"}));
  // unchanged folder: eval and export go on
  EXPECT_EQ(error_of([&] { train::export_run_to_timm(options.output, ""); }), "");

  fs::rename(root / "classes" / "a", root / "classes" / "c");
  const std::vector<std::string> moved = {(root / "classes" / "c" / "1.png").string()};
  const std::string expected = "class 0 is 'b' now, 'a' in " + options.output + "/classes.json";
  const auto classify =
      error_of([&] { train::classify_image_files(config, eval, weights, moved, nullptr); });
  EXPECT_NE(classify.find(expected), std::string::npos) << classify;
  EXPECT_EQ(classify.find('\n'), std::string::npos) << classify;
  eval.output = (root / "eval").string();
  const auto evaluate = error_of([&] { train::run_evaluation(config, eval, weights); });
  EXPECT_NE(evaluate.find(expected), std::string::npos) << evaluate;
  const auto exported = error_of([&] { train::export_run_to_timm(options.output, ""); });
  EXPECT_NE(exported.find(expected), std::string::npos) << exported;
}

}  // namespace
}  // namespace posenc::vision
