// The trainer (posenc/train/trainer.h) on the smoke configs in configs/smoke/: each experiment's
// task trains for a few steps on its real data and its loss falls; an interrupted run resumed from
// its checkpoint ends with exactly the weights of an uninterrupted one; weights.pt is the zip +
// pickle format Python's torch.load reads; bad configs name the bad key.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <torch/serialize.h>
#include <torch/torch.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>

#include "posenc/config/registry.h"
#include "posenc/core/errors.h"
#include "posenc/train/trainer.h"
#include "support/fixtures.h"
#include "support/run_files.h"
#include "train/device.h"        // train.device resolved (src/train)
#include "train/ema.h"           // the trainer's internal weight average (src/train)
#include "train/tasks/common.h"  // the tasks' shared helpers (src/train/tasks)

namespace posenc::train {
namespace {

namespace fs = std::filesystem;

std::string temp_folder(const std::string& name) {
  // per process: two checkouts' suites (or a CI clone beside a work tree) may run at once
  auto path = fs::temp_directory_path() / ("posenc_train_" + std::to_string(getpid()) + "_" + name);
  fs::remove_all(path);
  return path.string();
}

nlohmann::json smoke(const std::string& name) {
  return load_config(std::string(POSENC_CONFIGS_DIR) + "/smoke/" + name + ".yaml");
}

class SmokeTest : public ::testing::TestWithParam<std::string> {};

TEST_P(SmokeTest, LossFallsAndOutputsAreWritten) {
  RunOptions options;
  options.output = temp_folder(GetParam());
  options.quiet = true;
  auto result = run_training(smoke(GetParam()), options);
  ASSERT_TRUE(result.finished);
  EXPECT_GT(result.steps, 0);
  EXPECT_GT(result.parameters, 0);
  EXPECT_EQ(result.device, "cpu");
  auto losses = train_losses(options.output);
  ASSERT_GE(losses.size(), 3u);
  EXPECT_LT(losses.back(), losses.front()) << "the training loss did not fall";
  EXPECT_TRUE(std::isfinite(metric_value(result.final_metrics, result.metric_name)));
  for (const char* file :
       {"checkpoint.pt", "weights.pt", "metrics.csv", "curves.png", "summary.json"}) {
    EXPECT_TRUE(fs::exists(options.output + "/" + file)) << file;
  }
  auto weights = read_weights(options.output + "/weights.pt");
  EXPECT_GT(weights.size(), 4u);
}

INSTANTIATE_TEST_SUITE_P(Experiments, SmokeTest,
                         ::testing::Values("vit", "lm", "forecast", "video", "text_video",
                                           "retrieval", "audio_language", "audio_video_text"));

// The retrieval task (experiment 6): a depth x length table of recall in [0, 1], written per run
// (recall_by_depth.md/.png, summary.json) and across runs by compare (a panel per run); the text
// haystack variant trains too.
TEST(Trainer, RetrievalWritesItsDepthTable) {
  auto config = smoke("retrieval");
  config["runs"] = nlohmann::json::parse(R"([{"name": "rope"},
      {"name": "alibi_text", "encoder": {"type": "alibi"}, "overrides": {"task": {"haystack": "text"}}},
      {"name": "learned", "encoder": {"type": "learned", "max_positions": 29}}])");
  RunOptions options;
  options.output = temp_folder("retrieval_compare");
  options.quiet = true;
  const auto results = run_comparison(config, options);
  ASSERT_EQ(results.size(), 3u);
  for (const auto& r : results) {
    ASSERT_EQ(r.details.size(), 1u) << r.name;
    // at the trained length the table is the evaluation's recall (a learned table of 29 rows,
    // prompt + one answer byte, is not stretched there)
    EXPECT_DOUBLE_EQ(metric_value(r.generalization[0].metrics, "recall"),
                     metric_value(r.final_metrics, "recall"))
        << r.name;
    const auto& table = r.details[0];
    EXPECT_EQ(table.name, "recall_by_depth");
    EXPECT_EQ(table.rows, (std::vector<std::string>{"0%", "50%", "100%"}));
    EXPECT_EQ(table.cols, (std::vector<std::string>{"4 (28)", "8 (52)"}));
    double sum = 0;
    for (const auto& row : table.values) {
      ASSERT_EQ(row.size(), 2u);
      for (double v : row) {
        EXPECT_GE(v, 0.0);
        EXPECT_LE(v, 1.0);
        EXPECT_EQ(v * 8, std::round(v * 8));  // 8 prompts per cell
        sum += v;
      }
    }
    // the generalization rows are the columns' means
    ASSERT_EQ(r.generalization.size(), 2u);
    EXPECT_EQ(r.generalization[0].setting, "4 records (28-byte prompts)");
    double column = 0;
    for (const auto& row : table.values) column += row[0];
    EXPECT_NEAR(metric_value(r.generalization[0].metrics, "recall"), column / 3, 1e-12);
    EXPECT_TRUE(fs::exists(r.output + "/recall_by_depth.md"));
    EXPECT_TRUE(fs::exists(r.output + "/recall_by_depth.png"));
    // read back from summary.json as compare --jobs does
    const auto again = read_run_result(r.output);
    ASSERT_EQ(again.details.size(), 1u);
    EXPECT_EQ(again.details[0].values, table.values);
  }
  std::ifstream in(options.output + "/results_recall_by_depth.md");
  std::string md((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(md.find("### rope\n"), std::string::npos) << md;
  EXPECT_NE(md.find("### alibi_text\n"), std::string::npos) << md;
  EXPECT_NE(md.find("| 50% |"), std::string::npos) << md;
  EXPECT_TRUE(fs::exists(options.output + "/results_recall_by_depth.png"));

  auto bad = config;
  bad["task"]["depth_bins"] = 1;
  RunOptions elsewhere = options;
  elsewhere.output = temp_folder("retrieval_bad");
  const auto message = test::error_of([&] { run_training(bad, elsewhere); });
  EXPECT_NE(message.find("task: depth_bins must be in [2, 101], got 1"), std::string::npos)
      << message;
  auto mixed = config;
  mixed["task"]["min_records"] = 5;  // more than records = 4
  const auto range = test::error_of([&] { run_training(mixed, elsewhere); });
  EXPECT_NE(range.find("task: min_records must be in [1, records = 4], got 5"), std::string::npos)
      << range;
  // prompts of 2..4 records, one N per step from the step's seed: trains, evaluates at 4 and 8
  mixed["task"]["min_records"] = 2;
  RunOptions varied = options;
  varied.output = temp_folder("retrieval_mixed");
  const auto trained = run_training(mixed, varied);
  EXPECT_TRUE(trained.finished);
  EXPECT_EQ(trained.details.size(), 1u);
  // several answered queries per training prompt (up to N for a prompt of N records): trains;
  // the evaluation still asks one, and reports each answer byte's accuracy
  auto queries = mixed;
  queries["task"]["train_queries"] = 3;
  RunOptions asked = options;
  asked.output = temp_folder("retrieval_queries");
  const auto multi = run_training(queries, asked);
  EXPECT_TRUE(multi.finished);
  EXPECT_TRUE(std::isfinite(metric_value(multi.final_metrics, "first_byte")));
  EXPECT_TRUE(std::isfinite(metric_value(multi.final_metrics, "second_byte")));
  EXPECT_GE(metric_value(multi.final_metrics, "first_byte"),
            metric_value(multi.final_metrics, "recall"));
  queries["task"]["train_queries"] = 5;
  EXPECT_NE(test::error_of([&] { run_training(queries, elsewhere); })
                .find("task: train_queries must be in [1, records = 4] (distinct records per "
                      "prompt), got 5"),
            std::string::npos);
  queries["task"]["train_queries"] = 2;
  queries["task"]["haystack"] = "text";
  EXPECT_NE(test::error_of([&] {
              run_training(queries, elsewhere);
            }).find("train_queries > 1 needs haystack: records"),
            std::string::npos);
}

// Test-time flip averaging (task.eval_flip, issue #16): the views' probabilities averaged, by
// hand; stable where a probability underflows; on a trained smoke ViT it changes the numbers.
TEST(Trainer, FlipAveragedEvaluation) {
  auto a = torch::tensor({{2.0, 0.0, -1.0}, {0.5, 0.5, 0.5}}, torch::kDouble);
  auto b = torch::tensor({{0.0, 1.0, 3.0}, {-2.0, 4.0, 1.0}}, torch::kDouble);
  auto by_hand = ((a.exp() / a.exp().sum(-1, true) + b.exp() / b.exp().sum(-1, true)) / 2).log();
  EXPECT_TRUE(torch::allclose(mean_probability_log({a, b}), by_hand, 1e-12, 1e-12));
  EXPECT_TRUE(torch::allclose(mean_probability_log({a}), a.log_softmax(-1), 1e-12, 1e-12));
  auto tiny = mean_probability_log({torch::tensor({{0.0, -2000.0}}, torch::kDouble),
                                    torch::tensor({{0.0, -3000.0}}, torch::kDouble)});
  EXPECT_NEAR(tiny[0][1].item<double>(), -2000.0 - std::log(2.0), 1e-9);  // not log(0)

  RunOptions options;
  options.output = temp_folder("vit_flip");
  options.quiet = true;
  auto config = smoke("vit");
  config["train"]["epochs"] = 1;
  run_training(config, options);
  RunOptions flip = options;
  flip.output = temp_folder("vit_flip_eval");
  flip.overrides = {"task.eval_flip=true"};
  RunOptions one_view = options;
  one_view.output = temp_folder("vit_one_view_eval");
  const auto single = run_evaluation(config, one_view, options.output + "/weights.pt");
  const auto both = run_evaluation(config, flip, options.output + "/weights.pt");
  EXPECT_NE(metric_value(both.final_metrics, "loss"), metric_value(single.final_metrics, "loss"));
  const double accuracy = metric_value(both.final_metrics, "accuracy");
  EXPECT_GE(accuracy, 0.0);
  EXPECT_LE(accuracy, 1.0);
  ASSERT_EQ(both.generalization.size(), single.generalization.size());  // every scale averaged
  EXPECT_NE(metric_value(both.generalization.back().metrics, "loss"),
            metric_value(single.generalization.back().metrics, "loss"));
}

TEST(Trainer, SmokeGeneralizationRows) {
  RunOptions options;
  options.output = temp_folder("vit_rows");
  options.quiet = true;
  auto config = smoke("vit");
  config["train"]["epochs"] = 1;
  auto result = run_training(config, options);
  ASSERT_EQ(result.generalization.size(), 2u);
  EXPECT_EQ(result.generalization[1].setting, "scale 1.5x (48 px, 12x12 patches)");
}

TEST(Trainer, ResumeContinuesExactly) {
  auto config = smoke("lm");
  RunOptions straight;
  straight.output = temp_folder("straight");
  straight.quiet = true;
  run_training(config, straight);

  RunOptions interrupted = straight;
  interrupted.output = temp_folder("interrupted");
  interrupted.stop_after = 11;  // mid-epoch (16 steps per epoch)
  auto first = run_training(config, interrupted);
  EXPECT_FALSE(first.finished);
  EXPECT_EQ(first.steps, 11);
  interrupted.stop_after = 0;
  interrupted.resume = true;
  auto second = run_training(config, interrupted);
  EXPECT_TRUE(second.finished);
  EXPECT_EQ(second.steps, 32);

  auto a = read_weights(straight.output + "/weights.pt");
  auto b = read_weights(interrupted.output + "/weights.pt");
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, tensor] : a) {
    EXPECT_TRUE(torch::equal(tensor, b.at(name))) << name;
  }
  EXPECT_EQ(train_losses(straight.output), train_losses(interrupted.output));
}

// train.ema_decay on the ViT smoke run with label smoothing and random erasing: the average is
// what is evaluated and written (weights.pt differs from the checkpoint's raw weights), it follows
// the hand-computed recursion, and an interrupted run resumed continues it exactly.
TEST(Trainer, WeightAverageIsEvaluatedSavedAndResumed) {
  auto config = smoke("vit");
  config["train"]["ema_decay"] = 0.9;
  config["task"]["label_smoothing"] = 0.1;
  config["task"]["erase_probability"] = 0.5;
  RunOptions straight;
  straight.output = temp_folder("ema_straight");
  straight.quiet = true;
  auto full = run_training(config, straight);
  ASSERT_TRUE(full.finished);

  RunOptions interrupted = straight;
  interrupted.output = temp_folder("ema_interrupted");
  interrupted.stop_after = 5;  // mid-epoch (16 steps per epoch)
  EXPECT_FALSE(run_training(config, interrupted).finished);
  interrupted.stop_after = 0;
  interrupted.resume = true;
  auto resumed = run_training(config, interrupted);
  ASSERT_TRUE(resumed.finished);
  auto a = read_weights(straight.output + "/weights.pt");
  auto b = read_weights(interrupted.output + "/weights.pt");
  for (const auto& [name, tensor] : a) EXPECT_TRUE(torch::equal(tensor, b.at(name))) << name;
  EXPECT_EQ(full.final_metrics, resumed.final_metrics);

  // weights.pt holds the average; the checkpoint the raw weights and the average.
  auto checkpoint = read_pickled_dict(straight.output + "/checkpoint.pt");
  auto raw = checkpoint.at("model").toGenericDict();
  auto ema = checkpoint.at("ema").toGenericDict();
  const auto embed = std::string("embed.weight");
  EXPECT_TRUE(torch::equal(ema.at(embed).toTensor(), a.at(embed)));
  EXPECT_FALSE(torch::equal(raw.at(embed).toTensor(), a.at(embed)));

  // The recursion by hand on one tensor: d_t = min(0.9, (1 + t) / (10 + t)).
  torch::nn::Linear layer(3, 2);
  WeightAverage average(*layer, 0.9);
  auto expected = layer->weight.detach().clone().to(torch::kFloat64);
  for (int64_t t = 1; t <= 30; ++t) {
    torch::NoGradGuard no_grad;
    layer->weight.add_(0.1 * static_cast<double>(t % 7));
    const double d = std::min(0.9, (1.0 + t) / (10.0 + t));
    expected = d * expected + (1 - d) * layer->weight.detach().to(torch::kFloat64);
    average.update(t);
  }
  EXPECT_LT(
      (average.named().at("weight").to(torch::kFloat64) - expected).abs().max().item<double>(),
      1e-5);
  {
    WeightAverage::Swap swap(&average);  // the model holds the average while the swap lives
    EXPECT_LT((layer->weight.detach().to(torch::kFloat64) - expected).abs().max().item<double>(),
              1e-5);
  }
  EXPECT_GT((layer->weight.detach().to(torch::kFloat64) - expected).abs().max().item<double>(),
            1e-2);
}

// --profile: 10 steps of warm-up, N profiled, a table in profile.md whose matmul and attention
// lines are non-zero, a checkpoint at the stopping step.
TEST(Trainer, ProfileWritesWhereTheStepGoes) {
  auto config = smoke("vit");
  RunOptions options;
  options.output = temp_folder("profile");
  options.quiet = true;
  options.profile_steps = 4;
  auto result = run_training(config, options);
  EXPECT_FALSE(result.finished);
  EXPECT_EQ(result.steps, 14);
  std::ifstream in(options.output + "/profile.md");
  ASSERT_TRUE(in.good());
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (const char* line : {"| matmuls (linear layers) | ", "| attention (SDPA, fused kernel) | ",
                           "| optimizer step (AdamW) | ", "| layer norms | ", "**step (wall)**"}) {
    const auto at = text.find(line);
    ASSERT_NE(at, std::string::npos) << line << " missing from\n" << text;
    if (std::string(line).rfind("| ", 0) == 0) {
      const double ms = std::stod(text.substr(at + std::string(line).size()));
      EXPECT_GT(ms, 0.0) << line;
    }
  }
}

TEST(Trainer, ResumeRefusesAnotherConfig) {
  auto config = smoke("lm");
  RunOptions options;
  options.output = temp_folder("other_config");
  options.quiet = true;
  options.stop_after = 2;
  run_training(config, options);
  config["train"]["lr"] = 0.001;
  options.resume = true;
  auto message = test::error_of([&] { run_training(config, options); });
  EXPECT_NE(message.find("was written by a different config"), std::string::npos) << message;
}

// checkpoint.pt: torch.save's format with Python's state_dict layout, no TorchScript type tag
// (torch.load(weights_only=True) refuses restore_type_tag), a checksum checked on resume, and the
// previous checkpoint kept as checkpoint.prev.pt.
// The message of the error `what` throws ("" when it throws none).
template <typename Fn>
std::string error_of(Fn what) {
  try {
    what();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// `posenc eval` and `--init-from` (issue #12): evaluating a run's weights gives the run's own
// final numbers; the encoder config may change (a rope_scaling block: its tables come from the
// new config, not from the file, so the long-context numbers move); a run initialized from
// trained weights starts where they left off; mismatches name the tensor and both shapes.
TEST(Trainer, EvalAndInitFromReadTrainedWeights) {
  auto config = smoke("lm");
  RunOptions base;
  base.output = temp_folder("init_base");
  base.quiet = true;
  const auto trained = run_training(config, base);
  const auto weights = base.output + "/weights.pt";

  RunOptions eval;
  eval.output = temp_folder("init_eval");
  auto again = run_evaluation(config, eval, weights);
  ASSERT_EQ(again.final_metrics.size(), trained.final_metrics.size());
  for (size_t i = 0; i < again.final_metrics.size(); ++i)
    EXPECT_DOUBLE_EQ(again.final_metrics[i].second, trained.final_metrics[i].second);
  ASSERT_EQ(again.generalization.size(), 2u);  // contexts 32 and 64
  EXPECT_DOUBLE_EQ(metric_value(again.generalization[1].metrics, "ppl"),
                   metric_value(trained.generalization[1].metrics, "ppl"));
  EXPECT_TRUE(fs::exists(eval.output + "/summary.json"));
  // also from the checkpoint's model tensors
  auto from_checkpoint = run_evaluation(config, eval, base.output + "/checkpoint.pt");
  EXPECT_DOUBLE_EQ(from_checkpoint.final_metrics[0].second, trained.final_metrics[0].second);

  // another encoder config: linear position interpolation by 2 changes the tables
  RunOptions scaled = eval;
  scaled.overrides = {R"(encoder.rope_scaling={"rope_type": "linear", "factor": 2})"};
  auto interpolated = run_evaluation(config, scaled, weights);
  EXPECT_NE(metric_value(interpolated.generalization[1].metrics, "ppl"),
            metric_value(trained.generalization[1].metrics, "ppl"));

  // a fine-tune from the trained weights starts at their loss, not at a fresh model's
  RunOptions fresh;
  fresh.output = temp_folder("init_fresh");
  fresh.quiet = true;
  fresh.overrides = {"train.max_steps=4"};
  run_training(config, fresh);
  RunOptions tuned = fresh;
  tuned.output = temp_folder("init_tuned");
  tuned.init_from = weights;
  tuned.overrides.push_back(R"(encoder.rope_scaling={"rope_type": "linear", "factor": 2})");
  run_training(config, tuned);
  ASSERT_FALSE(train_losses(fresh.output).empty());
  ASSERT_FALSE(train_losses(tuned.output).empty());
  EXPECT_LT(train_losses(tuned.output)[0], train_losses(fresh.output)[0] - 0.5);

  // mismatches: a wider model, a model with a learned table the file lacks, not a weights file
  RunOptions wide = eval;
  wide.overrides = {"model.dim=48", "model.num_heads=2"};
  const auto shape = error_of([&] { run_evaluation(config, wide, weights); });
  EXPECT_NE(shape.find("init: '" + weights + "': '"), std::string::npos) << shape;
  EXPECT_NE(shape.find("' has shape [256, 32] in the file but [256, 48] in the model"),
            std::string::npos)
      << shape;
  RunOptions learned = eval;
  learned.overrides = {R"(encoder={"type": "learned", "max_positions": 64})"};
  const auto missing = error_of([&] { run_evaluation(config, learned, weights); });
  EXPECT_NE(missing.find("' has no tensor '"), std::string::npos) << missing;
  const auto not_weights =
      error_of([&] { run_evaluation(config, eval, base.output + "/metrics.csv"); });
  EXPECT_NE(not_weights.find(base.output + "/metrics.csv"), std::string::npos) << not_weights;
}

// Entries of a comparison that start from an earlier entry's weights (issue #12, experiment 2b):
// evaluate_only under the same config gives the trained entry's own numbers; an inference-time
// scaling moves them; a fine-tune starts at the trained loss; the logn temperature leaves the
// trained length alone and changes the longer one; an entry naming a later or unknown one, and
// evaluate_only without weights, are errors before anything trains.
TEST(Trainer, CompareEntriesStartFromEarlierEntries) {
  auto config = smoke("lm_extend");
  RunOptions options;
  options.output = temp_folder("extend");
  options.quiet = true;
  const auto results = run_comparison(config, options);
  ASSERT_EQ(results.size(), 6u);
  const auto& rope = results[0];
  const auto& nope = results[1];
  const auto& same = results[2];
  const auto& pi = results[3];
  const auto& logn = results[4];
  const auto& tuned = results[5];
  EXPECT_EQ(same.steps, 0);
  EXPECT_EQ(pi.steps, 0);
  for (size_t row = 0; row < 2; ++row) {
    EXPECT_DOUBLE_EQ(metric_value(same.generalization[row].metrics, "ppl"),
                     metric_value(rope.generalization[row].metrics, "ppl"));
    EXPECT_NE(metric_value(pi.generalization[row].metrics, "ppl"),
              metric_value(rope.generalization[row].metrics, "ppl"));
  }
  // logn: scale 1 at 32 (the trained length), log 64 / log 32 = 1.2 at 64
  EXPECT_DOUBLE_EQ(metric_value(logn.generalization[0].metrics, "ppl"),
                   metric_value(nope.generalization[0].metrics, "ppl"));
  EXPECT_NE(metric_value(logn.generalization[1].metrics, "ppl"),
            metric_value(nope.generalization[1].metrics, "ppl"));
  EXPECT_EQ(tuned.steps, 4);
  const auto rope_losses = train_losses(options.output + "/rope");
  const auto tuned_losses = train_losses(options.output + "/rope_pi_ft");
  ASSERT_FALSE(rope_losses.empty());
  ASSERT_FALSE(tuned_losses.empty());
  EXPECT_LT(tuned_losses[0], rope_losses[0] - 0.5);  // from trained weights, not from scratch
  EXPECT_TRUE(fs::exists(options.output + "/rope_pi_zero/summary.json"));
  EXPECT_FALSE(fs::exists(options.output + "/rope_pi_zero/weights.pt"));  // nothing trained

  // errors, before anything trains
  auto later = config;
  later["runs"][0]["init_from"] = "nope";
  const auto order = error_of([&] { comparison_entries(later); });
  EXPECT_NE(order.find("runs entry 'rope': init_from 'nope' is not an earlier entry (entries run "
                       "in order; the earlier ones are: none)"),
            std::string::npos)
      << order;
  auto no_weights = select_run(config, "rope_pi_zero");
  no_weights.erase("init_from");
  const auto nothing = error_of([&] { run_training(no_weights, options); });
  EXPECT_NE(nothing.find("evaluate_only needs weights to evaluate"), std::string::npos) << nothing;
  RunOptions elsewhere = options;
  elsewhere.output = temp_folder("extend_missing") + "/rope_pi_zero";
  const auto missing =
      error_of([&] { run_training(select_run(config, "rope_pi_zero"), elsewhere); });
  EXPECT_NE(missing.find("config: init_from 'rope': no '"), std::string::npos) << missing;
  EXPECT_NE(missing.find("(the entry 'rope' must finish training first"), std::string::npos)
      << missing;
}

TEST(Trainer, CheckpointIsPythonReadableAndChecked) {
  auto config = smoke("lm");
  RunOptions options;
  options.output = temp_folder("checkpoint_layout");
  options.quiet = true;
  options.stop_after = 3;
  run_training(config, options);
  const std::string path = options.output + "/checkpoint.pt";
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // No TorchScript globals (restore_type_tag, build_intlist...): weights_only refuses them.
  EXPECT_EQ(bytes.find("torch.jit"), std::string::npos);
  EXPECT_EQ(bytes.find("__torch__"), std::string::npos);
  auto dict = torch::pickle_load(std::vector<char>(bytes.begin(), bytes.end())).toGenericDict();
  std::vector<std::string> keys;
  for (const auto& item : dict) keys.push_back(item.key().toStringRef());
  EXPECT_EQ(keys, (std::vector<std::string>{"format", "model", "optimizer", "step", "elapsed",
                                            "log_window", "config", "checksum"}));
  EXPECT_EQ(dict.at("step").toInt(), 3);
  auto optimizer = dict.at("optimizer").toGenericDict();
  auto groups = optimizer.at("param_groups").toList();
  ASSERT_EQ(groups.size(), 2u);  // matrices with weight decay, the rest without
  auto group = groups.get(0).toGenericDict();
  EXPECT_TRUE(group.at("betas").isTuple());
  auto first = optimizer.at("state").toGenericDict().at(0).toGenericDict();
  EXPECT_EQ(first.at("step").toTensor().item<double>(), 3.0);
  EXPECT_EQ(first.at("step").toTensor().scalar_type(), torch::kFloat32);  // as Python's AdamW

  // A second save keeps the first as checkpoint.prev.pt.
  options.stop_after = 5;
  options.resume = true;
  run_training(config, options);
  EXPECT_TRUE(fs::exists(options.output + "/checkpoint.prev.pt"));

  // One flipped byte in a tensor: refused on resume, naming the file and the previous one.
  std::string corrupt = bytes;
  const auto at = corrupt.size() / 2;
  corrupt[at] = static_cast<char>(corrupt[at] ^ 0x10);
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << corrupt;
  }
  options.stop_after = 7;
  auto message = test::error_of([&] { run_training(config, options); });
  EXPECT_NE(message.find(path), std::string::npos) << message;
  EXPECT_TRUE(message.find("is corrupt") != std::string::npos ||
              message.find("not a readable torch.save file") != std::string::npos)
      << message;
  // Truncated: refused too.
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << bytes.substr(0, bytes.size() / 3);
  }
  message = test::error_of([&] { run_training(config, options); });
  EXPECT_NE(message.find("not a readable torch.save file"), std::string::npos) << message;
}

// Hostile or careless run configs: one clear error each, before any training.
TEST(Trainer, RunConfigsAreCheckedUpFront) {
  auto error = [](nlohmann::json config) {
    RunOptions options;
    options.output = temp_folder("upfront");
    options.quiet = true;
    return test::error_of([&] { run_training(config, options); });
  };
  auto config = smoke("vit");
  config["train"]["threads"] = -1;
  EXPECT_NE(error(config).find("'threads' must be 0 (all cores) or 1 to 1024, got -1"),
            std::string::npos);
  config = smoke("vit");
  config["train"]["threads"] = 4294967297LL;
  EXPECT_NE(error(config).find("got 4294967297"), std::string::npos);
  config = smoke("vit");
  config["seed"] = 1e300;
  EXPECT_NE(error(config).find("'seed' is 1e+300, outside the 64-bit integer range"),
            std::string::npos)
      << error(config);
  config = smoke("vit");
  config["train"]["max_steps"] = -5;
  EXPECT_NE(error(config).find("train: max_steps must be >= 0, got -5"), std::string::npos)
      << error(config);
  config = smoke("vit");
  config["task"]["train_limit"] = -64;
  EXPECT_NE(error(config).find("train_limit and eval_limit must be >= 0"), std::string::npos);
  // a border past the image size limit: 2 * pad overflowed int64 ("negative padding" from ATen)
  for (const char* key : {"pad", "crop_padding"}) {
    config = smoke("vit");
    config["task"][key] = int64_t{1} << 62;
    EXPECT_NE(error(config).find(std::string("task: ") + key +
                                 " must be in [0, 4096] pixels, got 4611686018427387904"),
              std::string::npos)
        << error(config);
  }
  for (double scale : {0.0, -1.5, 1000.0}) {
    config = smoke("vit");
    config["task"]["eval_scales"] = {scale};
    EXPECT_NE(error(config).find("eval_scales must be in [0.25, 8]"), std::string::npos) << scale;
  }
  config = smoke("vit");
  config["model"]["num_layers"] = 2147483648LL;
  EXPECT_NE(error(config).find("num_layers must be <= kMaxLayers = 1024"), std::string::npos)
      << error(config);
  config = smoke("vit");
  config["model"]["mlp_ratio"] = 65;
  EXPECT_NE(error(config).find("mlp_ratio <= kMaxMlpRatio = 64, got 1 and 65"), std::string::npos)
      << error(config);
  config = smoke("vit");
  config["model"]["num_layers"] = 1024;
  config["model"]["dim"] = 8192;
  EXPECT_NE(error(config).find("(the model size limit)"), std::string::npos) << error(config);
  config = smoke("vit");
  config["train"]["batch_size"] = 1048577;
  EXPECT_NE(
      error(config).find("batch_size 1048577 is over the batch limit kMaxBatchSize = 1048576"),
      std::string::npos)
      << error(config);
  for (auto [key, value, expected] :
       {std::tuple{
            "train_clips", 1000001LL,
            "train_clips and eval_clips must be in [1, kMaxVideoClips = 1000000], got 1000001"},
        std::tuple{"frames", 1001LL, "frames must be in [1, kMaxVideoFrames = 1000], got 1001"},
        std::tuple{"canvas", 4097LL, "canvas must be in [1, kMaxCanvas = 4096] pixels, got 4097"},
        std::tuple{"canvas", 4096LL, "over the video limit kMaxVideoBytes = 16 GiB"}}) {
    config = smoke("video");
    config["task"][key] = value;
    EXPECT_NE(error(config).find(expected), std::string::npos) << key << ": " << error(config);
  }
  config = smoke("vit");
  config["name"] = "../../x";
  EXPECT_NE(error(config).find("run name '../../x' must be"), std::string::npos);
  config = smoke("video");
  config["runs"] = nlohmann::json::parse(R"([{"name": "a"}, {"name": "a"}])");
  EXPECT_NE(test::error_of([&] { comparison_entries(config); }).find("two entries are named 'a'"),
            std::string::npos);
}

// compare reads each finished entry's summary.json: a damaged one (a key missing or of another
// type, not JSON, a FIFO in its place) is one line naming the file, not nlohmann's bare text.
TEST(Trainer, DamagedRunSummaryIsOneLineNamingIt) {
  const auto folder = temp_folder("damaged_summary");
  fs::create_directories(folder);
  const auto path = folder + "/summary.json";
  auto write = [&](const std::string& text) {
    fs::remove(path);
    std::ofstream(path) << text;
  };
  // a NaN metric (written as null) is read back as NaN, not called damaged
  write(R"({"name": "a", "steps": 3, "seconds": 1.5, "parameters": 10, "metric": "accuracy",
            "final": {"accuracy": null}, "generalization": []})");
  EXPECT_TRUE(std::isnan(read_run_result(folder).final_metrics.at(0).second));
  write(R"({"name": "a", "steps": "many"})");
  auto message = test::error_of([&] { read_run_result(folder); });
  EXPECT_NE(message.find("compare: '" + path + "' is damaged (not as posenc train writes it)"),
            std::string::npos)
      << message;
  write("{\"name\": ");
  message = test::error_of([&] { read_run_result(folder); });
  EXPECT_NE(message.find("is not valid JSON"), std::string::npos) << message;
  fs::remove(path);
  ASSERT_EQ(mkfifo(path.c_str(), 0644), 0);
  message = test::error_of([&] { read_run_result(folder); });
  EXPECT_NE(message.find("is a FIFO"), std::string::npos) << message;
  fs::remove(path);
  message = test::error_of([&] { read_run_result(folder); });
  EXPECT_NE(message.find("(the run did not finish)"), std::string::npos) << message;
}

// A second run into a folder that a run holds is refused with the holder's PID.
TEST(Trainer, RunFolderIsLocked) {
  const auto folder = temp_folder("locked");
  fs::create_directories(folder);
  const int fd = ::open((folder + "/.posenc.lock").c_str(), O_RDWR | O_CREAT, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::write(fd, "4242\n", 5), 5);
  const pid_t child = ::fork();
  if (child == 0) {  // holds the lock as another process would
    const int own = ::open((folder + "/.posenc.lock").c_str(), O_RDWR);
    ::flock(own, LOCK_EX);
    ::sleep(30);
    ::_exit(0);
  }
  ::usleep(300000);
  RunOptions options;
  options.output = folder;
  options.quiet = true;
  auto message = test::error_of([&] { run_training(smoke("lm"), options); });
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  ::close(fd);
  EXPECT_NE(message.find("is in use by another posenc run (PID 4242)"), std::string::npos)
      << message;
  options.stop_after = 1;  // the holder is gone: the lock is free again
  EXPECT_EQ(run_training(smoke("lm"), options).steps, 1);
}

// train.device: the spellings, a data-parallel run's rule (a rank's GPU is its LOCAL_RANK), and
// on a machine without a GPU one clear environment error before anything is written.
TEST(Trainer, DeviceSettingIsChecked) {
  const DistributedOptions one;
  EXPECT_TRUE(training_device("cpu", one).is_cpu());
  for (const std::string bad :
       {"gpu", "CUDA", "cuda0", "cuda:", "cuda:x", "cuda:-1", "cuda:1024", "cuda:0 ", "cpu:0"}) {
    const auto message = error_of([&] { training_device(bad, one); });
    EXPECT_NE(message.find("train: device must be 'cpu', 'cuda' or 'cuda:N'"), std::string::npos)
        << bad << ": " << message;
    EXPECT_NE(message.find("got '" + bad + "'"), std::string::npos) << message;
  }
  DistributedOptions two;
  two.world_size = two.local_world_size = 2;
  two.rank = two.local_rank = 1;
  const auto ranks = error_of([&] { training_device("cuda:1", two); });
  EXPECT_NE(ranks.find("train: device 'cuda:1' in a data-parallel run of 2 ranks: use 'cuda' (each "
                       "rank takes the GPU of its LOCAL_RANK)"),
            std::string::npos)
      << ranks;
  auto config = smoke("lm");
  config["train"]["device"] = "cuda:0";  // refused before any rank starts
  EXPECT_NE(error_of([&] { check_run_config(config, {}, 2); }).find("use 'cuda'"),
            std::string::npos);
  EXPECT_NO_THROW(check_run_config(config, {}, 1));
  config["train"]["device"] = "tpu";
  EXPECT_NE(error_of([&] { check_run_config(config, {}, 1); }).find("got 'tpu'"),
            std::string::npos);
  if (torch::cuda::is_available()) {  // more GPUs asked for than there are
    const auto count = torch::cuda::device_count();
    const auto setting = "cuda:" + std::to_string(count);
    try {
      training_device(setting, one);
      ADD_FAILURE() << setting << " accepted with " << count << " GPUs";
    } catch (const EnvironmentError& e) {
      EXPECT_NE(std::string(e.what()).find("visible"), std::string::npos) << e.what();
    }
    return;
  }
  for (const std::string setting : {"cuda", "cuda:0"}) {
    try {
      training_device(setting, one);
      ADD_FAILURE() << setting << " accepted without a GPU";
    } catch (const EnvironmentError& e) {
      EXPECT_NE(std::string(e.what()).find("train: device is '" + setting + "' but "),
                std::string::npos)
          << e.what();
    }
  }
  RunOptions options;
  options.output = temp_folder("no_gpu");
  options.quiet = true;
  config = smoke("lm");
  config["train"]["device"] = "cuda";
  EXPECT_THROW(run_training(config, options), EnvironmentError);
  EXPECT_FALSE(fs::exists(options.output)) << "a run that cannot start wrote its folder";
}

// On a GPU (skipped without one): every task trains on cuda:0 as on the CPU — the same first
// losses (the weights are initialized on the CPU and moved, the data drawn on the CPU; only the
// kernels' rounding differs), falling losses, files in host memory (weights.pt loads anywhere),
// and a run stopped on the GPU resumes on the CPU.
class CudaSmokeTest : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaSmokeTest, TrainsOnTheGpuAsOnTheCpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  auto config = smoke(GetParam());
  config["train"]["max_steps"] = 8;
  config["train"]["log_every"] = 1;
  RunOptions cpu, gpu;
  cpu.quiet = gpu.quiet = true;
  cpu.output = temp_folder(GetParam() + "_cpu");
  gpu.output = temp_folder(GetParam() + "_gpu");
  const auto on_cpu = run_training(config, cpu);
  config["train"]["device"] = "cuda";
  const auto on_gpu = run_training(config, gpu);
  ASSERT_TRUE(on_gpu.finished);
  EXPECT_EQ(on_cpu.device, "cpu");
  EXPECT_EQ(on_gpu.device, "cuda:0") << "the model did not train on the GPU";
  EXPECT_EQ(read_run_result(gpu.output).device, "cuda:0");  // summary.json says so too
  const auto a = train_losses(cpu.output), b = train_losses(gpu.output);
  ASSERT_EQ(a.size(), b.size());
  ASSERT_GE(a.size(), 8u);
  EXPECT_NEAR(b[0], a[0], 1e-4 * std::abs(a[0]) + 1e-5) << "the first step's loss";
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], a[i], 2e-2 * std::abs(a[i]) + 1e-3) << i;
  const double metric_cpu = metric_value(on_cpu.final_metrics, on_cpu.metric_name);
  const double metric_gpu = metric_value(on_gpu.final_metrics, on_gpu.metric_name);
  EXPECT_TRUE(std::isfinite(metric_gpu));
  EXPECT_NEAR(metric_gpu, metric_cpu, 0.1 * std::abs(metric_cpu) + 0.1);
  for (const auto& [name, tensor] : read_weights(gpu.output + "/weights.pt"))
    EXPECT_TRUE(tensor.device().is_cpu()) << name << " saved on " << tensor.device();

  RunOptions moved = gpu;  // stopped on the GPU, resumed on the CPU
  moved.output = temp_folder(GetParam() + "_moved");
  moved.stop_after = 3;
  EXPECT_FALSE(run_training(config, moved).finished);
  const auto saved = torch::pickle_load([&] {
    std::ifstream in(moved.output + "/checkpoint.pt", std::ios::binary);
    return std::vector<char>(std::istreambuf_iterator<char>(in), {});
  }());
  for (const auto& item : saved.toGenericDict().at("model").toGenericDict())
    EXPECT_TRUE(item.value().toTensor().device().is_cpu()) << item.key().toStringRef();
  config["train"]["device"] = "cpu";
  moved.stop_after = 0;
  moved.resume = true;
  testing::internal::CaptureStderr();
  const auto resumed = run_training(config, moved);
  const auto said = testing::internal::GetCapturedStderr();
  EXPECT_NE(said.find("resuming at step 3 of"), std::string::npos) << said;
  EXPECT_TRUE(resumed.finished);
  EXPECT_EQ(resumed.device, "cpu");
  EXPECT_EQ(resumed.steps, on_cpu.steps);
  const auto c = train_losses(moved.output);  // the GPU's 3 rows kept, then the CPU's
  ASSERT_EQ(c.size(), b.size());
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(c[i], b[i]) << i;
}

INSTANTIATE_TEST_SUITE_P(Experiments, CudaSmokeTest,
                         ::testing::Values("vit", "lm", "forecast", "video", "text_video",
                                           "retrieval", "audio_language", "audio_video_text"));

// Resume compares configs by value: 1 == 1.0, and threads / log_every may change.
TEST(Trainer, ResumeComparesConfigsByValue) {
  auto config = smoke("lm");
  RunOptions options;
  options.output = temp_folder("by_value");
  options.quiet = true;
  options.stop_after = 2;
  run_training(config, options);
  config["train"]["lr"] = config["train"]["lr"].get<double>();                  // the same value
  config["train"]["batch_size"] = config["train"]["batch_size"].get<double>();  // 32 -> 32.0
  config["train"]["threads"] = 1;
  config["train"]["device"] = "cpu";  // how a run executes, not what it is: a resume may change it
  options.resume = true;
  options.stop_after = 4;
  EXPECT_EQ(run_training(config, options).steps, 4);
}

TEST(Trainer, BadConfigsNameTheKey) {
  auto config = smoke("vit");
  config["model"]["dimm"] = 3;
  auto message = test::error_of([&] { run_training(config, {}); });
  EXPECT_NE(message.find("model: unknown key 'dimm'"), std::string::npos) << message;
  config = smoke("vit");
  config["train"]["epochz"] = 3;
  message = test::error_of([&] { run_training(config, {}); });
  EXPECT_NE(message.find("train: unknown key 'epochz'"), std::string::npos) << message;
  config = smoke("vit");
  config["task"]["type"] = "regression";
  message = test::error_of([&] { run_training(config, {}); });
  EXPECT_NE(
      message.find(
          "unknown type 'regression'; known types: audio_language, audio_video_text, forecast"),
      std::string::npos)
      << message;
  config = smoke("forecast");
  config["task"]["file"] = "/nonexistent.csv";
  message = test::error_of([&] { run_training(config, {}); });
  EXPECT_NE(message.find("/nonexistent.csv"), std::string::npos) << message;
}

TEST(Trainer, RunsAndOverrides) {
  auto config = load_config(std::string(POSENC_CONFIGS_DIR) + "/vit_fashion.yaml");
  auto base = select_run(config, "");
  EXPECT_EQ(base.at("name"), "rope_2d");  // default_run
  EXPECT_FALSE(base.contains("runs"));
  auto learned = select_run(config, "learned_2d");
  EXPECT_EQ(learned.at("encoder").at("type"), "learned_grid");
  EXPECT_EQ(learned.at("output"), "runs/vit_fashion/learned_2d");
  auto message = test::error_of([&] { select_run(config, "rope_3d"); });
  EXPECT_NE(message.find("no run named 'rope_3d'; the runs are: rope_2d, rope_mixed"),
            std::string::npos)
      << message;
  apply_override(config, "train.epochs=1");
  apply_override(config, "task.eval_scales=[1.0]");
  apply_override(config, "encoder.type=nope");
  EXPECT_EQ(config["train"]["epochs"], 1);
  EXPECT_EQ(config["task"]["eval_scales"].size(), 1u);
  EXPECT_EQ(config["encoder"]["type"], "nope");
}

TEST(Trainer, CompareWritesTable) {
  nlohmann::json config = smoke("video");
  config["train"]["epochs"] = 1;
  config["runs"] = nlohmann::json::parse(
      R"([{"name": "rope_3d"}, {"name": "no_time", "encoder": {"type": "axial_sincos"},
          "overrides": {"task": {"position_axes": ["h", "w"]}}}])");
  RunOptions options;
  options.output = temp_folder("compare");
  options.quiet = true;
  auto results = run_comparison(config, options);
  ASSERT_EQ(results.size(), 2u);
  std::ifstream in(options.output + "/results.md");
  std::string table((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(table.find("| rope_3d | rope |"), std::string::npos) << table;
  EXPECT_NE(table.find("| no_time | axial_sincos |"), std::string::npos) << table;
  EXPECT_TRUE(fs::exists(options.output + "/results.png"));
}

}  // namespace
}  // namespace posenc::train
