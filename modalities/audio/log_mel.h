// Log-mel spectrograms in LibTorch: the front end of AST, Whisper and Qwen2.5-Omni's audio
// encoder.
//
//   X[f, m]  = sum_n w[n] x[m hop + n - pad] e^{-2 pi i f n / n_fft}     (torch::stft; Hann
//              window w of win_length, periodic, centred in n_fft; pad = n_fft / 2 when
//              centred, with zeros or a reflection)
//   P[f, m]  = |X[f, m]|^power                                          (power 2: energy)
//   M[k, m]  = sum_f B[f, k] P[f, m]                                    (mel filterbank B)
//   out[m,k] = ln(max(M[k, m], log_floor))                              [frames, n_mels]
// Filterbank (librosa.filters.mel, Slaney 1998 "Auditory Toolbox"): n_mels + 2 points evenly
// spaced on the mel scale between f_min and f_max, triangle k rising from point k to k + 1 and
// falling to k + 2, evaluated at the FFT bin frequencies f * sr / n_fft;
//   mel scale  htk:    mel = 2595 log10(1 + hz / 700)
//              slaney: mel = 3 hz / 200 below 1 kHz, 15 + 27 ln(hz / 1000) / ln(6.4) above
//   norm       slaney: triangle k scaled by 2 / (hz[k + 2] - hz[k]) (equal area); none: peak 1
// Checked against librosa 0.11 (tests/fixtures/log_mel.json, tools/gen_fixtures_audio.py).
// Frames: centred 1 + T / hop; not centred 1 + (T - n_fft) / hop (T >= n_fft).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

namespace posenc::audio {

enum class MelScale { kHtk, kSlaney };
enum class MelNorm { kNone, kSlaney };
enum class PadMode { kConstant, kReflect };
MelScale mel_scale_from_string(const std::string& name);  ///< htk | slaney
MelNorm mel_norm_from_string(const std::string& name);    ///< none | slaney
PadMode pad_mode_from_string(const std::string& name);    ///< constant | reflect

/// The largest FFT one spectrogram may take (2^16 points) and the most mel bands (1024).
constexpr int64_t kMaxFftSize = int64_t{1} << 16;
constexpr int64_t kMaxMels = 1024;

/// Defaults: Whisper's front end (16 kHz, 25 ms window, 10 ms hop, 80 Slaney mels), librosa's
/// zero padding.
struct LogMelOptions {
  int64_t sample_rate = 16000;
  int64_t n_fft = 400;
  int64_t win_length = 0;  ///< 0 = n_fft
  int64_t hop_length = 160;
  int64_t n_mels = 80;
  double f_min = 0.0;
  double f_max = 0.0;  ///< 0 = sample_rate / 2
  MelScale scale = MelScale::kSlaney;
  MelNorm norm = MelNorm::kSlaney;
  double power = 2.0;
  bool center = true;
  PadMode pad = PadMode::kConstant;
  double log_floor = 1e-10;

  /// Checks every field; errors name the field, its value and the allowed range.
  void validate() const;
  /// Spectrogram frames of a T-sample signal (0 when T is shorter than one uncentred window).
  int64_t frames(int64_t samples) const;
  /// Seconds between consecutive frames: hop_length / sample_rate.
  double frame_seconds() const { return static_cast<double>(hop_length) / sample_rate; }
};

double hz_to_mel(double hz, MelScale scale);
double mel_to_hz(double mel, MelScale scale);

/// The mel filterbank: [1 + n_fft / 2, n_mels] float64.
at::Tensor mel_filterbank(const LogMelOptions& options);

/// samples [T] or [B, T] (float) -> log-mel [frames, n_mels] or [B, frames, n_mels] float32.
at::Tensor log_mel_spectrogram(const at::Tensor& samples, const LogMelOptions& options);

}  // namespace posenc::audio
