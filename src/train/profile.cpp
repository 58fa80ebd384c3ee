// The step profile; see profile.h.
#include "profile.h"

#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>

namespace posenc::train {

namespace {

namespace prof = torch::autograd::profiler;
namespace impl = torch::profiler::impl;

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

bool contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

// Categories named by posenc scopes, checked innermost first.
const char* scope_category(const std::string& name) {
  if (name == "posenc::data") return "data preparation (batch, flips, patchify)";
  if (name == "posenc::rotary") return "rotary (RoPE on q and k)";
  if (name == "posenc::clip") return "gradient clipping";
  if (name == "posenc::optimizer") return "optimizer step (AdamW)";
  if (name == "posenc::zero_grad") return "optimizer step (AdamW)";
  if (name == "posenc::allreduce") return "gradient all-reduce (data-parallel, after backward)";
  if (name == "posenc::ranks") return "ranks agreeing on the loss and on stopping";
  return nullptr;
}

// Categories named by op names (forward ops and their autograd nodes).
const char* op_category(const std::string& name) {
  if (contains(name, "Rope")) return "rotary (RoPE on q and k)";
  if (contains(name, "scaled_dot_product") || contains(name, "flash_attention") ||
      contains(name, "Attention"))
    return "attention (SDPA, fused kernel)";
  if (contains(name, "layer_norm") || contains(name, "LayerNorm")) return "layer norms";
  if (contains(name, "gelu") || contains(name, "Gelu")) return "GELU";
  if (contains(name, "cross_entropy") || contains(name, "log_softmax") ||
      contains(name, "LogSoftmax") || contains(name, "nll_loss") || contains(name, "NllLoss"))
    return "loss (cross-entropy)";
  if (contains(name, "addmm") || contains(name, "Addmm") || name == "aten::mm" ||
      contains(name, "MmBackward") || contains(name, "aten::linear") ||
      contains(name, "aten::matmul") || contains(name, "aten::bmm") ||
      contains(name, "BmmBackward"))
    return "matmuls (linear layers)";
  return nullptr;
}

constexpr const char* kOther = "other ops (residual adds, reshapes, copies, means)";
constexpr const char* kUnattributed =
    "outside ops (autograd engine, dispatch, allocator, loop, logging)";

struct Span {
  uint64_t begin, end;
  std::string name;
};

}  // namespace

std::string profile_category(const std::vector<std::string>& names) {
  for (const auto& n : names)
    if (const char* c = scope_category(n)) return c;
  for (const auto& n : names)
    if (const char* c = op_category(n)) return c;
  return kOther;
}

void StepProfiler::start() {
  TORCH_CHECK(!running_, "profile: the profiler is already running");
  // Kineto logs its start/stop and a failed GPU probe to stderr; keep the terminal for the table
  // (a user's own KINETO_LOG_LEVEL wins).
  setenv("KINETO_LOG_LEVEL", "5", /*overwrite=*/0);
  const impl::ProfilerConfig config(impl::ProfilerState::KINETO);
  const std::set<impl::ActivityType> activities{impl::ActivityType::CPU};
  prof::prepareProfiler(config, activities);
  prof::enableProfiler(config, activities);
  running_ = true;
  begin_ = now_seconds();
}

std::vector<ProfileRow> StepProfiler::stop(int64_t steps) {
  TORCH_CHECK(running_, "profile: stop() without start()");
  TORCH_CHECK(steps > 0, "profile: steps must be > 0, got ", steps);
  const double wall_ms = (now_seconds() - begin_) * 1e3;
  auto result = prof::disableProfiler();
  running_ = false;
  // Per thread: spans sorted by begin (outer first on ties), nested by a stack.
  std::map<uint64_t, std::vector<Span>> threads;
  for (const auto& e : result->events()) {
    if (e.deviceType() != c10::DeviceType::CPU || e.endNs() < e.startNs()) continue;
    threads[e.startThreadId()].push_back({e.startNs(), e.endNs(), e.name()});
  }
  std::map<std::string, double> ms;
  std::map<std::string, double> calls;
  std::map<std::string, std::pair<double, double>> op_ms;  // "op (category)" -> (ms, calls)
  double top_level_ms = 0;
  for (auto& [tid, spans] : threads) {
    std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
      return a.begin != b.begin ? a.begin < b.begin : a.end > b.end;
    });
    std::vector<size_t> stack;
    std::vector<double> child_ns(spans.size(), 0);
    auto close = [&](size_t i) {
      std::vector<std::string> names{spans[i].name};
      for (auto it = stack.rbegin(); it != stack.rend(); ++it) names.push_back(spans[*it].name);
      const auto category = profile_category(names);
      const double self = static_cast<double>(spans[i].end - spans[i].begin) - child_ns[i];
      ms[category] += std::max(0.0, self) * 1e-6;
      calls[category] += 1;
      auto& op = op_ms[spans[i].name + " (" + category + ")"];
      op.first += std::max(0.0, self) * 1e-6;
      op.second += 1;
    };
    for (size_t i = 0; i < spans.size(); ++i) {
      while (!stack.empty() && spans[stack.back()].end <= spans[i].begin) {
        const size_t done = stack.back();
        stack.pop_back();
        close(done);
      }
      const double dur = static_cast<double>(spans[i].end - spans[i].begin);
      if (!stack.empty())
        child_ns[stack.back()] += dur;
      else
        top_level_ms += dur * 1e-6;
      stack.push_back(i);
    }
    while (!stack.empty()) {
      const size_t done = stack.back();
      stack.pop_back();
      close(done);
    }
  }
  std::vector<ProfileRow> rows;
  const double per = 1.0 / static_cast<double>(steps);
  const double wall_step = wall_ms * per;
  for (const auto& [category, total] : ms)
    rows.push_back({category, total * per, total * per / wall_step, calls[category] * per});
  std::sort(rows.begin(), rows.end(),
            [](const ProfileRow& a, const ProfileRow& b) { return a.ms_per_step > b.ms_per_step; });
  const double outside = std::max(0.0, wall_ms - top_level_ms) * per;
  rows.push_back({kUnattributed, outside, outside / wall_step, 0});
  ops_.clear();
  for (const auto& [name, total] : op_ms)
    ops_.push_back({name, total.first * per, total.first * per / wall_step, total.second * per});
  std::sort(ops_.begin(), ops_.end(),
            [](const ProfileRow& a, const ProfileRow& b) { return a.ms_per_step > b.ms_per_step; });
  return rows;
}

std::vector<ProfileRow> StepProfiler::largest_ops(size_t count) const {
  return {ops_.begin(), ops_.begin() + static_cast<std::ptrdiff_t>(std::min(count, ops_.size()))};
}

std::string format_largest_ops(const std::vector<ProfileRow>& ops) {
  std::ostringstream out;
  out << "| largest ops (self time) | ms/step | share | calls/step |\n|---|---:|---:|---:|\n";
  char line[512];
  for (const auto& r : ops) {
    std::snprintf(line, sizeof line, "| %s | %.2f | %.1f%% | %.0f |\n", r.category.c_str(),
                  r.ms_per_step, 100 * r.share, r.calls_per_step);
    out << line;
  }
  return out.str();
}

std::string format_profile(const std::vector<ProfileRow>& rows, int64_t steps) {
  std::ostringstream out;
  double total = 0;
  for (const auto& r : rows) total += r.ms_per_step;
  out << "| part of the step (" << steps << " steps profiled) | ms/step | share | ops/step |\n"
      << "|---|---:|---:|---:|\n";
  char line[256];
  for (const auto& r : rows) {
    std::snprintf(line, sizeof line, "| %s | %.2f | %.1f%% | %.0f |\n", r.category.c_str(),
                  r.ms_per_step, 100 * r.share, r.calls_per_step);
    out << line;
  }
  std::snprintf(line, sizeof line, "| **step (wall)** | **%.2f** | 100%% | |\n", total);
  out << line;
  return out.str();
}

}  // namespace posenc::train
