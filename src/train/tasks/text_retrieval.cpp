// retrieval: "lost in the middle" (Liu et al. 2023) on a byte-level causal LM. Prompts from
// text/retrieval.h: N records "KK=VV;" (or one record hidden in book text), then "?KK="; the
// model must answer the gold record's "VV".
//   loss: cross-entropy on the two answer bytes only (teacher-forced: the input is the prompt
//         and the first answer byte; logits at the last two positions)
//   recall: exact match of both bytes under greedy decoding (a key-value cache), the metric
// Training draws the gold record at a uniform depth; with min_records < records, each step's
// prompts hold N records, N uniform in [min_records, records] (the same N for the whole batch,
// drawn from the step's seed): short prompts teach the lookup before long ones dilute it.
// With train_queries Q > 1 (records haystack only), a training prompt asks Q queries after its
// records, each "?KK=VV" with its answer, for Q distinct records (the first one's answer is the
// prompt an evaluation asks; later ones see the earlier queries; at most N queries for a prompt
// of N records): 2 Q supervised bytes per prompt instead of 2 (the multi-query associative recall
// of Arora et al. 2023, "Zoology"), for 6 (Q - 1) more bytes. Evaluation always asks one query.
// Evaluation: depth_bins bins (0, 10, ..., 100% for 11), eval_examples prompts per bin, at each of
// eval_records (N records; prompts of 6 N + 4 bytes); the same prompts for every run (seeded by N
// and bin). After training: a row per N (recall averaged over the bins) and the depth x N table
// (details: recall_by_depth.md, recall_by_depth.png). A learned table shorter than a prompt is
// stretched over it (adapt), as in the language_model task.
//
// Keys (task): records (20), min_records (records), eval_records ([records]),
//              haystack (records | text), train_queries (1),
//              examples_per_epoch (16384), depth_bins (11), eval_examples (200),
//              eval_batch (200), files (the Gutenberg books; text haystack), eval_fraction (0.1)
// Keys (model): transformer keys (causal is forced on)
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <limits>
#include <sstream>

#include "common.h"
#include "tasks.h"
#include "text/retrieval.h"

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
    train_queries_ = task.integer("train_queries", 1);
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
    TORCH_CHECK(train_queries_ >= 1 && train_queries_ <= records_,
                "task: train_queries must be in [1, records = ", records_,
                "] (distinct records per prompt), got ", train_queries_);
    TORCH_CHECK(
        train_queries_ == 1 || haystack_ == text::Haystack::kRecords,
        "task: train_queries > 1 needs haystack: records (a text haystack holds one record), "
        "got ",
        train_queries_);
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
      auto generator = at::detail::getDefaultCPUGenerator();
      batch = text::make_retrieval_batch(count, records, haystack_, std::nullopt, generator,
                                         train_filler_);
      if (train_queries_ > 1 && records > 1) add_queries(batch, records, generator);
    } else {  // the global batch as one process draws it; this rank's slice
      auto generator = at::detail::createCPUGenerator(step_seed_);
      auto all = text::make_retrieval_batch(count * ranks_.world_size, records, haystack_,
                                            std::nullopt, generator, train_filler_);
      if (train_queries_ > 1 && records > 1) add_queries(all, records, generator);
      const int64_t first = ranks_.rank * count;
      batch = {all.prompts.narrow(0, first, count), all.answers.narrow(0, first, count),
               all.depths.narrow(0, first, count)};
    }
    batch = {on_device(batch.prompts), on_device(batch.answers), batch.depths};
    auto logits = answer_logits(batch);  // [B, 2 Q, 256]
    *metric = logits.detach()
                  .argmax(-1)
                  .eq(batch.answers)
                  .view({count, -1, text::kAnswerBytes})
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
    // the loss and the greedy accuracy of each answer byte alone (which byte fails)
    const size_t extra = static_cast<size_t>(depth_bins_);
    return {{"loss", sums[extra + 2] / (2 * n)},
            {"recall", correct / n},
            {"first_byte", sums[extra] / n},
            {"second_byte", sums[extra + 1] / n}};
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

  // Logits [B, 2 Q, 256] for the answer bytes. Q = 1: the input is the prompt and the first
  // answer byte. Q > 1 (add_queries): the prompt ends with Q - 1 answered queries before the last.
  at::Tensor answer_logits(const text::RetrievalBatch& batch) {
    const int64_t prompt = batch.prompts.size(1);
    auto input = torch::cat({batch.prompts, batch.answers.narrow(1, -2, 1)}, 1);  // [B, P + 1]
    auto logits = model_(input, Positions::sequence(prompt + 1));                 // [B, P + 1, V]
    const int64_t queries = batch.answers.size(1) / text::kAnswerBytes;
    if (queries == 1) return logits.narrow(1, prompt - 1, 2);
    // query j's answer bytes sit at hay + 6 j + 4 and + 5: predicted from the positions before
    const int64_t hay = prompt - 6 * (queries - 1) - text::kQueryBytes;
    auto at = torch::arange(queries, input.options()) * 6 + (hay + text::kQueryBytes - 1);  // [Q]
    at = torch::stack({at, at + 1}, -1).flatten();                                          // [2 Q]
    return logits.index_select(1, at);
  }

  // Turns a one-query records batch into a Q-query one: the prompt's own query first (its
  // answer appended), then Q - 1 more records asked in a random order, each "?KK=VV" but the last
  // one's answer. prompts [B, 6 N + 4] -> [B, 6 N + 6 Q - 2]; answers [B, 2] -> [B, 2 Q].
  void add_queries(text::RetrievalBatch& batch, int64_t records, at::Generator generator) {
    const int64_t count = batch.prompts.size(0), hay = text::kRecordBytes * records;
    const int64_t asks = std::min(train_queries_, records);  // Q
    auto body = batch.prompts.narrow(1, 0, hay).view({count, records, text::kRecordBytes});
    // the gold record's index: its depth is index / (N - 1) (records > 1 here)
    auto gold = (batch.depths * static_cast<double>(records - 1)).round().to(torch::kLong);
    // Q - 1 other records: a random order of the rest (the gold one sorted last)
    auto order = torch::rand({count, records}, generator)
                     .scatter_(1, gold.view({count, 1}), 2.0)
                     .argsort(-1, false)
                     .narrow(1, 0, asks - 1);                                    // [B, Q - 1]
    auto asked = torch::cat({gold.view({count, 1}), order}, 1);                  // [B, Q]
    auto picked = body.gather(1, asked.unsqueeze(-1).expand({count, asks, 6}));  // [B,Q,6]
    auto key = picked.narrow(2, 0, 2);
    auto value = picked.narrow(2, 3, 2);
    auto longs = torch::TensorOptions().dtype(torch::kLong);
    auto queries = torch::cat({torch::full({count, asks, 1}, '?', longs), key,
                               torch::full({count, asks, 1}, '=', longs), value},
                              -1)
                       .flatten(1);  // [B, 6 Q]
    batch.prompts = torch::cat({body.flatten(1), queries.narrow(1, 0, 6 * asks - 2)}, 1);
    batch.answers = value.flatten(1);  // [B, 2 Q]
  }

  // Per depth bin: the number of exact greedy answers; then the counts of right first and second
  // bytes (greedy), and with_loss: the teacher-forced answer loss sum.
  std::vector<double> evaluate_records(int64_t n, bool with_loss) {
    const size_t extra = static_cast<size_t>(depth_bins_);
    std::vector<double> sums(extra + 3, 0.0);
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
        text::RetrievalBatch part{on_device(all.prompts.narrow(0, begin, count)),
                                  on_device(all.answers.narrow(0, begin, count)),
                                  all.depths.narrow(0, begin, count)};
        auto answer = model_->generate(part.prompts, text::kAnswerBytes);  // [count, 2]
        auto right = answer.eq(part.answers);                              // [count, 2]
        sums[static_cast<size_t>(b)] += right.all(-1).sum().item<double>();
        sums[extra] += right.select(1, 0).sum().item<double>();
        sums[extra + 1] += right.select(1, 1).sum().item<double>();
        if (with_loss) {
          auto logits = answer_logits(part);
          sums[extra + 2] += torch::cross_entropy_loss(logits.flatten(0, 1), part.answers.flatten(),
                                                       {}, at::Reduction::Sum)
                                 .item<double>();
        }
      }
    }
    return ranks_.total(sums);
  }

  int64_t records_, min_records_, train_queries_, examples_per_epoch_, depth_bins_, eval_examples_,
      eval_batch_;
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
