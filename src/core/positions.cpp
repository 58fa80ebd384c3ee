// Positions: validation and builders. See include/posenc/core/positions.h for the contract.
#include "posenc/core/positions.h"

#include <torch/torch.h>

#include <set>
#include <sstream>

namespace posenc {

namespace {
std::string join(const std::vector<std::string>& names) {
  std::ostringstream out;
  for (size_t i = 0; i < names.size(); ++i) out << (i ? ", " : "") << names[i];
  return out.str();
}
}  // namespace

Positions::Positions(at::Tensor coords, std::vector<std::string> axes)
    : coords_(std::move(coords)), axes_(std::move(axes)) {
  TORCH_CHECK(coords_.defined(), "Positions: coords tensor is undefined");
  TORCH_CHECK(coords_.dim() == 2 || coords_.dim() == 3,
              "Positions: coords must be [N, A] or [B, N, A], got a tensor of shape ",
              coords_.sizes());
  TORCH_CHECK(at::isFloatingType(coords_.scalar_type()),
              "Positions: coords must be floating point (float32/float64), got ",
              coords_.scalar_type());
  TORCH_CHECK(!axes_.empty(), "Positions: at least one axis name is required");
  TORCH_CHECK(coords_.size(-1) == static_cast<int64_t>(axes_.size()), "Positions: coords have ",
              coords_.size(-1), " axes (last dim) but ", axes_.size(), " axis names were given (",
              join(axes_), ")");
  std::set<std::string> seen;
  for (const auto& name : axes_) {
    TORCH_CHECK(!name.empty(), "Positions: axis names must be non-empty");
    TORCH_CHECK(seen.insert(name).second, "Positions: duplicate axis name '", name, "'");
  }
  if (coords_.numel() > 0) {
    auto flat = coords_.flatten();
    auto bad = (~at::isfinite(flat)).nonzero();
    if (bad.size(0) > 0) {
      int64_t rest = bad[0][0].item<int64_t>();
      const double value = flat[rest].item<double>();
      std::vector<int64_t> index(coords_.dim());
      for (int64_t d = coords_.dim() - 1; d >= 0; --d) {
        index[d] = rest % coords_.size(d);
        rest /= coords_.size(d);
      }
      TORCH_CHECK(false, "Positions: coordinates must be finite, got ", value, " at index ",
                  at::IntArrayRef(index), " (", bad.size(0), " non-finite in all)");
    }
  }
}

Positions Positions::sequence(int64_t length, double offset, std::string axis) {
  TORCH_CHECK(length >= 0, "Positions::sequence: length must be >= 0, got ", length);
  auto coords = torch::arange(length, torch::kFloat64).add_(offset).unsqueeze(1);
  return Positions(coords, {std::move(axis)});
}

Positions Positions::values(const std::vector<double>& values, std::string axis) {
  auto coords = torch::tensor(values, torch::kFloat64).reshape({-1, 1});
  return Positions(coords, {std::move(axis)});
}

Positions Positions::grid(int64_t height, int64_t width) {
  TORCH_CHECK(height > 0 && width > 0, "Positions::grid: height and width must be positive, got ",
              height, " x ", width);
  auto rows = torch::arange(height, torch::kFloat64).repeat_interleave(width);
  auto cols = torch::arange(width, torch::kFloat64).repeat(height);
  return Positions(torch::stack({rows, cols}, 1), {"h", "w"});
}

Positions Positions::volume(int64_t frames, int64_t height, int64_t width) {
  TORCH_CHECK(frames > 0 && height > 0 && width > 0,
              "Positions::volume: frames, height and width must be positive, got ", frames, " x ",
              height, " x ", width);
  auto plane = grid(height, width).coords().repeat({frames, 1});  // [(t h w), 2]
  auto t = torch::arange(frames, torch::kFloat64).repeat_interleave(height * width).unsqueeze(1);
  return Positions(torch::cat({t, plane}, 1), {"t", "h", "w"});
}

int64_t Positions::size() const { return coords_.defined() ? coords_.size(-2) : 0; }

int64_t Positions::axis_index(const std::string& name) const {
  for (size_t i = 0; i < axes_.size(); ++i)
    if (axes_[i] == name) return static_cast<int64_t>(i);
  TORCH_CHECK(false, "Positions: no axis named '", name, "'; the axes are (", join(axes_), ")");
}

at::Tensor Positions::axis(int64_t index) const {
  TORCH_CHECK(index >= 0 && index < num_axes(), "Positions: axis index ", index,
              " out of range for ", num_axes(), " axes");
  return coords_.select(-1, index);
}

Positions Positions::to(c10::Device device) const {
  if (!coords_.defined() || coords_.device() == device) return *this;
  Positions moved = *this;
  moved.coords_ = coords_.to(device);
  return moved;
}

Positions Positions::shifted(double offset) const {
  TORCH_CHECK(std::isfinite(offset), "Positions::shifted: offset must be finite, got ", offset);
  return Positions(coords_ + offset, axes_);
}

double Positions::max() const {
  TORCH_CHECK(coords_.numel() > 0, "Positions::max: no positions");
  return coords_.max().item<double>();
}

std::string Positions::describe() const {
  std::ostringstream out;
  out << "Positions[";
  if (batched()) out << "B=" << coords_.size(0) << ", ";
  out << "N=" << size() << ", axes=(" << join(axes_) << ")]";
  return out.str();
}

void Positions::check_num_axes(const std::string& who, int64_t expected) const {
  TORCH_CHECK(defined(), who, ": positions are undefined");
  TORCH_CHECK(num_axes() == expected, who, ": expected positions with ", expected,
              expected == 1 ? " axis" : " axes", ", got ", num_axes(), " (", join(axes_), ")");
}

void Positions::check_integer_range(const std::string& who, int64_t limit) const {
  if (coords_.numel() == 0) return;
  auto non_integer = (coords_ != coords_.round()).nonzero();
  TORCH_CHECK(non_integer.size(0) == 0, who,
              ": positions must be integers for a lookup table, got ",
              coords_.flatten().index({(coords_ != coords_.round()).flatten()})[0].item<double>());
  const double lo = coords_.min().item<double>();
  const double hi = coords_.max().item<double>();
  TORCH_CHECK(lo >= 0, who, ": positions must be >= 0, got ", lo);
  TORCH_CHECK(hi < static_cast<double>(limit), who, ": position ", static_cast<int64_t>(hi),
              " is past the end of the table (max_positions=", limit, ", valid positions 0..",
              limit - 1, "); resize the table or use a relative encoder");
}

}  // namespace posenc
