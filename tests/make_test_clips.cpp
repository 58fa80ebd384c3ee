// The clips of the CTest `video_clips_train` (tests/CMakeLists.txt): moving Fashion-MNIST
// (modalities/video/moving_fashion.h) written as the files a user would have, to train
// video_classification from a folder and classify new clips with `posenc eval --video`.
//
//   posenc_make_test_clips OUT COUNT [FASHION_MNIST_DIR]
//
// OUT/clips/clip_NNNNN.avi: COUNT clips of 8 frames, 32 x 32, one item moving right, left or down
// (3 classes: the 4 directions without "up"; Fashion-MNIST's training images), Motion-JPEG in AVI
// (video::write_video), every third clip at 16 fps with each frame shown twice (the same motion,
// other frame times: sampling at task.fps takes the frame on screen), the others at 8 fps;
// OUT/clips/labels.csv: path,label,start,end with the direction's name as the label, the start
// empty or 0.125 s (one frame in) and the end empty; OUT/new_<direction>.avi: one clip of each
// class from the test images (not in the training folder) for `posenc eval --video`.
#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>

#include "video/moving_fashion.h"
#include "video/video.h"
#include "vision/idx.h"

namespace {

using posenc::video::MovingClips;

// Clips whose direction is not "up" (index 3 of the 4 directions).
MovingClips generate(const posenc::vision::FashionMnist& source, int64_t wanted, uint64_t seed,
                     std::vector<int64_t>* kept) {
  posenc::video::MovingOptions options;
  options.num_frames = 8;
  options.min_speed = 2.0;
  options.max_speed = 2.5;
  options.seed = seed;
  auto clips = posenc::video::generate_moving_clips(source, wanted * 4 / 3 + 16, options);
  for (int64_t n = 0; n < clips.direction.size(0) && static_cast<int64_t>(kept->size()) < wanted;
       ++n)
    if (clips.direction[n].item<int64_t>() != 3) kept->push_back(n);
  return clips;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: posenc_make_test_clips OUT COUNT [FASHION_MNIST_DIR]\n";
    return 2;
  }
  try {
    const std::string out = argv[1];
    const int64_t count = std::stoll(argv[2]);
    const std::string data = argc > 3 ? argv[3] : "/usr/share/datasets/fashion-mnist";
    const auto& names = MovingClips::direction_names(4);
    std::filesystem::create_directories(out + "/clips");
    std::vector<int64_t> kept;
    auto clips = generate(posenc::vision::load_fashion_mnist(true, data), count, 1, &kept);
    std::ofstream labels(out + "/clips/labels.csv");
    labels << "path,label,start,end\n";
    for (size_t i = 0; i < kept.size(); ++i) {
      const int64_t n = kept[i];
      char name[32];
      std::snprintf(name, sizeof name, "clip_%05zu.avi", i);
      auto frames = clips.frames[n];  // [T, 1, H, W]
      if (i % 3 == 2)                 // 16 fps, every frame twice
        posenc::video::write_video(out + "/clips/" + name, frames.repeat_interleave(2, 0), 16);
      else
        posenc::video::write_video(out + "/clips/" + name, frames, 8);
      labels << name << ',' << names[clips.direction[n].item<int64_t>()] << ','
             << (i % 2 ? "0.125" : "") << ",\n";
    }
    labels.close();
    if (!labels) throw std::runtime_error("cannot write " + out + "/clips/labels.csv");
    std::vector<int64_t> fresh;
    auto test = generate(posenc::vision::load_fashion_mnist(false, data), 32, 2, &fresh);
    for (int64_t direction = 0; direction < 3; ++direction)
      for (int64_t n : fresh)
        if (test.direction[n].item<int64_t>() == direction) {
          posenc::video::write_video(out + "/new_" + names[direction] + ".avi", test.frames[n], 8);
          break;
        }
    std::cout << "posenc_make_test_clips: " << kept.size() << " clips in " << out << "/clips\n";
  } catch (const std::exception& e) {
    std::cerr << "posenc_make_test_clips: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
