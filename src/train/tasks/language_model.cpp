// language_model: a causal byte-level LM on Project Gutenberg books; train short, test long
// (Press et al. 2022, "Train Short, Test Long"). Each book minus its Gutenberg header/footer is
// split: the last eval_fraction of every book is held out. Training draws random windows of
// `context` bytes; evaluation uses fixed windows (seeded) and the mean next-byte cross-entropy
// over every position of the window, reported as perplexity per byte (ppl = exp(loss)) and bits
// per byte (bpb = loss / ln 2).
// Generalization: the same at each of eval_contexts (e.g. 128, 256, 512, 1024). A learned table
// shorter than the context is resampled (linear interpolation) for that evaluation and restored:
// the honest version of "learned positions past their table".
//
// Keys (task): files (["${data}/gutenberg/..."]), eval_fraction (0.1), context (128),
//              windows_per_epoch (8192), eval_windows (64), eval_contexts ([context]),
//              eval_batch (16)
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <functional>

#include "common.h"
#include "tasks.h"
#include "text/gutenberg.h"

namespace posenc::train {
namespace {

class LanguageModelTask : public Task {
 public:
  explicit LanguageModelTask(const nlohmann::json& config) {
    ConfigReader task(config.at("task"), "task");
    task.allow("type");
    const auto books = book_source(task);
    context_ = task.integer("context", 128);
    windows_per_epoch_ = task.integer("windows_per_epoch", 8192);
    eval_windows_ = task.integer("eval_windows", 64);
    eval_batch_ = task.integer("eval_batch", 16);
    contexts_ = {context_};
    if (task.has("eval_contexts")) contexts_ = task.integers("eval_contexts");
    task.finish();
    TORCH_CHECK(context_ > 0 && windows_per_epoch_ > 0 && eval_windows_ > 0 && eval_batch_ > 0,
                "task: context, windows_per_epoch, eval_windows, eval_batch must be > 0");
    TORCH_CHECK(context_ <= kMaxContextTokens, "task: context is ", context_,
                " tokens; the context limit is ", kMaxContextTokens);
    for (int64_t length : contexts_)
      TORCH_CHECK(length > 0 && length <= kMaxContextTokens, "task: eval_contexts must be in [1, ",
                  kMaxContextTokens, "] (the context limit), got ", length);
    auto bytes = load_books(books);
    train_tokens_ = bytes.train;
    eval_tokens_ = bytes.held_out;
    for (int64_t length : contexts_) {
      TORCH_CHECK(length > 0 && eval_tokens_.size(0) > length + 1, "task: eval context ", length,
                  " does not fit the ", eval_tokens_.size(0), " held-out bytes");
    }

    ConfigReader model(config.at("model"), "model");
    auto t = transformer_options(model);
    model.finish();
    t.causal(true);
    if (t.logn_length() == 0) t.logn_length(context_);  // logn: the trained context
    model_ = LanguageModel(LanguageModelOptions(t), encoder_from(config, "encoder", t));
  }

  std::shared_ptr<torch::nn::Module> model() override { return model_.ptr(); }
  int64_t train_size() const override { return windows_per_epoch_; }
  std::string metric_name() const override { return "ppl"; }

  at::Tensor train_loss(const at::Tensor& indices, double* metric) override {
    const int64_t count = indices.size(0);
    text::TextWindows windows;
    if (ranks_.world_size == 1) {
      windows = text::sample_windows(train_tokens_, context_, count);
    } else {  // the global batch's windows, as one process draws them; this rank's slice
      auto all = text::sample_windows(train_tokens_, context_, count * ranks_.world_size,
                                      at::detail::createCPUGenerator(step_seed_));
      windows = {all.inputs.narrow(0, ranks_.rank * count, count),
                 all.targets.narrow(0, ranks_.rank * count, count), all.positions};
    }
    auto logits = model_(on_device(windows.inputs), windows.positions);
    *metric = std::numeric_limits<double>::quiet_NaN();
    return torch::cross_entropy_loss(logits.flatten(0, 1), on_device(windows.targets).flatten());
  }

  Metrics evaluate() override { return evaluate_at(context_); }

  std::vector<GeneralizationRow> generalization() override {
    std::vector<GeneralizationRow> rows;
    for (int64_t length : contexts_) {
      auto restore = fit_encoder_to_length(length);
      rows.push_back(
          {"context " + std::to_string(length), static_cast<double>(length), evaluate_at(length)});
      restore();
    }
    return rows;
  }

 private:
  // Mean next-byte loss over eval_windows fixed windows of `length` bytes (same for every run).
  Metrics evaluate_at(int64_t length) {
    auto rng = data_rng(1234, static_cast<uint64_t>(length));
    std::uniform_int_distribution<int64_t> start(0, eval_tokens_.size(0) - length - 1);
    std::vector<int64_t> starts(static_cast<size_t>(eval_windows_));
    for (auto& s : starts) s = start(rng);
    double total = 0;
    for (int64_t begin = 0, batch = 0; begin < eval_windows_; begin += eval_batch_, ++batch) {
      if (!ranks_.mine(batch)) continue;
      const int64_t count = std::min(eval_batch_, eval_windows_ - begin);
      auto first = torch::tensor(
                       std::vector<int64_t>(starts.begin() + begin, starts.begin() + begin + count))
                       .view({count, 1});
      auto index = first + torch::arange(length + 1, torch::kLong);
      auto windows =
          on_device(eval_tokens_.index_select(0, index.flatten()).view({count, length + 1}));
      auto logits = model_(windows.narrow(1, 0, length), Positions::sequence(length));
      total +=
          torch::cross_entropy_loss(logits.flatten(0, 1), windows.narrow(1, 1, length).flatten(),
                                    {}, at::Reduction::Sum)
              .item<double>();
    }
    total = ranks_.total({total})[0];
    const double loss = total / static_cast<double>(eval_windows_ * length);
    return {{"loss", loss}, {"ppl", std::exp(loss)}, {"bpb", loss / std::log(2.0)}};
  }

  // Position-bound tables (a learned table) stretched over a longer context, through the
  // interface: position p then reads the table at p * L / length. Returns the undo.
  std::function<void()> fit_encoder_to_length(int64_t length) {
    return model_->transformer->encoder->adapt({length});
  }

  at::Tensor train_tokens_, eval_tokens_;
  int64_t context_, windows_per_epoch_, eval_windows_, eval_batch_;
  std::vector<int64_t> contexts_;
  LanguageModel model_{nullptr};
};

}  // namespace

std::unique_ptr<Task> make_language_model(const nlohmann::json& config) {
  return std::make_unique<LanguageModelTask>(config);
}

}  // namespace posenc::train
