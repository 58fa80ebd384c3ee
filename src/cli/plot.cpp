// `posenc plot`: additive encoders as a positions x dimensions heatmap (the classic sinusoidal
// picture) or, with --similarity-to, each position's cosine similarity to one position; rotary
// encoders as their cos table; bias encoders as one Nq x Nk map per head.
#include <torch/torch.h>

#include <iostream>

#include "../draw/heatmap.h"
#include "cli.h"
#include "posenc/posenc.h"

namespace posenc::cli {

using draw::Figure;
using draw::write_heatmap_png;

namespace {

// Shaw's bias depends on q: drawn for unit queries q = (1, ..., 1) / sqrt(Dh), one head
// (broadcast over the heads of any other bias part).
at::Tensor probe_queries(const EncodingPlan& plan, int64_t n) {
  for (const auto& spec : plan.bias_specs()) {
    if (spec.form != BiasForm::kRelativeTable) continue;
    const int64_t dh = spec.table.size(1);
    return torch::ones({1, n, 1, dh}) / std::sqrt(static_cast<double>(dh));
  }
  TORCH_CHECK(plan.num_query_biases() == 0,
              "plot: a query-dependent bias on batched positions cannot be drawn");
  return {};
}

// The additive part as a positions x dimensions table, or each position's cosine similarity to
// one position (a full h x w grid drawn as the grid, the picture ViT papers show).
void additive_panels(Figure& figure, const EncodingPlan& plan, const Positions& positions,
                     int64_t reference, bool alone) {
  auto table = plan.embedding().detach();
  const int64_t n = positions.size();
  if (reference < 0) {
    if (alone) {
      figure.x_label = "dimension";
      figure.y_label = "position (row index)";
    }
    figure.panels.push_back({table, alone ? "" : "additive: position x dimension"});
    return;
  }
  TORCH_CHECK(reference < n, "--similarity-to ", reference, " is out of range for ", n,
              " positions");
  auto normed = torch::nn::functional::normalize(
      table.to(torch::kFloat64), torch::nn::functional::NormalizeFuncOptions().dim(-1));
  auto similarity = normed.matmul(normed[reference]);  // [N]
  figure.title += ", cosine similarity to position " + std::to_string(reference);
  const auto& c = positions.coords();
  const bool grid = positions.num_axes() == 2 && !positions.batched() &&
                    at::equal(c, Positions::grid(c.select(1, 0).max().item<int64_t>() + 1,
                                                 c.select(1, 1).max().item<int64_t>() + 1)
                                     .coords());
  if (grid) {
    const int64_t h = c.select(1, 0).max().item<int64_t>() + 1;
    if (alone) {
      figure.x_label = "w (patch column)";
      figure.y_label = "h (patch row)";
    }
    figure.panels.push_back({similarity.view({h, -1}), alone ? "" : "additive: similarity"});
  } else {
    if (alone) {
      figure.x_label = "position";
      figure.y_label = "";
    }
    figure.panels.push_back({similarity.unsqueeze(0), alone ? "" : "additive: similarity"});
  }
}

}  // namespace

// Draws what the plan holds: the additive table, the rotary cos table, the bias per head; a
// composite gets one panel per part, each titled with what it shows.
int run_plot(const EncoderArgs& args, const std::string& out, int64_t reference) {
  auto encoder = build_from_args(args);
  auto request = parse_plan_request(args.positions, args.axes);
  const auto& positions = request.queries;
  torch::NoGradGuard no_grad;
  auto plan = encoder->plan(request);
  const int64_t n = positions.size();
  std::string roles;
  for (const auto& part : plan.parts())
    roles += (roles.empty() ? "" : ", ") + part.encoder + " " + part.role;
  TORCH_CHECK(!plan.parts().empty(), "plot: '", encoder->type(),
              "' adds no positional information; nothing to draw");
  const int present = int(plan.has_additive()) + int(plan.has_rotary()) + int(plan.has_bias());
  const bool alone = present == 1;
  Figure figure;
  figure.title = encoder->type() + " (" + roles + "), " + std::to_string(n) + " positions";
  if (!alone) {
    figure.x_label = "column index";
    figure.y_label = "row index";
  }
  if (plan.has_additive()) additive_panels(figure, plan, positions, reference, alone);
  if (plan.has_rotary()) {
    auto cos = plan.rotary().q_cos.detach().cpu();
    if (alone) {
      figure.title += ", cos table";
      figure.x_label = "rotary dimension";
      figure.y_label = "position (row index)";
    }
    if (plan.rotary().per_head) {  // [N, H, F] (RoPE-Mixed)
      for (int64_t h = 0; h < cos.size(1); ++h)
        figure.panels.push_back({cos.select(1, h), "head " + std::to_string(h)});
    } else {
      if (cos.dim() == 3) cos = cos[0];  // batched positions: the first sequence
      figure.panels.push_back({cos, alone ? "" : "rotary: cos, position x pair"});
    }
  }
  if (plan.has_bias()) {
    auto bias = plan.materialize_bias(-1, probe_queries(plan, n)).detach().cpu();
    if (bias.dim() == 4) bias = bias[0];
    if (alone) {
      figure.title += ", bias per head";
      figure.x_label = "key (column index)";
      figure.y_label = "query (row index)";
    }
    const int64_t heads = std::min<int64_t>(bias.size(0), 16);
    for (int64_t h = 0; h < heads; ++h)
      figure.panels.push_back(
          {bias[h], (alone ? "" : "bias: ") + std::string("head ") + std::to_string(h)});
  }
  write_heatmap_png(figure, out);
  std::cerr << "posenc: wrote " << out << "\n";
  return 0;
}

}  // namespace posenc::cli
