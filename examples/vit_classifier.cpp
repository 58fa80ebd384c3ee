// Example (a ViT user): a Fashion-MNIST classifier with your own training loop, written against
// the installed library. Two position encoders through one interface: a learned patch table
// (learned_grid, as timm and HF ViT) and axial 2D RoPE (per-axis frequency ladders, as timm's
// RotaryEmbeddingCat). Then both are evaluated on larger images (28 px -> 42 px: a 6x6 patch grid
// instead of 4x4): the learned table is interpolated to the new grid, RoPE simply takes the new
// positions.
//
//   ./build/examples/example_vit_classifier [STEPS] [FASHION_MNIST_DIR]
//
// Patches: 7x7 pixels -> tokens [B, 16, 49] with Positions::grid(4, 4) (axes h, w).
#include <torch/torch.h>

#include <iomanip>
#include <iostream>

#include "posenc/posenc.h"
#include "vision/idx.h"
#include "vision/images.h"

using namespace posenc;

namespace {

constexpr int64_t kPatch = 7, kDim = 64, kHeads = 4;

// uint8 [N, 28, 28] -> float [N, 1, 28, 28] in [0, 1]
at::Tensor as_images(const at::Tensor& raw) { return raw.unsqueeze(1).to(torch::kFloat32) / 255; }

double accuracy(TokenClassifier& model, const at::Tensor& images, const at::Tensor& labels) {
  torch::NoGradGuard no_grad;
  model->eval();
  auto patches = vision::patchify(images, kPatch);  // tokens [N, G*G, 49], grid positions
  auto logits = model(patches.tokens, patches.positions);
  model->train();
  return logits.argmax(-1).eq(labels).to(torch::kFloat64).mean().item<double>();
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t steps = argc > 1 ? std::stoll(argv[1]) : 300;
  const std::string data = argc > 2 ? argv[2] : "/usr/share/datasets/fashion-mnist";
  use_all_cores();
  const auto train = vision::load_fashion_mnist(true, data);
  const auto test = vision::load_fashion_mnist(false, data);
  const int64_t n_test = 2000;
  auto test_images = as_images(test.images.narrow(0, 0, n_test));
  auto test_labels = test.labels.narrow(0, 0, n_test);
  auto large_images = vision::resize_images(test_images, 42, 42);  // a 6x6 patch grid

  // Head dim 16 = 8 rotary pairs: 4 for rows, 4 for columns, each with its own ladder.
  std::vector<std::pair<std::string, PositionalEncoding>> encoders{
      {"learned_grid", as_encoding(LearnedGrid(LearnedGridOptions(4, 4, kDim)))},
      {"axial_rope",
       as_encoding(Rope(RopeOptions(kDim / kHeads)
                            .sections(RopeSectionMap().sections({4, 4}))
                            .frequencies(RopeFrequencyOptions::per_axis_ladders(100))))}};
  for (auto& [name, encoder] : encoders) {
    torch::manual_seed(0);
    TokenClassifier model(TokenClassifierOptions(kPatch * kPatch, 10,
                                                 TransformerOptions(kDim, kHeads, 2).mlp_ratio(2)),
                          encoder);
    torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(2e-3));
    const int64_t batch = 128;
    for (int64_t step = 0; step < steps; ++step) {  // your loop: any schedule, any data order
      auto index = torch::randint(train.images.size(0), {batch}, torch::kLong);
      auto patches = vision::patchify(as_images(train.images.index_select(0, index)), kPatch);
      auto loss = torch::cross_entropy_loss(model(patches.tokens, patches.positions),
                                            train.labels.index_select(0, index));
      optimizer.zero_grad();
      loss.backward();
      optimizer.step();
    }
    const double at_28 = accuracy(model, test_images, test_labels);
    // Larger images: a learned table must be resampled to the new grid (bicubic, as timm);
    // rotary positions need nothing.
    if (auto* learned = model->transformer->encoder->as<LearnedGridImpl>()) learned->resize(6, 6);
    const double at_42 = accuracy(model, large_images, test_labels);
    std::cout << std::left << std::setw(13) << name << " after " << steps
              << " steps: test accuracy " << std::fixed << std::setprecision(3) << at_28
              << " at 28 px, " << at_42 << " at 42 px\n";
  }
  return 0;
}
