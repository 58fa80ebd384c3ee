// modalities/vision: Fashion-MNIST from Debian's dataset-fashion-mnist (real data), corrupted
// copies, patchify into tokens + grid Positions, image files through OpenCV, augmentation.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "support/fixtures.h"
#include "vision/idx.h"
#include "vision/images.h"

namespace posenc::vision {
namespace {

namespace fs = std::filesystem;
const std::string kData = "/usr/share/datasets/fashion-mnist";

fs::path temp_file(const std::string& name) {
  auto dir = fs::temp_directory_path() / "posenc_vision_tests";
  fs::create_directories(dir);
  return dir / name;
}

void write_bytes(const fs::path& path, const std::vector<unsigned char>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

TEST(FashionMnist, RealTrainAndTestSplits) {
  auto train = load_fashion_mnist(true, kData);
  auto test = load_fashion_mnist(false, kData);
  EXPECT_EQ(train.images.sizes(), torch::IntArrayRef({60000, 28, 28}));
  EXPECT_EQ(test.images.sizes(), torch::IntArrayRef({10000, 28, 28}));
  // balanced classes: 6000 / 1000 per class
  EXPECT_TRUE(torch::equal(torch::bincount(train.labels), torch::full({10}, 6000, torch::kLong)));
  EXPECT_TRUE(torch::equal(torch::bincount(test.labels), torch::full({10}, 1000, torch::kLong)));
  // the first items as Python's gzip reads them: labels 9 0 0 3 0, image 0 sums to 76247
  EXPECT_TRUE(
      torch::equal(train.labels.narrow(0, 0, 5), torch::tensor({9, 0, 0, 3, 0}, torch::kLong)));
  EXPECT_EQ(train.images[0].sum().item<int64_t>(), 76247);
  EXPECT_STREQ(FashionMnist::class_names()[9], "ankle boot");
}

TEST(Idx, TruncatedAndCorruptFilesAreErrors) {
  // a truncated gzip copy of the real test labels
  std::ifstream in(kData + "/t10k-labels-idx1-ubyte.gz", std::ios::binary);
  std::vector<unsigned char> gz((std::istreambuf_iterator<char>(in)), {});
  gz.resize(gz.size() / 2);
  auto truncated = temp_file("truncated-labels.gz");
  write_bytes(truncated, gz);
  auto message = test::error_of([&] { read_idx(truncated.string()); });
  EXPECT_NE(message.find("is truncated or corrupt: expected 10000 bytes of data"),
            std::string::npos)
      << message;
  // plain file: header for 1 x 28 x 28 but only 100 pixels
  std::vector<unsigned char> raw{0, 0, 8, 3, 0, 0, 0, 1, 0, 0, 0, 28, 0, 0, 0, 28};
  raw.resize(raw.size() + 100, 7);
  auto short_file = temp_file("short-images");
  write_bytes(short_file, raw);
  message = test::error_of([&] { read_idx(short_file.string()); });
  EXPECT_NE(message.find("expected 784 bytes of data, got 100"), std::string::npos) << message;
  write_bytes(short_file, {1, 2, 8, 1, 0, 0, 0, 1, 5});
  message = test::error_of([&] { read_idx(short_file.string()); });
  EXPECT_NE(message.find("is not an IDX file (magic bytes 1, 2"), std::string::npos) << message;
  message = test::error_of([&] { read_idx("/nonexistent/x.gz"); });
  EXPECT_NE(message.find("cannot open '/nonexistent/x.gz'"), std::string::npos) << message;
}

TEST(Patchify, TokensAndGridPositions) {
  auto images = torch::arange(2 * 28 * 28, torch::kFloat32).view({2, 1, 28, 28});
  auto p = patchify(images, 7);
  EXPECT_EQ(p.tokens.sizes(), torch::IntArrayRef({2, 16, 49}));
  EXPECT_EQ(p.positions.axes(), (std::vector<std::string>{"h", "w"}));
  // token 6 = grid (1, 2): rows 7..13, columns 14..20 of image 1
  auto expected = images[1][0].narrow(0, 7, 7).narrow(1, 14, 7).flatten();
  EXPECT_TRUE(torch::equal(p.tokens[1][6], expected));
  EXPECT_TRUE(torch::equal(p.positions.coords()[6], torch::tensor({1.0, 2.0}, torch::kFloat64)));
  auto message = test::error_of([&] { patchify(images, 5); });
  EXPECT_NE(message.find("image size 28x28 is not divisible by the patch size 5"),
            std::string::npos)
      << message;
}

TEST(Images, FilesThroughOpenCvAndAugmentation) {
  // a 2 x 3 binary PPM: OpenCV decodes it; pixel (0, 1) is pure green
  std::vector<unsigned char> ppm{'P', '6', '\n', '3', ' ', '2', '\n', '2', '5', '5', '\n'};
  const unsigned char pixels[18] = {255, 0,  0,  0,  255, 0,  0,  0,  255,
                                    10,  20, 30, 40, 50,  60, 70, 80, 90};
  ppm.insert(ppm.end(), pixels, pixels + 18);
  auto path = temp_file("tiny.ppm");
  write_bytes(path, ppm);
  auto image = load_image(path.string());
  ASSERT_EQ(image.sizes(), torch::IntArrayRef({3, 2, 3}));
  EXPECT_FLOAT_EQ(image[1][0][1].item<float>(), 1.0f);  // green channel of pixel (0, 1)
  EXPECT_FLOAT_EQ(image[2][1][2].item<float>(), 90.0f / 255);
  auto message = test::error_of([] { load_image("/nonexistent/image.png"); });
  EXPECT_NE(message.find("cannot read '/nonexistent/image.png'"), std::string::npos) << message;
  auto batch = torch::rand({4, 1, 28, 28});
  EXPECT_EQ(resize_images(batch, 42, 42).sizes(), torch::IntArrayRef({4, 1, 42, 42}));
  EXPECT_EQ(random_crop(batch, 2).sizes(), batch.sizes());
  torch::manual_seed(5);
  auto flipped = random_horizontal_flip(batch);
  for (int64_t i = 0; i < 4; ++i)
    EXPECT_TRUE(torch::equal(flipped[i], batch[i]) || torch::equal(flipped[i], batch[i].flip({2})));
}

TEST(Vision, RandomErasingSetsOneRectanglePerErasedImage) {
  torch::manual_seed(7);
  auto batch = torch::rand({400, 2, 28, 28}) + 1.0f;  // every pixel in [1, 2): none is 0
  auto out = random_erasing(batch, 0.5, 0.0);
  int64_t erased = 0;
  for (int64_t i = 0; i < batch.size(0); ++i) {
    auto zero = out[i][0].eq(0);
    EXPECT_TRUE(torch::equal(out[i][1].eq(0), zero)) << "every channel erased alike, image " << i;
    const int64_t count = zero.sum().item<int64_t>();
    if (count == 0) {
      EXPECT_TRUE(torch::equal(out[i], batch[i]));
      continue;
    }
    ++erased;
    // One rectangle: the zero pixels fill their bounding box, area and aspect within limits.
    auto rows = zero.any(1).nonzero(), cols = zero.any(0).nonzero();
    const int64_t h = rows.max().item<int64_t>() - rows.min().item<int64_t>() + 1;
    const int64_t w = cols.max().item<int64_t>() - cols.min().item<int64_t>() + 1;
    EXPECT_EQ(count, h * w) << i;
    EXPECT_GE(count, std::floor(kEraseMinArea * 784 * 0.5)) << i;
    EXPECT_LE(count, std::ceil(kEraseMaxArea * 784 * 1.5)) << i;
    EXPECT_TRUE(torch::equal(out[i].masked_select(zero.logical_not().expand({2, 28, 28})),
                             batch[i].masked_select(zero.logical_not().expand({2, 28, 28}))));
  }
  EXPECT_GT(erased, 150);  // 200 expected of 400 at p = 1/2
  EXPECT_LT(erased, 250);
  EXPECT_TRUE(torch::equal(random_erasing(batch, 0.0), batch));
  EXPECT_EQ(random_erasing(batch, 1.0).eq(0).flatten(1).any(1).sum().item<int64_t>(), 400);
  auto message = test::error_of([&] { random_erasing(batch, 1.5); });
  EXPECT_NE(message.find("probability must be in [0, 1], got 1.5"), std::string::npos) << message;
}

}  // namespace
}  // namespace posenc::vision
