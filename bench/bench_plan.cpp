// The position plan's cost (Google Benchmark): a transformer's forward + backward with one plan
// per forward (what Transformer does), against the same step with a plan built in every block
// (what each layer did before the plan: re-derive inv_freq, rebuild cos/sin, re-bucket T5
// offsets), and the position work alone (building the plan, and the fused kernel's bucket data).
//   lm_rope   configs/lm_gutenberg.yaml's model (D 64, 4 heads) with 4 layers, causal, RoPE,
//             batch 4 x 1024 tokens
//   lm_t5     the same with T5 buckets (the fused kernel's bias)
//   vit_rope  the main job's ViT (D 128, 4 heads, 4 layers, MLP 2x), 2D axial RoPE, batch 128 x
//             16 patches (a 4 x 4 grid)
//   ./build/bench/bench_plan --benchmark_min_time=1
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include "posenc/config/registry.h"
#include "posenc/posenc.h"
#include "ratio_reporter.h"

namespace {

using namespace posenc;

struct Model {
  Transformer stack{nullptr};
  at::Tensor x;
  Positions positions;
};

Model make(int which) {
  torch::manual_seed(0);
  Model m;
  if (which == 2) {  // the main job's ViT
    auto encoder =
        build_encoder(nlohmann::json::parse(
                          R"({"type": "rope", "mrope_section": [8, 8], "per_axis_frequencies": true,
                "rope_theta": 100})"),
                      {128, 4, 0});
    m.stack = Transformer(TransformerOptions(128, 4, 4).mlp_ratio(2), encoder);
    m.x = torch::randn({128, 16, 128});
    m.positions = Positions::grid(4, 4);
  } else {
    auto encoder = build_encoder(nlohmann::json{{"type", which == 0 ? "rope" : "t5"}}, {64, 4, 0});
    m.stack = Transformer(TransformerOptions(64, 4, 4).causal(true), encoder);
    m.x = torch::randn({4, 1024, 64});
    m.positions = Positions::sequence(1024);
  }
  return m;
}

Model& model(int which) {
  static Model models[3] = {make(0), make(1), make(2)};
  return models[which];
}

// One plan per forward (Transformer::forward).
void BM_StepOnePlan(benchmark::State& state) {
  auto& m = model(static_cast<int>(state.range(0)));
  for (auto _ : state) {
    m.stack->zero_grad();
    m.stack->forward(m.x, m.positions).sum().backward();
  }
}

// A plan in every block, as each layer recomputed its tables before.
void BM_StepPlanPerBlock(benchmark::State& state) {
  auto& m = model(static_cast<int>(state.range(0)));
  PlanRequest request(m.positions);
  for (auto _ : state) {
    m.stack->zero_grad();
    auto y = m.stack->encoder->plan(request).apply_additive(m.x);
    for (size_t i = 0; i < m.stack->blocks->size(); ++i)
      y = m.stack->blocks->at<TransformerBlockImpl>(i).forward(y, m.stack->encoder->plan(request));
    m.stack->norm(y).sum().backward();
  }
}

// The position work of one forward: the plan, and the fused kernel's bias data when it has one.
void BM_PositionWork(benchmark::State& state) {
  auto& m = model(static_cast<int>(state.range(0)));
  PlanRequest request(m.positions);
  for (auto _ : state) {
    auto plan = m.stack->encoder->plan(request);
    if (plan.has_bias()) benchmark::DoNotOptimize(plan.fused_bias());
    benchmark::DoNotOptimize(plan);
  }
}

BENCHMARK(BM_StepOnePlan)->DenseRange(0, 2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_StepPlanPerBlock)->DenseRange(0, 2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_PositionWork)->DenseRange(0, 2)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

int main(int argc, char** argv) {
  posenc::use_all_cores();
  return posenc::bench::run_with_ratios(argc, argv, [](posenc::bench::RatioReporter& r) {
    const char* names[3] = {"lm_rope 4x1024", "lm_t5 4x1024", "vit_rope 128x16"};
    for (int i = 0; i < 3; ++i) {
      const std::string id = "/" + std::to_string(i) + "/real_time";
      const double one = r.time("BM_StepOnePlan" + id), per = r.time("BM_StepPlanPerBlock" + id);
      const double work = r.time("BM_PositionWork" + id);
      if (one <= 0 || per <= 0 || work <= 0) continue;
      r.row(std::string(names[i]) + ": step, one plan / plan per block", one / per, "<= 1.00");
      r.percent(std::string(names[i]) + ": position work, one plan", work / one, "<= 2%");
      r.percent(std::string(names[i]) + ": position work, plan per block", 4 * work / per, "-");
    }
  });
}
