// train.precision (src/train/precision.h): bf16 is CPU autocast to bfloat16 in the training
// forward, allowed only where the CPU computes bfloat16 natively (AVX-512 BF16 or AMX-BF16 at
// posenc's avx512 level; posenc/kernels/cpu_capability.h). The rule apart from this CPU; the
// config's bad values as one line; and on this CPU either a bf16 run that trains (its loss falls,
// its losses are not float32's, its weights stay float32, summary.json and --profile say bf16) or
// the refusal, before the run folder exists. CTest runs these at the CPU's level (`unit`: on an
// AVX-512 BF16 machine the training branch) and with POSENC_CPU_CAPABILITY=avx2
// (`unit_precision_avx2`: the refusal branch on every CPU of ours). Reading a bf16 run is not
// training: its evaluation (posenc eval, evaluate_only) runs in float32 on every CPU and gives the
// run's own numbers (the CTest cli_eval_bf16_run_avx2 does it for a run trained in bf16).
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "posenc/config/registry.h"
#include "posenc/kernels/cpu_capability.h"
#include "posenc/train/trainer.h"
#include "support/fixtures.h"
#include "support/run_files.h"

namespace posenc::train {
namespace {

namespace fs = std::filesystem;

std::string temp_folder(const std::string& name) {
  auto path =
      fs::temp_directory_path() / ("posenc_precision_" + std::to_string(getpid()) + "_" + name);
  fs::remove_all(path);
  return path.string();
}

nlohmann::json smoke_vit(const std::string& precision) {
  auto config = load_config(std::string(POSENC_CONFIGS_DIR) + "/smoke/vit.yaml");
  config["train"]["precision"] = precision;
  return config;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST(Precision, Bf16NeedsNativeBf16AtTheAvx512Level) {
  EXPECT_EQ(bf16_unsupported_reason(CpuCapability::kAvx512, true), "");
  for (auto level : {CpuCapability::kScalar, CpuCapability::kAvx2, CpuCapability::kAvx512}) {
    EXPECT_NE(bf16_unsupported_reason(level, false).find("no native bfloat16"), std::string::npos)
        << to_string(level);
  }
  for (auto level : {CpuCapability::kScalar, CpuCapability::kAvx2}) {
    EXPECT_EQ(bf16_unsupported_reason(level, true),
              std::string("posenc's CPU level is ") + to_string(level) + ", not avx512");
  }
}

TEST(Precision, BadValuesAreOneLineErrors) {
  RunOptions options;
  options.output = temp_folder("bad");
  options.quiet = true;
  const auto unknown = test::error_of([&] { run_training(smoke_vit("fp16"), options); });
  EXPECT_EQ(unknown, "train: precision must be 'float32' or 'bf16', got 'fp16'");
  auto on_gpu = smoke_vit("bf16");
  on_gpu["train"]["device"] = "cuda";
  EXPECT_EQ(test::error_of([&] { run_training(on_gpu, options); }),
            "train: precision 'bf16' is CPU autocast; train.device must be 'cpu', got 'cuda'");
  EXPECT_FALSE(fs::exists(options.output));
}

// On a CPU with native bf16 at the avx512 level: the run trains in bf16. Elsewhere (or with
// POSENC_CPU_CAPABILITY=avx2): refused in one line naming why, nothing written.
TEST(Precision, Bf16TrainsWhereTheCpuHasItAndIsRefusedElsewhere) {
  RunOptions options;
  options.output = temp_folder("bf16");
  options.quiet = true;
  const auto why = bf16_unsupported_reason();
  if (!why.empty()) {
    const auto message = test::error_of([&] { run_training(smoke_vit("bf16"), options); });
    EXPECT_EQ(message,
              "train: precision 'bf16' needs a CPU with native bfloat16 (AVX-512 BF16 or AMX-BF16) "
              "at posenc's avx512 level, but " +
                  why + "; use precision: float32");
    EXPECT_EQ(message.find('\n'), std::string::npos);
    EXPECT_FALSE(fs::exists(options.output)) << "a refused run must write nothing";
    return;
  }
  const auto bf16 = run_training(smoke_vit("bf16"), options);
  ASSERT_TRUE(bf16.finished);
  const auto losses = train_losses(options.output);
  ASSERT_GE(losses.size(), 3u);
  EXPECT_LT(losses.back(), losses.front()) << "the bf16 training loss did not fall";
  EXPECT_TRUE(std::isfinite(metric_value(bf16.final_metrics, bf16.metric_name)));
  // master weights: float32 in weights.pt
  for (const auto& [name, tensor] : read_weights(options.output + "/weights.pt"))
    EXPECT_EQ(tensor.scalar_type(), at::kFloat) << name;
  const auto summary = nlohmann::json::parse(read_text(options.output + "/summary.json"));
  EXPECT_EQ(summary.at("precision"), "bf16");
  // the same run in float32 (same seed, data and order): the bf16 forward rounds, so the losses
  // differ (bf16 took effect) but stay close (the same model learning the same batches)
  RunOptions reference = options;
  reference.output = temp_folder("float32");
  run_training(smoke_vit("float32"), reference);
  const auto float_losses = train_losses(reference.output);
  ASSERT_EQ(float_losses.size(), losses.size());
  EXPECT_NE(float_losses, losses) << "bf16 gave float32's losses to the bit: autocast was off";
  for (size_t i = 0; i < losses.size(); ++i)
    EXPECT_NEAR(losses[i], float_losses[i], 0.1 * float_losses[i]) << "logged row " << i;
  EXPECT_EQ(nlohmann::json::parse(read_text(reference.output + "/summary.json")).at("precision"),
            "float32");
  // --profile names the precision beside the CPU level
  RunOptions profiled = options;
  profiled.output = temp_folder("profile");
  profiled.profile_steps = 2;
  run_training(smoke_vit("bf16"), profiled);
  EXPECT_NE(read_text(profiled.output + "/profile.md").find("; precision: bf16"),
            std::string::npos);
  for (const auto& folder : {options.output, reference.output, profiled.output})
    fs::remove_all(folder);
}

// Evaluating a bf16 run's weights works at every level (here also where bf16 training is refused):
// the evaluation is float32, so a config saying bf16 gives the numbers a float32 config gives for
// the same weights, to the bit, and those are the run's own final numbers.
TEST(Precision, Bf16RunEvaluatesOnEveryCpu) {
  RunOptions options;
  options.output = temp_folder("weights");
  options.quiet = true;
  const auto trained = run_training(smoke_vit("float32"), options);
  ASSERT_TRUE(trained.finished);
  const auto weights = options.output + "/weights.pt";
  RunOptions eval_options = options;
  eval_options.output = temp_folder("eval_bf16");
  const auto as_bf16 = run_evaluation(smoke_vit("bf16"), eval_options, weights);
  ASSERT_TRUE(as_bf16.finished);
  ASSERT_FALSE(as_bf16.final_metrics.empty());
  EXPECT_EQ(as_bf16.final_metrics, trained.final_metrics);
  ASSERT_EQ(as_bf16.generalization.size(), trained.generalization.size());
  for (size_t i = 0; i < trained.generalization.size(); ++i)
    EXPECT_EQ(as_bf16.generalization[i].metrics, trained.generalization[i].metrics) << i;
  EXPECT_EQ(nlohmann::json::parse(read_text(eval_options.output + "/summary.json")).at("precision"),
            "bf16");
  // evaluate_only: the same, through run_training
  auto evaluate_only = smoke_vit("bf16");
  evaluate_only["evaluate_only"] = true;
  evaluate_only["init_from"] = weights;
  RunOptions only_options = options;
  only_options.output = temp_folder("evaluate_only");
  EXPECT_EQ(run_training(evaluate_only, only_options).final_metrics, trained.final_metrics);
  // a value that is neither is refused when reading too
  EXPECT_EQ(test::error_of([&] { run_evaluation(smoke_vit("fp16"), eval_options, weights); }),
            "train: precision must be 'float32' or 'bf16', got 'fp16'");
  for (const auto& folder : {options.output, eval_options.output, only_options.output})
    fs::remove_all(folder);
}

}  // namespace
}  // namespace posenc::train
