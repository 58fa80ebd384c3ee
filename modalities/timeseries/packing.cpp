// Patch positions with a left-pad shift, and packing samples into rows; see packing.h.
#include "timeseries/packing.h"

#include <torch/torch.h>

#include "posenc/core/ids.h"

namespace posenc::timeseries {

at::Tensor left_padded_positions(const at::Tensor& num_padded, int64_t n) {
  TORCH_CHECK(n >= 0, "left_padded_positions: n must be >= 0, got ", n);
  TORCH_CHECK(num_padded.defined() && num_padded.dim() == 1,
              "left_padded_positions: num_padded must be [B], got ",
              num_padded.defined() ? num_padded.sizes() : at::IntArrayRef{});
  auto padded = checked_ids(num_padded, "num_padded", n + 1).to(torch::kCPU);
  // position_ids = arange(n) - num_padded[:, None]  (TimesFM 2.5)
  return torch::arange(n, torch::kFloat64).unsqueeze(0) - padded.to(torch::kFloat64).unsqueeze(1);
}

PackedBatch pack_samples(const std::vector<PackSample>& samples, int64_t max_tokens) {
  TORCH_CHECK(max_tokens >= 1, "pack_samples: max_tokens must be >= 1, got ", max_tokens);
  TORCH_CHECK(!samples.empty(), "pack_samples: no samples");
  const int64_t width = samples.front().tokens.defined() && samples.front().tokens.dim() == 2
                            ? samples.front().tokens.size(1)
                            : -1;
  PackedBatch out;
  int64_t rows = 0, used = max_tokens;  // tokens used in the current row (full: open one)
  for (size_t s = 0; s < samples.size(); ++s) {
    const auto& sample = samples[s];
    const std::string who = "pack_samples: sample " + std::to_string(s);
    TORCH_CHECK(
        sample.tokens.defined() && sample.tokens.dim() == 2 && sample.tokens.size(1) == width, who,
        ": tokens must be [n, ", width, "], got ",
        sample.tokens.defined() ? sample.tokens.sizes() : at::IntArrayRef{});
    const int64_t n = sample.tokens.size(0);
    TORCH_CHECK(n >= 1 && n <= max_tokens, who, " has ", n, " tokens; a row holds 1 to ",
                max_tokens);
    for (const auto* part : {&sample.time, &sample.variate, &sample.observed})
      TORCH_CHECK(part->defined() && part->dim() == 1 && part->size(0) == n, who,
                  ": time, variate and observed must be [", n, "]");
    // an observed reading must be finite: a NaN or inf key reaches the other samples of its row
    // (a masked key still enters the attention's tile: 0 * NaN = NaN, as in SDPA with the mask);
    // a token to predict may hold anything (the model reads its place, never its value)
    auto values = sample.tokens.detach().to(torch::kCPU).reshape({-1});
    auto observed = sample.observed.to(torch::kCPU, torch::kBool).unsqueeze(1);
    auto bad = (~values.isfinite().view({n, width}) & observed).view(-1).nonzero();
    TORCH_CHECK(bad.size(0) == 0, who, " tokens: ", values[bad[0][0]].item<double>(), " at index ",
                index_text(bad[0][0].item<int64_t>(), {n, width}),
                " is not finite (an observed reading; mark the token observed = false, or drop "
                "the reading)");
    auto variate = checked_ids(sample.variate, who + " variate");
    check_times_per_sample(sample.time, torch::zeros({n}, torch::kLong), variate, who + " time");
    if (used + n > max_tokens) {
      ++rows;
      used = 0;
    }
    out.row.push_back(rows - 1);
    out.offset.push_back(used);
    used += n;
  }
  const int64_t b = rows, l = max_tokens;
  out.tokens = torch::zeros({b, l, width}, torch::kFloat32);
  auto coords = torch::zeros({b, l, 2}, torch::kFloat64);
  out.sample_ids = torch::zeros({b, l}, torch::kLong);
  out.real = torch::zeros({b, l}, torch::kBool);
  out.observed = torch::zeros({b, l}, torch::kBool);
  std::vector<int64_t> next_id(static_cast<size_t>(b), 0), end(static_cast<size_t>(b), 0);
  for (size_t s = 0; s < samples.size(); ++s) {
    const auto& sample = samples[s];
    const int64_t r = out.row[s], o = out.offset[s], n = sample.tokens.size(0);
    out.tokens[r].narrow(0, o, n).copy_(sample.tokens);
    coords[r].narrow(0, o, n).select(1, 0).copy_(sample.time);
    coords[r].narrow(0, o, n).select(1, 1).copy_(sample.variate);
    out.sample_ids[r].narrow(0, o, n).fill_(next_id[r]++);
    out.real[r].narrow(0, o, n).fill_(true);
    out.observed[r].narrow(0, o, n).copy_(sample.observed.to(torch::kBool));
    end[r] = o + n;
  }
  for (int64_t r = 0; r < b; ++r)  // the rest of a row: one padding run of its own id
    if (end[r] < l) out.sample_ids[r].narrow(0, end[r], l - end[r]).fill_(next_id[r]);
  out.positions = Positions(coords, {"time", "variate"});
  return out;
}

}  // namespace posenc::timeseries
