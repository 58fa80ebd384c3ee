// Audio files as mono float samples: decoding by libsndfile (WAV in every PCM and float width,
// FLAC, OGG/Vorbis, AIFF, ...), a mixdown to mono and optional resampling by libsamplerate.
//
//   mono[t]   = (1 / C) sum_c x[t, c]                 (C channels; libsndfile's samples are
//                                                      normalized: integer PCM -> [-1, 1))
//   resampled = band-limited sinc interpolation (libsamplerate, Secret Rabbit Code; de Castro
//               Lopo), output length round(T * target_rate / rate)
// Why libsamplerate and not our own resampler: it is the reference implementation of
// band-limited resampling that sox, PulseAudio and many decoders use, its quality levels are
// measured (SRC_SINC_BEST_QUALITY: 97 dB SNR, 97% bandwidth), and it is a Debian package; a
// polyphase filter of our own would need the same tests to be trusted and buy nothing.
//
// Errors name the file and say what is wrong: missing, not audio (libsndfile's reason), zero
// length, truncated (the header promises more data than the file holds: libsndfile's "data :
// N (should be M)" or fewer frames decoded than announced), too long, and a sample-rate mismatch
// when resampling is off.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

namespace posenc::audio {

/// The longest clip a file may hold: 2^28 samples per channel (about 93 minutes at 48 kHz).
constexpr int64_t kMaxAudioFrames = int64_t{1} << 28;

/// Resampling quality (libsamplerate's converters).
enum class ResampleQuality { kBest, kMedium, kFastest, kLinear };
ResampleQuality resample_quality_from_string(
    const std::string& name);  ///< best|medium|fastest|linear

struct AudioReadOptions {
  int64_t target_rate = 0;  ///< 0 = keep the file's rate
  bool resample = true;     ///< false: a file at another rate than target_rate is an error
  ResampleQuality quality = ResampleQuality::kBest;
  /// true: a valid file with no samples gives an empty clip ([0]) instead of an error (a
  /// dataset that knows some of its files are empty: asterisk-core-sounds-ru-wav's is.wav)
  bool allow_empty = false;
};

struct AudioClip {
  at::Tensor samples;       ///< [T] float32, mono
  int64_t sample_rate = 0;  ///< of `samples` (the target rate when resampled)
  int64_t file_rate = 0;    ///< the file's own rate
  int64_t channels = 0;     ///< the file's channel count (mixed down to 1)
  double seconds() const { return static_cast<double>(samples.size(0)) / sample_rate; }
};

/// Reads `path`, mixes it down to mono and resamples it to options.target_rate.
AudioClip read_audio(const std::string& path, const AudioReadOptions& options = {});

/// samples [T] float32 at `rate` -> [round(T * target / rate)] at `target`.
at::Tensor resample(const at::Tensor& samples, int64_t rate, int64_t target,
                    ResampleQuality quality = ResampleQuality::kBest);

/// Writes samples [T] (mono, float in [-1, 1]) as a 16-bit PCM WAV file, atomically (a
/// temporary file, synced, then renamed). For tests, fixtures and generated data.
void write_wav16(const std::string& path, const at::Tensor& samples, int64_t sample_rate);

}  // namespace posenc::audio
