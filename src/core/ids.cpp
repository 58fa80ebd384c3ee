// Integer ids beside positions (variate, sample) and their checks; see posenc/core/ids.h.
#include "posenc/core/ids.h"

#include <torch/torch.h>

#include <map>
#include <sstream>
#include <utility>

namespace posenc {

std::string index_text(int64_t flat, at::IntArrayRef sizes) {
  std::vector<int64_t> index(sizes.size());
  for (int64_t d = static_cast<int64_t>(sizes.size()) - 1; d >= 0; --d) {
    index[d] = sizes[d] > 0 ? flat % sizes[d] : 0;
    flat = sizes[d] > 0 ? flat / sizes[d] : 0;
  }
  std::ostringstream out;
  out << "[";
  for (size_t d = 0; d < index.size(); ++d) out << (d ? ", " : "") << index[d];
  out << "]";
  return out.str();
}

at::Tensor checked_ids(const at::Tensor& ids, const std::string& name, int64_t limit) {
  TORCH_CHECK_VALUE(ids.defined(), name, ": missing");
  TORCH_CHECK_VALUE(ids.dim() == 1 || ids.dim() == 2, name, ": expected [N] or [B, N], got shape ",
                    ids.sizes());
  TORCH_CHECK_VALUE(!ids.is_complex() && ids.scalar_type() != torch::kBool, name,
                    ": expected integer ids, got dtype ", ids.scalar_type());
  if (ids.numel() == 0) return ids.to(torch::kLong);
  auto flat = ids.detach().to(torch::kCPU).contiguous().view(-1);
  if (ids.is_floating_point()) {
    auto values = flat.to(torch::kDouble);
    auto bad = (~values.isfinite() | (values != values.round())).nonzero();
    TORCH_CHECK_VALUE(bad.size(0) == 0, name, ": ", values[bad[0][0]].item<double>(), " at index ",
                      index_text(bad[0][0].item<int64_t>(), ids.sizes()), " is not an integer");
    // beyond 2^53 a double no longer holds every integer: refuse rather than alias two ids
    auto huge = (values.abs() > 9007199254740992.0).nonzero();
    TORCH_CHECK_VALUE(huge.size(0) == 0, name, ": ", values[huge[0][0]].item<double>(),
                      " at index ", index_text(huge[0][0].item<int64_t>(), ids.sizes()),
                      " is beyond 2^53");
  }
  auto as_long = flat.to(torch::kLong);
  auto out_of_range = as_long < 0;
  if (limit > 0) out_of_range = out_of_range | (as_long >= limit);
  auto bad = out_of_range.nonzero();
  TORCH_CHECK_VALUE(bad.size(0) == 0, name, ": id ", as_long[bad[0][0]].item<int64_t>(),
                    " at index ", index_text(bad[0][0].item<int64_t>(), ids.sizes()),
                    " is outside [0, ", limit > 0 ? std::to_string(limit) : std::string("inf"),
                    ")");
  return as_long.view(ids.sizes()).to(ids.device());
}

at::Tensor checked_sample_ids(const at::Tensor& ids, const std::string& name) {
  auto out = checked_ids(ids, name);
  auto rows = out.to(torch::kCPU).contiguous().view({-1, out.size(-1)});
  auto a = rows.accessor<int64_t, 2>();
  for (int64_t b = 0; b < rows.size(0); ++b) {
    std::map<int64_t, int64_t> ended;  // sample id -> where its run ended
    for (int64_t n = 1; n < rows.size(1); ++n) {
      if (a[b][n] == a[b][n - 1]) continue;
      ended[a[b][n - 1]] = n;
      TORCH_CHECK_VALUE(ended.count(a[b][n]) == 0, name, ": sample ", a[b][n],
                        " is not one contiguous run (it resumes at index ",
                        index_text(b * rows.size(1) + n, out.sizes()), ")");
    }
  }
  return out;
}

void check_times_per_sample(const at::Tensor& times, const at::Tensor& sample_ids,
                            const at::Tensor& variate_ids, const std::string& name) {
  TORCH_CHECK_VALUE(times.sizes() == sample_ids.sizes() && times.sizes() == variate_ids.sizes(),
                    name, ": expected the shape of the ids ", sample_ids.sizes(), ", got ",
                    times.sizes());
  if (times.numel() == 0) return;
  const int64_t n = times.size(-1);
  auto t = times.detach().to(torch::kCPU, torch::kDouble).contiguous().view({-1, n});
  auto s = sample_ids.to(torch::kCPU, torch::kLong).contiguous().view({-1, n});
  auto v = variate_ids.to(torch::kCPU, torch::kLong).contiguous().view({-1, n});
  auto ta = t.accessor<double, 2>();
  auto sa = s.accessor<int64_t, 2>();
  auto va = v.accessor<int64_t, 2>();
  for (int64_t b = 0; b < t.size(0); ++b) {
    std::map<std::pair<int64_t, int64_t>, double> last;  // (sample, variate) -> latest time
    for (int64_t i = 0; i < n; ++i) {
      TORCH_CHECK_VALUE(std::isfinite(ta[b][i]), name, ": ", ta[b][i], " at index ",
                        index_text(b * n + i, times.sizes()), " is not finite");
      const auto key = std::make_pair(sa[b][i], va[b][i]);
      auto it = last.find(key);
      TORCH_CHECK_VALUE(it == last.end() || ta[b][i] >= it->second, name,
                        ": time goes backwards at index ", index_text(b * n + i, times.sizes()),
                        " (", ta[b][i], " after ", it->second, " in sample ", key.first,
                        ", variate ", key.second, ")");
      last[key] = ta[b][i];
    }
  }
}

}  // namespace posenc
