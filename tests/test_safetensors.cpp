// safetensors (posenc/train/safetensors.h): tensors of every dtype posenc writes come back equal,
// with the metadata; each integrity rule is one line naming the file (truncated, header past the
// end, offsets outside the data or not matching the shape, a gap, a flipped data byte against
// the checksum); a trained run's weights.safetensors evaluates to the numbers of its weights.pt.
// (Python's safetensors.torch.load_file reading posenc's file: tests/timm_export_check.py.)
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "posenc/config/registry.h"
#include "posenc/train/checkpoint.h"
#include "posenc/train/safetensors.h"
#include "posenc/train/trainer.h"
#include "support/fixtures.h"

namespace posenc::train {
namespace {

namespace fs = std::filesystem;

std::string temp_path(const std::string& name) {
  auto dir = fs::temp_directory_path() / ("posenc_safetensors_" + std::to_string(getpid()));
  fs::create_directories(dir);
  return (dir / name).string();
}

NamedTensors sample() {
  torch::manual_seed(3);
  return {{"w", torch::randn({3, 4})},
          {"d", torch::randn({2}, torch::kDouble)},
          {"h", torch::randn({5}).to(torch::kHalf)},
          {"b", torch::randn({2, 2}).to(torch::kBFloat16)},
          {"i", torch::arange(6, torch::kLong).view({2, 3})},
          {"u", torch::arange(4, torch::kByte)},
          {"mask", torch::tensor({true, false})},
          {"empty", torch::zeros({0, 3})},
          {"noncontiguous", torch::randn({4, 3}).t()}};
}

TEST(Safetensors, EveryDtypeRoundTripsWithMetadata) {
  const auto path = temp_path("round.safetensors");
  const auto tensors = sample();
  write_safetensors(path, tensors, {{"format", "pt"}});
  std::map<std::string, std::string> metadata;
  const auto back = read_safetensors(path, &metadata);
  ASSERT_EQ(back.size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    EXPECT_EQ(back[i].first, tensors[i].first);
    EXPECT_TRUE(torch::equal(back[i].second, tensors[i].second)) << tensors[i].first;
    EXPECT_EQ(back[i].second.scalar_type(), tensors[i].second.scalar_type());
  }
  EXPECT_EQ(metadata.at("format"), "pt");
  EXPECT_EQ(metadata.at("posenc_fnv1a64").size(), 16u);
  // the header is padded to 8 bytes: the data section starts aligned
  const auto bytes = safetensors_bytes(tensors);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(n % 8, 0u);
}

std::string error_parsing(const std::string& bytes) {
  return test::error_of([&] { parse_safetensors(bytes, "f.safetensors"); });
}

TEST(Safetensors, EachIntegrityRuleIsOneLine) {
  const auto path = temp_path("checked.safetensors");
  write_safetensors(path, {{"w", torch::randn({8, 8})}});
  std::ifstream in(path, std::ios::binary);
  const std::string good((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  uint64_t n = 0;
  std::memcpy(&n, good.data(), 8);
  auto expect = [](const std::string& message, const std::string& part) {
    EXPECT_NE(message.find("safetensors: 'f.safetensors'"), std::string::npos) << message;
    EXPECT_NE(message.find(part), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  };
  expect(error_parsing(good.substr(0, 5)), "is truncated: 5 bytes");
  expect(error_parsing(good.substr(0, 8 + n / 2)), "is truncated: its header needs");
  expect(error_parsing(good.substr(0, good.size() - 10)), "outside the");
  expect(error_parsing(good + "xx"), "bytes after the last tensor");
  auto flipped = good;
  flipped[flipped.size() - 3] ^= 0x10;
  expect(error_parsing(flipped), "the file is corrupt");
  auto huge = good;
  const uint64_t big = uint64_t{1} << 40;
  std::memcpy(huge.data(), &big, 8);
  expect(error_parsing(huge), "over kMaxSafetensorsHeaderBytes");
  // hand-made headers: a wrong span for the shape, a gap, an unknown dtype, not JSON
  auto with_header = [](const std::string& json, size_t data) {
    std::string out(8, '\0');
    const uint64_t size = json.size();
    std::memcpy(out.data(), &size, 8);
    return out + json + std::string(data, '\0');
  };
  expect(error_parsing(
             with_header(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 12]}})", 12)),
         "(8 bytes) but its data_offsets span 12");
  expect(error_parsing(
             with_header(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})", 8)),
         "starts at byte 4, expected 0 (a gap or an overlap)");
  expect(error_parsing(
             with_header(R"({"a": {"dtype": "Q7", "shape": [1], "data_offsets": [0, 1]}})", 1)),
         "has dtype \"Q7\"");
  expect(error_parsing(with_header("{not json", 0)), "not valid JSON");
}

TEST(Safetensors, RunWeightsEvaluateAsWeightsPt) {
  auto config = posenc::load_config(std::string(POSENC_CONFIGS_DIR) + "/smoke/vit.yaml");
  RunOptions run;
  run.output = temp_path("run");
  fs::remove_all(run.output);
  run.quiet = true;
  run.overrides = {"train.max_steps=3", "task.eval_scales=[1.0]"};
  run_training(config, run);
  ASSERT_TRUE(fs::exists(run.output + "/weights.safetensors"));
  RunOptions eval = run;
  eval.output = temp_path("eval_pt");
  const auto from_pt = run_evaluation(config, eval, run.output + "/weights.pt");
  eval.output = temp_path("eval_safetensors");
  const auto from_st = run_evaluation(config, eval, run.output + "/weights.safetensors");
  ASSERT_EQ(from_pt.final_metrics.size(), from_st.final_metrics.size());
  for (size_t i = 0; i < from_pt.final_metrics.size(); ++i)
    EXPECT_EQ(from_pt.final_metrics[i].second, from_st.final_metrics[i].second);
  // a truncated weights.safetensors: one line naming it
  const auto cut = temp_path("cut.safetensors");
  fs::copy_file(run.output + "/weights.safetensors", cut, fs::copy_options::overwrite_existing);
  fs::resize_file(cut, fs::file_size(cut) - 7);
  eval.output = temp_path("eval_cut");
  const auto message = test::error_of([&] { run_evaluation(config, eval, cut); });
  EXPECT_NE(message.find("safetensors: '" + cut + "'"), std::string::npos) << message;
}

}  // namespace
}  // namespace posenc::train
