// `posenc plot`: additive encoders as a positions x dimensions heatmap (the classic sinusoidal
// picture) or, with --similarity-to, each position's cosine similarity to one position; rotary
// encoders as their cos table; bias encoders as one Nq x Nk map per head.
#include <torch/torch.h>

#include <iostream>

#include "cli.h"
#include "heatmap.h"
#include "posenc/posenc.h"

namespace posenc::cli {

namespace {

// Shaw's bias depends on q: draw it for unit queries q = (1, ..., 1) / sqrt(Dh), one head.
at::Tensor shaw_probe_queries(const PositionalEncodingImpl& encoder, int64_t n) {
  const int64_t dh = encoder.bias_spec().table.size(1);
  return torch::ones({1, n, 1, dh}) / std::sqrt(static_cast<double>(dh));
}

at::Tensor find(const Description& description, const std::string& name) {
  for (const auto& [key, value] : description)
    if (key == name) return value;
  TORCH_CHECK(false, "plot: the encoder describes no '", name, "'");
}

}  // namespace

int run_plot(const EncoderArgs& args, const std::string& out, int64_t reference) {
  auto encoder = build_from_args(args);
  auto positions = parse_positions(args.positions, args.axes);
  torch::NoGradGuard no_grad;
  DescribeOptions options;
  options.seq_len = args.seq_len;
  auto description = encoder->describe(positions, options);
  const int64_t n = positions.size();
  Figure figure;
  figure.title = encoder->type() + " (" + to_string(encoder->kind()) + "), " + std::to_string(n) +
                 " positions";
  switch (encoder->kind()) {
    case EncodingKind::kAdditive: {
      auto table = find(description, "table");
      if (reference >= 0) {
        TORCH_CHECK(reference < n, "--similarity-to ", reference, " is out of range for ", n,
                    " positions");
        auto normed = torch::nn::functional::normalize(
            table.to(torch::kFloat64), torch::nn::functional::NormalizeFuncOptions().dim(-1));
        auto similarity = normed.matmul(normed[reference]);  // [N]
        figure.title += ", cosine similarity to position " + std::to_string(reference);
        // A full h x w grid is drawn as the grid (the picture ViT papers show).
        const auto& c = positions.coords();
        const bool grid = positions.num_axes() == 2 && !positions.batched() &&
                          at::equal(c, Positions::grid(c.select(1, 0).max().item<int64_t>() + 1,
                                                       c.select(1, 1).max().item<int64_t>() + 1)
                                           .coords());
        if (grid) {
          const int64_t h = c.select(1, 0).max().item<int64_t>() + 1;
          figure.x_label = "w (patch column)";
          figure.y_label = "h (patch row)";
          figure.panels.push_back({similarity.view({h, -1}), ""});
        } else {
          figure.x_label = "position";
          figure.y_label = "";
          figure.panels.push_back({similarity.unsqueeze(0), ""});
        }
      } else {
        figure.x_label = "dimension";
        figure.y_label = "position (row index)";
        figure.panels.push_back({table, ""});
      }
      break;
    }
    case EncodingKind::kRotary:
      figure.title += ", cos table";
      figure.x_label = "rotary dimension";
      figure.y_label = "position (row index)";
      if (auto cos = find(description, "cos"); cos.dim() == 3) {  // per head (RoPE-Mixed)
        for (int64_t h = 0; h < cos.size(1); ++h) {
          figure.panels.push_back({cos.select(1, h), "head " + std::to_string(h)});
        }
      } else {
        figure.panels.push_back({cos, ""});
      }
      break;
    case EncodingKind::kBias: {
      auto bias = encoder->bias(positions, positions,
                                encoder->bias_spec().form == BiasForm::kRelativeTable
                                    ? shaw_probe_queries(*encoder, n)
                                    : at::Tensor());
      if (bias.dim() == 4) bias = bias[0];
      figure.title += ", bias per head";
      figure.x_label = "key (column index)";
      figure.y_label = "query (row index)";
      const int64_t heads = std::min<int64_t>(bias.size(0), 16);
      for (int64_t h = 0; h < heads; ++h)
        figure.panels.push_back({bias[h], "head " + std::to_string(h)});
      break;
    }
    case EncodingKind::kNone:
      TORCH_CHECK(false, "plot: '", encoder->type(),
                  "' adds no positional information; nothing to draw");
  }
  write_heatmap_png(figure, out);
  std::cerr << "posenc: wrote " << out << "\n";
  return 0;
}

}  // namespace posenc::cli
