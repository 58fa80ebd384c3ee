// Hostile inputs, by class (issue: hardening round 3): each test fails on a build without the
// mechanism it names and passes with it.
//   escape        a run folder's lock that is a symbolic link is refused, its target untouched
//   blocking      a FIFO or a device given as a config or data file is one line, never a read
//                 that waits forever
//   silent wrong  a weights file with flipped bytes is refused by its zip CRC-32; an epoch count
//                 whose step total overflows int64 is refused (it trained 0 steps and exited 0);
//                 llama3/yarn with original_max_position_embeddings 0 is refused
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <torch/torch.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "posenc/config/registry.h"
#include "posenc/io/durable_file.h"
#include "posenc/io/input_file.h"
#include "posenc/train/checkpoint.h"
#include "support/fixtures.h"
#include "train/run_folder.h"  // the run folder lock (src/train)
#include "train/schedule.h"    // step counts and their limit (src/train)

namespace posenc {
namespace {

namespace fs = std::filesystem;
using test::error_of;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

fs::path fresh_folder(const std::string& name) {
  const auto dir = fs::temp_directory_path() / ("posenc_hardening_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::string read_all(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST(Hardening, ALockThatIsASymlinkIsRefusedAndItsTargetUntouched) {
  const auto dir = fresh_folder("lock");
  const auto target = dir / "precious.txt";
  std::ofstream(target) << "root:x:0:0\n";
  fs::create_directories(dir / "run");
  fs::create_symlink(target, dir / "run" / ".posenc.lock");
  const auto error = error_of([&] { train::RunFolderLock lock((dir / "run").string()); });
  EXPECT_TRUE(contains(error, ".posenc.lock' is a symbolic link")) << error;
  EXPECT_EQ(read_all(target), "root:x:0:0\n");
  fs::remove_all(dir);
}

TEST(Hardening, ALockThatIsAHardLinkIsRefusedAndItsTargetUntouched) {
  const auto dir = fresh_folder("hard_lock");
  const auto target = dir / "precious.txt";
  std::ofstream(target) << "root:x:0:0\n";
  fs::create_directories(dir / "run");
  fs::create_hard_link(target, dir / "run" / ".posenc.lock");
  const auto error = error_of([&] { train::RunFolderLock lock((dir / "run").string()); });
  EXPECT_TRUE(contains(error, ".posenc.lock' is a hard link")) << error;
  EXPECT_EQ(read_all(target), "root:x:0:0\n");
  fs::remove_all(dir);
}

TEST(Hardening, AtomicWritesNeverWriteThroughALinkAtTheTempName) {
  const auto dir = fresh_folder("temp_link");
  const auto target = dir / "precious.txt";
  std::ofstream(target) << "keep\n";
  fs::create_symlink(target, dir / "summary.json.tmp");  // planted where the temp file goes
  write_file_atomically((dir / "summary.json").string(), "{}\n");
  EXPECT_EQ(read_all(target), "keep\n");
  EXPECT_EQ(read_all(dir / "summary.json"), "{}\n");
  EXPECT_FALSE(fs::exists(dir / "summary.json.tmp"));
  fs::remove_all(dir);
}

TEST(Hardening, FifosAndDevicesAreRefusedWithoutBlocking) {
  const auto dir = fresh_folder("fifo");
  const auto fifo = (dir / "config.json").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  // Nobody writes the FIFO: a blocking open would wait forever (the test's timeout says so).
  const auto config = error_of([&] { load_config(fifo); });
  EXPECT_TRUE(contains(config, "is a FIFO (named pipe), not a regular file")) << config;
  const auto data = error_of([&] { require_regular_file(fifo, "csv file"); });
  EXPECT_TRUE(contains(data, "csv file '" + fifo + "' is a FIFO")) << data;
  const auto device = error_of([] { load_config("/dev/zero"); });  // would stream without end
  EXPECT_TRUE(contains(device, "is a character device")) << device;
  const auto weights = error_of(
      [&] { read_regular_file(fifo, "weights file", 1 << 20, "the checkpoint size limit"); });
  EXPECT_TRUE(contains(weights, "is a FIFO")) << weights;
  fs::remove_all(dir);
}

TEST(Hardening, AWeightsFileWithFlippedBytesFailsItsCrc) {
  const auto dir = fresh_folder("crc");
  const auto path = (dir / "weights.pt").string();
  torch::nn::Linear model(16, 16);
  train::save_weights(path, *model);
  train::load_parameters(path, *model);  // intact: loads
  std::string bytes = read_all(path);
  // flip 20 bytes inside the weight's data record (torch.save stores it uncompressed)
  const auto weight = model->weight.contiguous();
  const std::string raw(static_cast<const char*>(weight.data_ptr()), weight.nbytes());
  const auto at = bytes.find(raw);
  ASSERT_NE(at, std::string::npos);
  for (size_t i = 0; i < 20; ++i) bytes[at + 100 + i] ^= 0x5A;
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  const auto error = error_of([&] { train::load_parameters(path, *model); });
  EXPECT_TRUE(contains(error, "fails its CRC-32 check")) << error;
  EXPECT_TRUE(contains(error, path)) << error;
  // a truncated file: one line too
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes.substr(0, bytes.size() - 100);
  EXPECT_FALSE(error_of([&] { train::load_parameters(path, *model); }).empty());
  fs::remove_all(dir);
}

// A run with a weight average (train.ema_decay) evaluates the average and writes it to weights.pt;
// its checkpoint.pt's "model" holds the raw training weights. `posenc eval --weights
// RUN/checkpoint.pt` read those and printed other numbers than the run's summary without a word:
// refused in one line that names weights.pt. A checkpoint without an average still loads.
TEST(Hardening, ACheckpointWithAWeightAverageIsNotReadAsTheRunsWeights) {
  const auto dir = fresh_folder("ema_checkpoint");
  const auto path = (dir / "checkpoint.pt").string();
  torch::manual_seed(0);
  torch::nn::Linear model(4, 3);
  torch::optim::AdamW optimizer(model->parameters());
  train::CheckpointState state;
  state.config = "{}";
  train::save_checkpoint(path, *model, optimizer, state);
  torch::nn::Linear other(4, 3);
  train::load_parameters(path, *other);  // no average: the model's weights
  EXPECT_TRUE(torch::equal(other->weight, model->weight));
  state.ema = {{"weight", model->weight.detach() * 0.5}, {"bias", model->bias.detach() * 0.5}};
  train::save_checkpoint(path, *model, optimizer, state);
  const auto error = error_of([&] { train::load_parameters(path, *other); });
  EXPECT_TRUE(contains(error, "init: '" + path +
                                  "' is the checkpoint of a run with a weight "
                                  "average (train.ema_decay)"))
      << error;
  EXPECT_TRUE(contains(error, "weights.pt")) << error;
  fs::remove_all(dir);
}

// A resume with another config names the first setting that differs (it said only "a different
// config", leaving the user to diff two JSON texts).
TEST(Hardening, AResumeWithAnotherConfigNamesTheSetting) {
  const auto dir = fresh_folder("resume_config");
  const auto path = (dir / "checkpoint.pt").string();
  torch::nn::Linear model(4, 3);
  torch::optim::AdamW optimizer(model->parameters());
  train::CheckpointState state;
  state.config = R"({"model": {"dim": 32}, "train": {"precision": "float32", "threads": 1}})";
  train::save_checkpoint(path, *model, optimizer, state);
  // threads only says how the run executes: resumes
  train::load_checkpoint(path, *model, optimizer,
                         R"({"model": {"dim": 32.0}, "train": {"precision": "float32"}})");
  auto error = error_of([&] {
    train::load_checkpoint(path, *model, optimizer,
                           R"({"model": {"dim": 32}, "train": {"precision": "bf16"}})");
  });
  EXPECT_TRUE(contains(error,
                       "was written by a different config (train.precision: \"float32\" "
                       "in the checkpoint, \"bf16\" now)"))
      << error;
  error = error_of([&] {
    train::load_checkpoint(
        path, *model, optimizer,
        R"({"model": {"dim": 32, "depth": 2}, "train": {"precision": "float32"}})");
  });
  EXPECT_TRUE(contains(error, "(model.depth: absent in the checkpoint, 2 now)")) << error;
  fs::remove_all(dir);
}

TEST(Hardening, StepTotalsThatOverflowAreRefused) {
  train::TrainSettings s;
  s.batch_size = 1;
  s.epochs = 1'000'000'000'000'000'000;  // --set train.epochs=1e18 (was: 0 steps, exit 0)
  const auto error = error_of([&] { train::step_counts(s, 1000); });
  EXPECT_TRUE(contains(error, "over the step limit of 1000000000000 steps")) << error;
  s.epochs = 3;
  const auto counts = train::step_counts(s, 1000);
  EXPECT_EQ(counts.total, 3000);
  s.max_steps = train::kMaxTrainSteps + 1;
  EXPECT_TRUE(contains(error_of([&] { train::step_counts(s, 1000); }), "the step limit"));
}

TEST(Hardening, AZeroOriginalContextIsRefused) {
  const nlohmann::json block{{"rope_type", "llama3"},
                             {"factor", 8.0},
                             {"low_freq_factor", 1.0},
                             {"high_freq_factor", 4.0},
                             {"original_max_position_embeddings", 0}};
  const auto error = error_of([&] {
    build_encoder(
        nlohmann::json{
            {"type", "rope"}, {"head_dim", 64}, {"rope_theta", 5e5}, {"rope_scaling", block}},
        {});
  });
  EXPECT_TRUE(contains(error, "'original_max_position_embeddings' must be >= 1")) << error;
}

TEST(Hardening, SizesPastTheModelSizeLimitAreRefusedBeforeAllocating) {
  const auto error = error_of([] {
    build_encoder(nlohmann::json{{"type", "rope"}, {"head_dim", int64_t{1} << 31}}, {});
  });
  EXPECT_TRUE(contains(error, "'head_dim' is 2147483648; the model size limit is 65536")) << error;
}

// One set of config limits for every door (posenc/config/config_reader.h): a JSON tree built in
// memory meets them in build_encoder as text does in parse_config.
TEST(Hardening, AConfigTreeNestedPastTheStackIsOneLine) {
  const ModelContext context{16, 2, 0};
  // 100000 compose levels: building recursed once per level and overflowed the stack
  nlohmann::json config = {{"type", "rope"}};
  for (int i = 0; i < 100000; ++i)
    config = nlohmann::json{{"type", "compose"},
                            {"encoders", nlohmann::json::array({std::move(config)})}};
  const auto error = error_of([&] { build_encoder(config, context); });
  EXPECT_EQ(error, "encoder config: nested deeper than 64 levels (the config depth limit)");
  // 31 levels (62 JSON levels) are within the limit and build
  nlohmann::json within = {{"type", "rope"}};
  for (int i = 0; i < 31; ++i)
    within = nlohmann::json{{"type", "compose"},
                            {"encoders", nlohmann::json::array({std::move(within)})}};
  EXPECT_EQ(build_encoder(within, context)->type(), "compose");
}

TEST(Hardening, ConfigValuesAndStringBytesHaveTheirLimitsAtEveryDoor) {
  const ModelContext context{16, 2, 0};
  auto values = nlohmann::json{{"type", "rope"}, {"x", std::vector<int>(kMaxConfigNodes, 1)}};
  EXPECT_EQ(error_of([&] { build_encoder(values, context); }),
            "encoder config: more than 1000000 values (the config size limit)");
  // as JSON text (2 MB, within the byte limit): the same limit
  EXPECT_EQ(error_of([&] { parse_config(values.dump(), "v.json"); }),
            "v.json: more than 1000000 values (the config size limit)");
  auto strings = nlohmann::json{{"type", "rope"},
                                {"x", std::vector<std::string>(2000, std::string(4000, 'x'))}};
  EXPECT_EQ(error_of([&] { build_encoder(strings, context); }),
            "encoder config: more than 4194304 bytes in its keys and strings (the config size "
            "limit)");
  // YAML aliases of a 4000-byte string: 10^4 values, 40 MB once expanded
  std::string text = "type: rope\na: &a \"" + std::string(4000, 'x') + "\"\nb: &b [*a";
  for (int i = 1; i < 100; ++i) text += ", *a";
  text += "]\nc: [*b";
  for (int i = 1; i < 100; ++i) text += ", *b";
  text += "]\n";
  EXPECT_EQ(error_of([&] { parse_config(text, "a.yaml"); }),
            "a.yaml: more than 4194304 bytes in its keys and strings once aliases are expanded "
            "(the config size limit)");
}

}  // namespace
}  // namespace posenc
