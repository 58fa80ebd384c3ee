// Example (a multimodal prototyper): one stream of video tubelets and caption bytes, joined the
// way Qwen2-VL joins them (build_stream: the video's (t, h, w) grid, then text whose positions
// resume after it on all three axes), scored by a small transformer: does the caption describe
// the clip? Clips are moving Fashion-MNIST items ("a sneaker moves left"); the negative caption
// names the same item moving another way, so only the motion (the t axis) tells them apart.
// Two encoders act at once, each where it belongs: rotary M-RoPE over the stream inside the
// joint attention (per-axis frequency ladders), and an additive sinusoidal table on the caption
// bytes before the join.
//
//   ./build/examples/example_text_video_fusion [STEPS] [FASHION_MNIST_DIR]
#include <torch/torch.h>

#include <iomanip>
#include <iostream>

#include "posenc/posenc.h"
#include "video/moving_fashion.h"
#include "video/video.h"
#include "vision/idx.h"

using namespace posenc;

namespace {

constexpr int64_t kCaption = 24, kDim = 64, kHeads = 4;

// Captions -> bytes [B, kCaption] and a mask of real bytes.
std::pair<at::Tensor, at::Tensor> encode(const std::vector<std::string>& captions) {
  const auto b = static_cast<int64_t>(captions.size());
  auto bytes = torch::zeros({b, kCaption}, torch::kLong);
  auto real = torch::zeros({b, kCaption}, torch::kBool);
  for (int64_t i = 0; i < b; ++i) {
    const auto& c = captions[static_cast<size_t>(i)];
    for (int64_t j = 0; j < std::min<int64_t>(kCaption, c.size()); ++j) {
      bytes[i][j] = static_cast<int64_t>(static_cast<unsigned char>(c[j]));
      real[i][j] = true;
    }
  }
  return {bytes, real};
}

// The same item moving another way: "a sneaker moves left" -> "a sneaker moves up".
std::string other_direction(const std::string& caption, int64_t pick) {
  const auto& names = video::MovingClips::direction_names(4);
  const auto stem = caption.substr(0, caption.rfind(' ') + 1);
  const auto own = caption.substr(caption.rfind(' ') + 1);
  std::vector<std::string> others;
  for (const auto& n : names)
    if (n != own) others.push_back(n);
  return stem + others[static_cast<size_t>(pick % static_cast<int64_t>(others.size()))];
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t steps = argc > 1 ? std::stoll(argv[1]) : 300;
  const std::string data = argc > 2 ? argv[2] : "/usr/share/datasets/fashion-mnist";
  use_all_cores();
  torch::manual_seed(0);
  const auto items = vision::load_fashion_mnist(false, data);
  video::MovingOptions moving;  // 8 frames of 32 x 32
  auto clips = video::generate_moving_clips(items, 1024, moving);
  auto tubelets = video::tubeletize(clips.frames, 2, 8);  // [N, 4*4*4, 2*8*8], (t, h, w) positions
  const auto grid = tubelets.positions;                   // Positions::volume(4, 4, 4)
  auto layout = build_stream({Segment::video(4, 4, 4), Segment::text(kCaption)});

  // Head dim 16 = 8 rotary pairs: 2 for t, 3 for h, 3 for w, each axis its own ladder.
  auto stream_rope =
      as_encoding(Rope(RopeOptions(kDim / kHeads)
                           .sections(RopeSectionMap().sections({2, 3, 3}))
                           .frequencies(RopeFrequencyOptions::per_axis_ladders(100))));
  auto text_table = as_encoding(Sinusoidal(SinusoidalOptions(kDim)));
  TextVideoMatcher model(TextVideoMatcherOptions(tubelets.tokens.size(2),
                                                 TransformerOptions(kDim, kHeads, 2).mlp_ratio(2)),
                         stream_rope, text_table);
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(2e-3));

  const int64_t train_clips = 896, batch = 32;
  auto batch_input = [&](const at::Tensor& index, bool negative, int64_t salt) {
    std::vector<std::string> captions;
    for (int64_t i = 0; i < index.size(0); ++i) {
      const auto& truth = clips.captions[static_cast<size_t>(index[i].item<int64_t>())];
      captions.push_back(negative ? other_direction(truth, salt + i) : truth);
    }
    auto [bytes, real] = encode(captions);
    MatchInput input;
    input.video = tubelets.tokens.index_select(0, index);
    input.video_positions = grid;
    input.text = bytes;
    input.text_padding = real;
    input.text_positions = Positions::sequence(kCaption);
    input.stream_positions = layout.positions;  // [64 + 24, 3] (t, h, w)
    return input;
  };
  for (int64_t step = 0; step < steps; ++step) {
    auto index = torch::randint(train_clips, {batch}, torch::kLong);
    auto positive = model(batch_input(index, false, step));
    auto negative = model(batch_input(index, true, step));
    auto scores = torch::cat({positive, negative});
    auto labels = torch::cat({torch::ones({batch}), torch::zeros({batch})});
    auto loss = torch::binary_cross_entropy_with_logits(scores, labels);
    optimizer.zero_grad();
    loss.backward();
    optimizer.step();
  }
  torch::NoGradGuard no_grad;
  model->eval();
  auto held_out = torch::arange(train_clips, 1024, torch::kLong);
  auto right = model(batch_input(held_out, false, 7)) > model(batch_input(held_out, true, 7));
  std::cout << "text_video_fusion after " << steps << " steps: the true caption outscores the "
            << "wrong direction on " << std::fixed << std::setprecision(1)
            << 100.0 * right.to(torch::kFloat64).mean().item<double>() << "% of "
            << held_out.size(0) << " held-out clips (chance 50%)\n";
  return 0;
}
