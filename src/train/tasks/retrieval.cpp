// retrieval: "lost in the middle" (Liu et al. 2023) on a byte-level causal LM. Prompts from
// text/retrieval.h: N records "KK=VV;" (or one record hidden in book text), then "?KK="; the
// model must answer the gold record's "VV".
//   loss: cross-entropy on the two answer bytes only (teacher-forced: the input is the prompt
//         and the first answer byte; logits at the last two positions)
//   recall: exact match of both bytes under greedy decoding (a key-value cache), the metric
// Training draws the gold record at a uniform depth; with min_records < records, each step's
// prompts hold N records, N uniform in [min_records, records] (the same N for the whole batch,
// drawn from the step's seed): short prompts teach the lookup before long ones dilute it.
// Evaluation: depth_bins bins (0, 10, ..., 100% for 11), eval_examples prompts per bin, at each of
// eval_records (N records; prompts of 6 N + 4 bytes); the same prompts for every run (seeded by N
// and bin). After training: a row per N (recall averaged over the bins) and the depth x N table
// (details: recall_by_depth.md, recall_by_depth.png). A learned table shorter than a prompt is
// stretched over it (adapt), as in the language_model task.
//
// Keys (task): records (20), min_records (records), eval_records ([records]),
//              haystack (records | text),
//              examples_per_epoch (16384), depth_bins (11), eval_examples (200),
//              eval_batch (200), files (the Gutenberg books; text haystack), eval_fraction (0.1)
// Keys (model): transformer keys (causal is forced on)
#include "text/retrieval.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <limits>
#include <sstream>

#include "common.h"
#include "tasks.h"

namespace posenc::train {
namespace {

// Evaluation prompts never depend on the run: seeded by (N, depth bin).
constexpr uint64_t kEvalSeed = 20230706;  // arXiv 2307.03172's date
// The most records one prompt may hold and depth bins one table may have.
constexpr int64_t kMaxDepthBins = 101;

// SplitMix64's finalizer (Steele et al. 2014): consecutive step seeds -> unrelated numbers.
uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

class RetrievalTask : public Task {
 public:
  explicit RetrievalTask(const nlohmann::json& config) {
    ConfigReader task(config.at("task"), "task");
    task.allow("type");
    records_ = task.integer("records", 20);
    min_records_ = task.integer("min_records", records_);
    eval_records_ = {records_};
    if (task.has("eval_records")) eval_records_ = task.integers("eval_records");
    haystack_ = text::haystack_from_string(task.string("haystack", "records"));
    examples_per_epoch_ = task.integer("examples_per_epoch", 16384);
    depth_bins_ = task.integer("depth_bins", 11);
    eval_examples_ = task.integer("eval_examples", 200);
    eval_batch_ = task.integer("eval_batch", 200);
    const auto books = book_source(task);
    task.finish();
    for (int64_t n : eval_records_)
      TORCH_CHECK(n >= 1 && n <= text::kMaxRecords,
                  "task: records and eval_records must be in [1, ", text::kMaxRecords,
                  "] (distinct two-letter keys), got ", n);
    TORCH_CHECK(records_ >= 1 && records_ <= text::kMaxRecords, "task: records must be in [1, ",
                text::kMaxRecords, "], got ", records_);
    TORCH_CHECK(min_records_ >= 1 && min_records_ <= records_,
                "task: min_records must be in [1, records = ", records_, "], got ", min_records_);
    TORCH_CHECK(depth_bins_ >= 2 && depth_bins_ <= kMaxDepthBins,
                "task: depth_bins must be in [2, ", kMaxDepthBins, "], got ", depth_bins_);
    TORCH_CHECK(examples_per_epoch_ > 0 && eval_examples_ > 0 && eval_batch_ > 0,
                "task: examples_per_epoch, eval_examples and eval_batch must be > 0");
    if (haystack_ == text::Haystack::kText) {
      auto bytes = load_books(books);
      train_filler_ = bytes.train;
      eval_filler_ = bytes.held_out;
      for (int64_t n : eval_records_)
        TORCH_CHECK(eval_filler_.size(0) >= text::kRecordBytes * n, "task: ", n,
                    " records' haystack (", text::kRecordBytes * n,
                    " bytes) does not fit the held-out text (", eval_filler_.size(0), " bytes)");
    }

    ConfigReader model(config.at("model"), "model");
    auto t = transformer_options(model);
    model.finish();
    t.causal(true);
    if (t.logn_length() == 0) t.logn_length(text::retrieval_prompt_bytes(records_) + 1);
    model_ = LanguageModel(LanguageModelOptions(t), encoder_from(config, "encoder", t));
  }

  std::shared_ptr<torch::nn::Module> model() override { return model_.ptr(); }
  int64_t train_size() const override { return examples_per_epoch_; }
  std::string metric_name() const override { return "recall"; }

  at::Tensor train_loss(const at::Tensor& indices, double* metric) override {
    const int64_t count = indices.size(0);
    // this step's N: from the step seed, the same on every rank
    int64_t records = records_;
    if (min_records_ < records_)
      records =
          min_records_ + static_cast<int64_t>(mix(step_seed_) %
                                              static_cast<uint64_t>(records_ - min_records_ + 1));
    text::RetrievalBatch batch;
    if (ranks_.world_size == 1) {  // torch's generator, seeded by the trainer for this step
      batch = text::make_retrieval_batch(count, records, haystack_, std::nullopt,
                                         at::detail::getDefaultCPUGenerator(), train_filler_);
    } else {  // the global batch as one process draws it; this rank's slice
      auto all =
          text::make_retrieval_batch(count * ranks_.world_size, records, haystack_, std::nullopt,
                                     at::detail::createCPUGenerator(step_seed_), train_filler_);
      const int64_t first = ranks_.rank * count;
      batch = {all.prompts.narrow(0, first, count), all.answers.narrow(0, first, count),
               all.depths.narrow(0, first, count)};
    }
    auto logits = answer_logits(batch);  // [B, 2, 256]
    *metric = logits.detach()
                  .argmax(-1)
                  .eq(batch.answers)
                  .all(-1)
                  .to(torch::kDouble)
                  .mean()
                  .item<double>();
    return torch::cross_entropy_loss(logits.flatten(0, 1), batch.answers.flatten());
  }

  // At the trained N: the answer loss (teacher-forced) and greedy recall over every depth bin.
  Metrics evaluate() override {
    const auto sums = evaluate_records(records_, /*with_loss=*/true);
    const double n = static_cast<double>(depth_bins_ * eval_examples_);
    double correct = 0;
    for (int64_t b = 0; b < depth_bins_; ++b) correct += sums[static_cast<size_t>(b)];
    return {{"loss", sums.back() / (2 * n)}, {"recall", correct / n}};
  }

  std::vector<GeneralizationRow> generalization() override {
    std::vector<GeneralizationRow> rows;
    table_ = DetailTable{};
    table_.name = "recall_by_depth";
    table_.title = std::string("exact-match recall by depth (") +
                   (haystack_ == text::Haystack::kText ? "a record in book text" : "records") + ")";
    table_.row_label = "depth of the gold record";
    table_.col_label = "records in the prompt (prompt bytes)";
    table_.values.assign(static_cast<size_t>(depth_bins_), {});
    for (int64_t b = 0; b < depth_bins_; ++b)
      table_.rows.push_back(std::to_string(std::lround(100.0 * depth_of(b))) + "%");
    for (int64_t n : eval_records_) {
      const int64_t bytes = text::retrieval_prompt_bytes(n);
      // the longest input is the prompt and one answer byte (positions 0 .. bytes): a learned
      // table of that many rows is left as it is at the trained length
      auto restore = model_->transformer->encoder->adapt({bytes + 1});
      const auto sums = evaluate_records(n, /*with_loss=*/false);
      restore();
      double correct = 0;
      for (int64_t b = 0; b < depth_bins_; ++b) {
        const double recall = sums[static_cast<size_t>(b)] / static_cast<double>(eval_examples_);
        table_.values[static_cast<size_t>(b)].push_back(recall);
        correct += sums[static_cast<size_t>(b)];
      }
      table_.cols.push_back(std::to_string(n) + " (" + std::to_string(bytes) + ")");
      rows.push_back({std::to_string(n) + " records (" + std::to_string(bytes) + "-byte prompts)",
                      static_cast<double>(n),
                      {{"recall", correct / static_cast<double>(depth_bins_ * eval_examples_)}}});
    }
    return rows;
  }

  std::vector<DetailTable> details() override {
    if (table_.cols.empty()) return {};
    return {table_};
  }

 private:
  double depth_of(int64_t bin) const {
    return static_cast<double>(bin) / static_cast<double>(depth_bins_ - 1);
  }

  // Logits [B, 2, 256] for the answer bytes: the input is the prompt and the first answer byte.
  at::Tensor answer_logits(const text::RetrievalBatch& batch) {
    const int64_t prompt = batch.prompts.size(1);
    auto input = torch::cat({batch.prompts, batch.answers.narrow(1, 0, 1)}, 1);  // [B, P + 1]
    auto logits = model_(input, Positions::sequence(prompt + 1));                // [B, P + 1, V]
    return logits.narrow(1, prompt - 1, 2);
  }

  // Per depth bin: the number of exact greedy answers; with_loss: the answer loss sum last.
  std::vector<double> evaluate_records(int64_t n, bool with_loss) {
    std::vector<double> sums(static_cast<size_t>(depth_bins_) + 1, 0.0);
    const at::Tensor& filler = eval_filler_;
    int64_t batch_number = 0;
    for (int64_t b = 0; b < depth_bins_; ++b) {
      auto generator = at::detail::createCPUGenerator(kEvalSeed + 1000 * static_cast<uint64_t>(n) +
                                                      static_cast<uint64_t>(b));
      auto all =
          text::make_retrieval_batch(eval_examples_, n, haystack_, depth_of(b), generator, filler);
      for (int64_t begin = 0; begin < eval_examples_; begin += eval_batch_, ++batch_number) {
        if (!ranks_.mine(batch_number)) continue;
        const int64_t count = std::min(eval_batch_, eval_examples_ - begin);
        text::RetrievalBatch part{all.prompts.narrow(0, begin, count),
                                  all.answers.narrow(0, begin, count),
                                  all.depths.narrow(0, begin, count)};
        auto answer = model_->generate(part.prompts, text::kAnswerBytes);  // [count, 2]
        sums[static_cast<size_t>(b)] += answer.eq(part.answers).all(-1).sum().item<double>();
        if (with_loss) {
          auto logits = answer_logits(part);
          sums.back() += torch::cross_entropy_loss(logits.flatten(0, 1), part.answers.flatten(), {},
                                                   at::Reduction::Sum)
                             .item<double>();
        }
      }
    }
    return ranks_.total(sums);
  }

  int64_t records_, min_records_, examples_per_epoch_, depth_bins_, eval_examples_, eval_batch_;
  std::vector<int64_t> eval_records_;
  text::Haystack haystack_;
  at::Tensor train_filler_, eval_filler_;
  DetailTable table_;
  LanguageModel model_{nullptr};
};

}  // namespace

std::unique_ptr<Task> make_retrieval(const nlohmann::json& config) {
  return std::make_unique<RetrievalTask>(config);
}

}  // namespace posenc::train
