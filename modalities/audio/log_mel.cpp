// Log-mel spectrogram and mel filterbank; formulas and sources in log_mel.h.
#include "audio/log_mel.h"

#include <torch/torch.h>

#include <cmath>

namespace posenc::audio {

MelScale mel_scale_from_string(const std::string& name) {
  if (name == "htk") return MelScale::kHtk;
  if (name == "slaney") return MelScale::kSlaney;
  TORCH_CHECK(false, "log_mel: unknown mel_scale '", name, "'; expected one of: htk, slaney");
}

MelNorm mel_norm_from_string(const std::string& name) {
  if (name == "none") return MelNorm::kNone;
  if (name == "slaney") return MelNorm::kSlaney;
  TORCH_CHECK(false, "log_mel: unknown norm '", name, "'; expected one of: none, slaney");
}

PadMode pad_mode_from_string(const std::string& name) {
  if (name == "constant") return PadMode::kConstant;
  if (name == "reflect") return PadMode::kReflect;
  TORCH_CHECK(false, "log_mel: unknown pad_mode '", name, "'; expected one of: constant, reflect");
}

void LogMelOptions::validate() const {
  TORCH_CHECK(sample_rate > 0 && sample_rate <= 1000000,
              "log_mel: sample_rate must be in (0, 1e6], got ", sample_rate);
  TORCH_CHECK(n_fft >= 2 && n_fft <= kMaxFftSize, "log_mel: n_fft must be in [2, ", kMaxFftSize,
              "], got ", n_fft);
  TORCH_CHECK(win_length >= 0 && win_length <= n_fft,
              "log_mel: win_length must be in [0, n_fft = ", n_fft, "] (0 = n_fft), got ",
              win_length);
  TORCH_CHECK(hop_length >= 1, "log_mel: hop_length must be >= 1, got ", hop_length);
  TORCH_CHECK(n_mels >= 1 && n_mels <= kMaxMels, "log_mel: n_mels must be in [1, ", kMaxMels,
              "], got ", n_mels);
  const double top = f_max > 0 ? f_max : sample_rate / 2.0;
  TORCH_CHECK(f_min >= 0 && f_min < top && top <= sample_rate / 2.0,
              "log_mel: need 0 <= f_min < f_max <= sample_rate / 2 = ", sample_rate / 2.0,
              ", got f_min ", f_min, ", f_max ", top);
  TORCH_CHECK(power > 0, "log_mel: power must be > 0, got ", power);
  TORCH_CHECK(log_floor > 0, "log_mel: log_floor must be > 0, got ", log_floor);
}

int64_t LogMelOptions::frames(int64_t samples) const {
  if (center) return 1 + samples / hop_length;
  return samples < n_fft ? 0 : 1 + (samples - n_fft) / hop_length;
}

namespace {
// Slaney's scale: linear (200/3 Hz per mel) below 1 kHz, logarithmic (ln 6.4 / 27 per mel) above.
constexpr double kSlaneyHzPerMel = 200.0 / 3, kMinLogHz = 1000.0,
                 kMinLogMel = kMinLogHz / kSlaneyHzPerMel;
const double kLogStep = std::log(6.4) / 27.0;
}  // namespace

double hz_to_mel(double hz, MelScale scale) {
  if (scale == MelScale::kHtk) return 2595.0 * std::log10(1.0 + hz / 700.0);
  return hz >= kMinLogHz ? kMinLogMel + std::log(hz / kMinLogHz) / kLogStep : hz / kSlaneyHzPerMel;
}

double mel_to_hz(double mel, MelScale scale) {
  if (scale == MelScale::kHtk) return 700.0 * (std::pow(10.0, mel / 2595.0) - 1.0);
  return mel >= kMinLogMel ? kMinLogHz * std::exp(kLogStep * (mel - kMinLogMel))
                           : kSlaneyHzPerMel * mel;
}

at::Tensor mel_filterbank(const LogMelOptions& options) {
  options.validate();
  const int64_t bins = 1 + options.n_fft / 2, n = options.n_mels;
  const double top = options.f_max > 0 ? options.f_max : options.sample_rate / 2.0;
  const auto f64 = torch::TensorOptions().dtype(torch::kDouble);
  auto fft_hz = torch::linspace(0, options.sample_rate / 2.0, bins, f64);  // [bins]
  const double lo = hz_to_mel(options.f_min, options.scale);
  const double hi = hz_to_mel(top, options.scale);
  std::vector<double> points(static_cast<size_t>(n + 2));
  for (int64_t i = 0; i < n + 2; ++i)
    points[static_cast<size_t>(i)] = mel_to_hz(
        lo + (hi - lo) * static_cast<double>(i) / static_cast<double>(n + 1), options.scale);
  auto hz = torch::tensor(points, f64);                          // [n + 2]
  auto width = hz.narrow(0, 1, n + 1) - hz.narrow(0, 0, n + 1);  // [n + 1]
  auto ramps = hz.unsqueeze(1) - fft_hz.unsqueeze(0);            // [n + 2, bins]
  auto lower = -ramps.narrow(0, 0, n) / width.narrow(0, 0, n).unsqueeze(1);
  auto upper = ramps.narrow(0, 2, n) / width.narrow(0, 1, n).unsqueeze(1);
  auto bank = torch::clamp_min(torch::minimum(lower, upper), 0.0);  // [n, bins]
  if (options.norm == MelNorm::kSlaney)
    bank = bank * (2.0 / (hz.narrow(0, 2, n) - hz.narrow(0, 0, n))).unsqueeze(1);
  return bank.t().contiguous();  // [bins, n]
}

at::Tensor log_mel_spectrogram(const at::Tensor& samples, const LogMelOptions& options) {
  options.validate();
  TORCH_CHECK(samples.dim() == 1 || samples.dim() == 2,
              "log_mel: samples must be [T] or [B, T], got shape ", samples.sizes());
  TORCH_CHECK(samples.is_floating_point(), "log_mel: samples must be floating point, got ",
              samples.scalar_type());
  const int64_t length = samples.size(-1);
  TORCH_CHECK(options.frames(length) >= 1, "log_mel: ", length,
              " samples make no frame (an uncentred window needs n_fft = ", options.n_fft, ")");
  if (options.center && options.pad == PadMode::kReflect)
    TORCH_CHECK(length > options.n_fft / 2,
                "log_mel: reflect padding needs more than n_fft / 2 = ", options.n_fft / 2,
                " samples, got ", length);
  const int64_t win = options.win_length > 0 ? options.win_length : options.n_fft;
  auto x = samples.to(torch::kFloat);
  auto window = torch::hann_window(win, /*periodic=*/true, torch::dtype(torch::kFloat));
  auto spectrum = torch::stft(x, options.n_fft, options.hop_length, win, window, options.center,
                              options.pad == PadMode::kReflect ? "reflect" : "constant",
                              /*normalized=*/false, /*onesided=*/true,
                              /*return_complex=*/true);  // [..., bins, frames]
  auto power = spectrum.abs();
  if (options.power != 1.0) power = power.pow(options.power);
  auto bank = mel_filterbank(options).to(torch::kFloat);    // [bins, n_mels]
  auto mel = torch::matmul(power.transpose(-1, -2), bank);  // [..., frames, n_mels]
  return mel.clamp_min(options.log_floor).log();
}

}  // namespace posenc::audio
