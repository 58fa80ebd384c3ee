// Uses the installed posenc: rotate with RoPE, read ALiBi slopes.
#include <posenc/posenc.h>
#include <torch/torch.h>

#include <iostream>

int main() {
  posenc::Rope rope(posenc::RopeOptions(8));
  auto q = torch::ones({1, 3, 2, 8});
  auto [rq, rk] =
      rope->rotate(q, q, posenc::Positions::sequence(3), posenc::Positions::sequence(3));
  auto slopes = posenc::alibi_slopes(2);
  std::cout << "consumer: rope rotated " << rq.size(1) << " positions; alibi slopes " << slopes[0]
            << " " << slopes[1] << std::endl;
  return rq.sizes() == q.sizes() ? 0 : 1;
}
