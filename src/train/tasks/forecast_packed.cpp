// forecast_packed: multivariate sensor forecasting the way the time-series foundation models
// feed their transformers (Moirai / uni2ts, Chronos-2, TimesFM 2.5, Toto), to ask whether real
// timestamps beat patch indices where sampling is irregular (docs/experiments.md, "irregular
// sampling").
//
// Data: several real series (task.series, each one CSV column: a variate), every variate losing
// readings on its own (sensor loss): each reading at random with drop_probability, and bursts
// (a burst starts after a kept reading with burst_probability and removes min_burst..max_burst
// readings), so variates are sampled at different, uneven times. Each CSV is read as
// timeseries::load_csv reads it with kSort and kDropRow: rows out of time order sorted (stable),
// duplicate timestamps kept (a patch may start where the previous one did), an empty reading's
// row dropped, a NaN/inf reading or an unparseable timestamp one line naming the file and line.
// A sample: a cutoff time c; for each variate the last k * patch readings before c (k context
// patches, k in [min_context_patches, max_context_patches], varying per sample) and the next
// `patch` readings at or after c (the patch to forecast). Tokens are (patch, variate), variate-
// major; each variate scaled by its context's mean and std (as Moirai and Chronos scale each
// series); the patch to forecast enters as the model's query token. Samples are packed into rows
// of pack_tokens tokens (sample ids, attention within a sample; timeseries::pack_samples).
// Positions (axes time, variate): time = the patch index 0..k (positions: index, the field's
// recipe: gaps invisible), or the elapsed time of each patch's first reading since c, in
// time_unit (positions: time, posenc's: gaps visible); variate = the variate's id (for a
// variate_bias part).
// Split by time: cutoffs in the first train_fraction of the common time range train (their
// forecast readings too), later ones evaluate (eval_samples cutoffs, evenly spaced).
// Metrics (data units): mae over every forecast reading; mase = the mean over (sample, variate)
// of that pair's MAE over the MAE of the naive one-step forecast inside its context (Hyndman &
// Koehler 2006, in-sample scaling); mae_last / mase_last for persistence (the last context
// reading repeated). After training, MAE and MASE by the largest gap between consecutive
// readings of the (sample, variate), in gap_unit (generalization rows; gap_bins the lower edges).
//
// Keys (task): series [{file, time_column, value_column}] (2+), patch (4), min_context_patches
//   (4), max_context_patches (12), positions (index | time), time_unit (3600 s), gap_unit
//   (3600 s), gap_bins ([1, 2, 4, 8, 16]), drop_probability (0.2), burst_probability (0.01),
//   min_burst (2), max_burst (24), train_fraction (0.8), pack_tokens (128), eval_samples (512),
//   eval_batch (128)
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "common.h"
#include "posenc/core/ids.h"
#include "tasks.h"
#include "timeseries/csv_series.h"
#include "timeseries/packing.h"

namespace posenc::train {
namespace {

struct Variate {
  std::vector<double> times;  // epoch seconds, ascending, after the losses
  std::vector<float> values;
};

// Losses of one variate: at random with probability p, and bursts of min..max readings.
Variate with_losses(const timeseries::Series& series, double p, double burst, int64_t min_burst,
                    int64_t max_burst, std::mt19937_64& rng) {
  auto times = series.times.contiguous();
  auto values = series.values.select(1, 0).contiguous();
  const auto* t = times.data_ptr<double>();
  const auto* v = values.data_ptr<float>();
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::uniform_int_distribution<int64_t> length(min_burst, max_burst);
  Variate out;
  for (int64_t i = 0; i < times.size(0); ++i) {
    if (unit(rng) < p) continue;
    out.times.push_back(t[i]);
    out.values.push_back(v[i]);
    if (burst > 0 && unit(rng) < burst) i += length(rng);  // the next readings are lost
  }
  return out;
}

class ForecastPackedTask : public Task {
 public:
  explicit ForecastPackedTask(const nlohmann::json& config, uint64_t seed) {
    ConfigReader task(config.at("task"), "task");
    task.allow("type");
    task.allow("series");
    patch_ = task.integer("patch", 4);
    min_patches_ = task.integer("min_context_patches", 4);
    max_patches_ = task.integer("max_context_patches", 12);
    const auto mode = task.string("positions", "index");
    time_unit_ = task.number("time_unit", 3600.0);
    gap_unit_ = task.number("gap_unit", 3600.0);
    gap_bins_ =
        task.has("gap_bins") ? task.numbers("gap_bins") : std::vector<double>{1, 2, 4, 8, 16};
    const double drop = task.number("drop_probability", 0.2);
    const double burst = task.number("burst_probability", 0.01);
    const int64_t min_burst = task.integer("min_burst", 2),
                  max_burst = task.integer("max_burst", 24);
    const double train_fraction = task.number("train_fraction", 0.8);
    pack_tokens_ = task.integer("pack_tokens", 128);
    const int64_t eval_samples = task.integer("eval_samples", 512);
    eval_batch_ = task.integer("eval_batch", 128);
    task.finish();
    TORCH_CHECK(mode == "index" || mode == "time",
                "task: positions must be 'index' or 'time', got '", mode, "'");
    use_time_ = mode == "time";
    TORCH_CHECK(patch_ >= 1 && min_patches_ >= 1 && max_patches_ >= min_patches_,
                "task: patch and min_context_patches must be >= 1 and max_context_patches >= "
                "min_context_patches, got ",
                patch_, ", ", min_patches_, ", ", max_patches_);
    TORCH_CHECK(time_unit_ > 0 && gap_unit_ > 0 && !gap_bins_.empty() &&
                    std::is_sorted(gap_bins_.begin(), gap_bins_.end()),
                "task: time_unit and gap_unit must be > 0 and gap_bins a non-empty ascending list");
    TORCH_CHECK(drop >= 0 && drop < 1 && burst >= 0 && burst < 1 && min_burst >= 1 &&
                    max_burst >= min_burst,
                "task: drop_probability and burst_probability must be in [0, 1), 1 <= min_burst "
                "<= max_burst");
    TORCH_CHECK(train_fraction > 0 && train_fraction < 1,
                "task: train_fraction must be in (0, 1), got ", train_fraction);
    TORCH_CHECK(eval_samples >= 1 && eval_batch_ >= 1, "task: eval_samples and eval_batch >= 1");

    // ---- the variates, each losing readings on its own ----
    const auto& list = config.at("task").contains("series") ? config.at("task")["series"]
                                                            : nlohmann::json::array();
    TORCH_CHECK(list.is_array() && !list.empty(),
                "task: 'series' must be a list of {file, time_column, value_column}");
    at::Tensor grid;  // variate 0's full time grid: the cutoff candidates
    for (size_t v = 0; v < list.size(); ++v) {
      ConfigReader s(list[v], "task.series[" + std::to_string(v) + "]");
      const auto file = resolve_data_path(s.string("file", ""));
      const auto time_column = s.string("time_column", "date");
      const auto value_column = s.string("value_column", "");
      s.finish();
      TORCH_CHECK(!file.empty() && !value_column.empty(), s.where(),
                  ": 'file' and 'value_column' are required");
      auto series =
          timeseries::load_csv(file, time_column, {value_column}, timeseries::OrderPolicy::kSort,
                               timeseries::MissingPolicy::kDropRow);
      if (v == 0) grid = series.times;
      auto rng = data_rng(seed, 1000 + v);
      variates_.push_back(with_losses(series, drop, burst, min_burst, max_burst, rng));
      TORCH_CHECK(
          static_cast<int64_t>(variates_.back().times.size()) >= (max_patches_ + 1) * patch_ * 2,
          s.where(), ": ", file, " keeps ", variates_.back().times.size(),
          " readings after the losses; too few for a sample");
    }

    // ---- cutoffs: every variate has k_max context patches before and one patch after ----
    double first = -INFINITY, last = INFINITY;
    for (const auto& v : variates_) {
      first = std::max(first, v.times.front());
      last = std::min(last, v.times.back());
    }
    const double split = first + train_fraction * (last - first);
    const int64_t need = max_patches_ * patch_;
    std::vector<int64_t> train, eval;
    auto g = grid.contiguous();
    for (int64_t i = 0; i < g.size(0); ++i) {
      const double c = g.data_ptr<double>()[i];
      std::vector<int64_t> at_cut;
      bool ok = true;
      bool before_split = true;
      for (const auto& v : variates_) {
        const auto j = static_cast<int64_t>(std::lower_bound(v.times.begin(), v.times.end(), c) -
                                            v.times.begin());
        if (j < need || j + patch_ > static_cast<int64_t>(v.times.size()))
          ok = false;
        else if (v.times[j + patch_ - 1] >= split)
          before_split = false;
        at_cut.push_back(j);
      }
      if (!ok) continue;
      const int64_t k = static_cast<int64_t>(cutoffs_.size());
      cutoffs_.push_back(c);
      cut_index_.push_back(at_cut);
      if (before_split)
        train.push_back(k);
      else if (c >= split)
        eval.push_back(k);
    }
    TORCH_CHECK(!train.empty() && !eval.empty(), "task: no ",
                train.empty() ? "training" : "held-out", " cutoffs with ", max_patches_,
                " context patches in every variate");
    train_ = train;
    const auto stride = std::max<size_t>(1, eval.size() / static_cast<size_t>(eval_samples));
    for (size_t i = 0; i < eval.size() && static_cast<int64_t>(eval_.size()) < eval_samples;
         i += stride)
      eval_.push_back(eval[i]);

    ConfigReader model(config.at("model"), "model");
    auto t = transformer_options(model);
    model.finish();
    model_ = Forecaster(ForecasterOptions(patch_, t), encoder_from(config, "encoder", t));
  }

  std::shared_ptr<torch::nn::Module> model() override { return model_.ptr(); }
  int64_t train_size() const override { return static_cast<int64_t>(train_.size()); }
  std::string metric_name() const override { return "mae"; }

  at::Tensor train_loss(const at::Tensor& indices, double* metric) override {
    auto idx = indices.to(torch::kCPU, torch::kLong).contiguous();
    std::vector<int64_t> cuts;
    for (int64_t i = 0; i < idx.size(0); ++i) cuts.push_back(train_[idx.data_ptr<int64_t>()[i]]);
    auto out = predict(cuts);
    *metric = std::numeric_limits<double>::quiet_NaN();
    return torch::mse_loss(out.prediction, on_device(out.target));
  }

  Metrics evaluate() override {
    auto sums = evaluation();
    const double n = std::max(1.0, sums.readings), pairs = std::max(1.0, sums.pairs);
    return {{"loss", sums.squared / n},
            {"mae", sums.absolute / n},
            {"mase", sums.scaled / pairs},
            {"mae_last", sums.persistence / n},
            {"mase_last", sums.scaled_persistence / pairs}};
  }

  std::vector<GeneralizationRow> generalization() override {
    auto sums = evaluation();
    std::vector<GeneralizationRow> rows;
    for (size_t b = 0; b < gap_bins_.size(); ++b) {
      const auto& bin = sums.bins[b];
      if (bin.pairs == 0) continue;
      std::ostringstream setting;
      setting << "largest gap >= " << gap_bins_[b];
      if (b + 1 < gap_bins_.size()) setting << " and < " << gap_bins_[b + 1];
      rows.push_back({setting.str(),
                      gap_bins_[b],
                      {{"mae", bin.absolute / bin.readings},
                       {"mase", bin.scaled / bin.pairs},
                       {"mae_last", bin.persistence / bin.readings},
                       {"pairs", bin.pairs}}});
    }
    return rows;
  }

 private:
  struct Predicted {
    at::Tensor prediction, target;  // [S * V, patch] normalized units (prediction on the device)
    at::Tensor mean, std;           // [S * V] the scaling of each (sample, variate)
    std::vector<double> naive;      // [S * V] MAE of the in-context naive one-step forecast
    std::vector<double> last;       // [S * V] the last context reading (data units)
    std::vector<double> gap;        // [S * V] the largest gap between readings, in gap_unit
  };
  struct Bin {
    double readings = 0, pairs = 0, absolute = 0, scaled = 0, persistence = 0;
  };
  struct Sums {
    double readings = 0, pairs = 0, squared = 0, absolute = 0, scaled = 0, persistence = 0,
           scaled_persistence = 0;
    std::vector<Bin> bins;
  };

  // Context patches of the sample at cutoff number k (varies with k, the same in every run).
  int64_t context_patches(int64_t k) const {
    const auto range = static_cast<uint64_t>(max_patches_ - min_patches_ + 1);
    return min_patches_ + static_cast<int64_t>((static_cast<uint64_t>(k) * 2654435761ULL) % range);
  }

  Predicted predict(const std::vector<int64_t>& cuts) {
    const int64_t nv = static_cast<int64_t>(variates_.size());
    std::vector<timeseries::PackSample> samples;
    std::vector<at::Tensor> targets, means, stds;
    Predicted out;
    for (const int64_t k : cuts) {
      const int64_t patches = context_patches(k);
      const int64_t n = patches + 1, readings = n * patch_;
      timeseries::PackSample sample;
      std::vector<at::Tensor> tokens, time, variate;
      for (int64_t v = 0; v < nv; ++v) {
        const auto& var = variates_[v];
        const int64_t begin = cut_index_[k][v] - patches * patch_;
        auto t = torch::from_blob(const_cast<double*>(var.times.data()) + begin, {readings},
                                  torch::kFloat64)
                     .clone();
        auto x = torch::from_blob(const_cast<float*>(var.values.data()) + begin, {readings},
                                  torch::kFloat32)
                     .clone();
        auto context = x.narrow(0, 0, patches * patch_);
        const double mean = context.mean().item<double>();
        const double std = std::max(context.std(false).item<double>(), 1e-3);
        auto scaled = ((x - mean) / std).view({n, patch_});
        targets.push_back(scaled[patches].clone());
        scaled[patches].zero_();  // the patch to forecast: the model sees where, not what
        tokens.push_back(scaled);
        auto starts = t.view({n, patch_}).select(1, 0);
        time.push_back(use_time_ ? (starts - cutoffs_[k]) / time_unit_
                                 : torch::arange(n, torch::kFloat64));
        variate.push_back(torch::full({n}, v, torch::kLong));
        means.push_back(torch::tensor(mean, torch::kFloat64));
        stds.push_back(torch::tensor(std, torch::kFloat64));
        out.naive.push_back(context.diff().abs().mean().item<double>());
        out.last.push_back(context[-1].item<double>());
        out.gap.push_back(t.diff().max().item<double>() / gap_unit_);
      }
      sample.tokens = torch::cat(tokens, 0);
      sample.time = torch::cat(time, 0);
      sample.variate = torch::cat(variate, 0);
      sample.observed = torch::ones({n * nv}, torch::kBool);
      for (int64_t v = 0; v < nv; ++v) sample.observed[v * n + patches] = false;
      samples.push_back(std::move(sample));
    }
    auto packed = timeseries::pack_samples(samples, pack_tokens_);
    auto y = model_->forward_packed(on_device(packed.tokens), on_device(packed.observed),
                                    packed.positions, on_device(packed.sample_ids));
    // the forecast token of each (sample, variate), in sample order
    std::vector<int64_t> rows, cols;
    for (size_t s = 0; s < samples.size(); ++s) {
      const int64_t n = samples[s].tokens.size(0) / nv;
      for (int64_t v = 0; v < nv; ++v) {
        rows.push_back(packed.row[s]);
        cols.push_back(packed.offset[s] + v * n + n - 1);
      }
    }
    auto r = on_device(torch::tensor(rows, torch::kLong));
    auto c = on_device(torch::tensor(cols, torch::kLong));
    out.prediction = y.index({r, c});  // [S * V, patch]
    out.target = torch::stack(targets);
    out.mean = torch::stack(means);
    out.std = torch::stack(stds);
    return out;
  }

  Sums evaluation() {
    Sums sums;
    sums.bins.resize(gap_bins_.size());
    const int64_t count = static_cast<int64_t>(eval_.size());
    for (int64_t begin = 0, batch = 0; begin < count; begin += eval_batch_, ++batch) {
      if (!ranks_.mine(batch)) continue;
      std::vector<int64_t> cuts(eval_.begin() + begin,
                                eval_.begin() + std::min(count, begin + eval_batch_));
      auto p = predict(cuts);
      auto prediction = p.prediction.to(torch::kCPU, torch::kFloat64);
      auto target = p.target.to(torch::kFloat64);
      sums.squared += (prediction - target).pow(2).sum().item<double>();
      // data units: x * std + mean
      auto scale = p.std.unsqueeze(1), shift = p.mean.unsqueeze(1);
      auto error = ((prediction - target) * scale).abs();  // [S * V, patch]
      auto actual = target * scale + shift;
      auto last = torch::tensor(p.last, torch::kFloat64).unsqueeze(1);
      auto persistence = (actual - last).abs();
      auto pair_error = error.mean(1), pair_persistence = persistence.mean(1);
      for (int64_t i = 0; i < error.size(0); ++i) {
        const double e = pair_error[i].item<double>(), pe = pair_persistence[i].item<double>();
        const double naive = p.naive[i];
        sums.readings += static_cast<double>(patch_);
        sums.absolute += e * static_cast<double>(patch_);
        sums.persistence += pe * static_cast<double>(patch_);
        if (naive > 0) {
          sums.pairs += 1;
          sums.scaled += e / naive;
          sums.scaled_persistence += pe / naive;
        }
        // the bin of this pair's largest gap
        int64_t b = static_cast<int64_t>(gap_bins_.size()) - 1;
        while (b > 0 && p.gap[i] < gap_bins_[b]) --b;
        if (p.gap[i] < gap_bins_[0] || naive <= 0) continue;
        auto& bin = sums.bins[b];
        bin.readings += static_cast<double>(patch_);
        bin.pairs += 1;
        bin.absolute += e * static_cast<double>(patch_);
        bin.persistence += pe * static_cast<double>(patch_);
        bin.scaled += e / naive;
      }
    }
    auto total = ranks_.total({sums.readings, sums.pairs, sums.squared, sums.absolute, sums.scaled,
                               sums.persistence, sums.scaled_persistence});
    sums.readings = total[0];
    sums.pairs = total[1];
    sums.squared = total[2];
    sums.absolute = total[3];
    sums.scaled = total[4];
    sums.persistence = total[5];
    sums.scaled_persistence = total[6];
    for (auto& bin : sums.bins) {
      auto b = ranks_.total({bin.readings, bin.pairs, bin.absolute, bin.scaled, bin.persistence});
      bin = {b[0], b[1], b[2], b[3], b[4]};
    }
    return sums;
  }

  int64_t patch_, min_patches_, max_patches_, pack_tokens_, eval_batch_;
  double time_unit_, gap_unit_;
  bool use_time_ = false;
  std::vector<double> gap_bins_;
  std::vector<Variate> variates_;
  std::vector<double> cutoffs_;
  std::vector<std::vector<int64_t>> cut_index_;  // [cutoff][variate]: first reading at/after c
  std::vector<int64_t> train_, eval_;            // cutoff numbers
  Forecaster model_{nullptr};
};

}  // namespace

std::unique_ptr<Task> make_forecast_packed(const nlohmann::json& config) {
  const uint64_t seed = config.value("seed", uint64_t{0});
  return std::make_unique<ForecastPackedTask>(config, seed);
}

}  // namespace posenc::train
