// Example: why positions matter. One self-attention layer reads "the dog bit the man" and
// "the man bit the dog"; we print how different the two mean-pooled outputs are for each
// encoder. Without positions the difference is 0 (attention is permutation invariant).
//
//   ./build/examples/example_dog_bit_man
#include <torch/torch.h>

#include <iomanip>
#include <iostream>

#include "posenc/posenc.h"

using namespace posenc;

int main() {
  use_all_cores();
  const int64_t dim = 16, heads = 2;
  const std::vector<std::pair<std::string, PositionalEncoding>> encoders{
      {"nope", as_encoding(Nope())},
      {"sinusoidal", as_encoding(Sinusoidal(SinusoidalOptions(dim)))},
      {"learned", as_encoding(Learned(LearnedOptions(16, dim).init_std(1.0)))},
      {"rope", as_encoding(Rope(RopeOptions(dim / heads)))},
      {"t5", as_encoding(T5(T5Options(heads).init_std(1.0)))},
      {"shaw", as_encoding(Shaw(ShawOptions(dim / heads).init_std(1.0)))},
      {"alibi", as_encoding(Alibi(AlibiOptions(heads).form(AlibiForm::kSymmetric)))}};
  torch::NoGradGuard no_grad;
  for (auto [name, encoder] : encoders) {
    torch::manual_seed(0);
    auto embedding = torch::randn({4, dim});  // the, dog, bit, man
    SelfAttention attention(AttentionOptions(dim, heads), encoder);
    auto positions = Positions::sequence(5);
    auto summary = [&](std::vector<int64_t> ids) {
      auto x = encoder->add(embedding.index_select(0, torch::tensor(ids)).unsqueeze(0), positions);
      return attention->forward(x, positions).mean(1);
    };
    const double difference =
        (summary({0, 1, 2, 0, 3}) - summary({0, 3, 2, 0, 1})).abs().max().item<double>();
    std::cout << std::left << std::setw(12) << name << " max |summary(dog bit man) - "
              << "summary(man bit dog)| = " << std::scientific << std::setprecision(2) << difference
              << "\n";
  }
}
