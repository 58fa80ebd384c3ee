// Audio decoding (libsndfile), mono mixdown and resampling (libsamplerate); contract in
// audio_file.h.
#include "audio/audio_file.h"

#include <fcntl.h>
#include <samplerate.h>
#include <sndfile.h>
#include <sys/stat.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <regex>

#include "posenc/io/input_digest.h"

namespace posenc::audio {

ResampleQuality resample_quality_from_string(const std::string& name) {
  if (name == "best") return ResampleQuality::kBest;
  if (name == "medium") return ResampleQuality::kMedium;
  if (name == "fastest") return ResampleQuality::kFastest;
  if (name == "linear") return ResampleQuality::kLinear;
  TORCH_CHECK(false, "audio: unknown resample quality '", name,
              "'; expected one of: best, medium, fastest, linear");
}

namespace {

int converter_of(ResampleQuality quality) {
  switch (quality) {
    case ResampleQuality::kBest:
      return SRC_SINC_BEST_QUALITY;
    case ResampleQuality::kMedium:
      return SRC_SINC_MEDIUM_QUALITY;
    case ResampleQuality::kFastest:
      return SRC_SINC_FASTEST;
    case ResampleQuality::kLinear:
      return SRC_LINEAR;
  }
  return SRC_SINC_BEST_QUALITY;
}

struct CloseSndfile {
  void operator()(SNDFILE* file) const { sf_close(file); }
};

// libsndfile's parse log says "data : N (should be M)" when a chunk's declared size runs past
// the end of the file: the data was cut off.
std::string truncation_in_log(SNDFILE* file) {
  char log[16384] = {0};
  sf_command(file, SFC_GET_LOG_INFO, log, sizeof(log));
  static const std::regex cut(R"((data|SSND)\s*:\s*(\d+)\s*\(should be (\d+)\))");
  std::cmatch match;
  if (std::regex_search(log, match, cut) && std::stoll(match[3]) < std::stoll(match[2]))
    return match[0];
  return {};
}

}  // namespace

AudioClip read_audio(const std::string& path, const AudioReadOptions& options) {
  TORCH_CHECK(options.target_rate >= 0,
              "audio: target_rate must be >= 0 (0 keeps the file's), got ", options.target_rate);
  struct stat status {};
  TORCH_CHECK(::stat(path.c_str(), &status) == 0, "audio: cannot read '", path,
              "': ", std::strerror(errno));
  TORCH_CHECK(S_ISREG(status.st_mode), "audio: '", path, "' is not a regular file");
  TORCH_CHECK(status.st_size > 0, "audio: '", path, "' is empty (0 bytes)");
  SF_INFO info{};
  std::unique_ptr<SNDFILE, CloseSndfile> file(sf_open(path.c_str(), SFM_READ, &info));
  TORCH_CHECK(file != nullptr, "audio: '", path, "' is not an audio file libsndfile reads (",
              sf_strerror(nullptr), ")");
  TORCH_CHECK(info.channels >= 1 && info.samplerate >= 1, "audio: '", path,
              "' has no channels or no sample rate (channels ", info.channels, ", rate ",
              info.samplerate, ")");
  const std::string cut = truncation_in_log(file.get());
  TORCH_CHECK(cut.empty(), "audio: '", path,
              "' is truncated: its header announces more data than the file holds (libsndfile: '",
              cut, "' bytes)");
  if (info.frames == 0 && options.allow_empty) {
    AudioClip empty;
    empty.samples = torch::zeros({0}, torch::kFloat);
    empty.sample_rate = options.target_rate > 0 ? options.target_rate : info.samplerate;
    empty.file_rate = info.samplerate;
    empty.channels = info.channels;
    return empty;
  }
  TORCH_CHECK(info.frames > 0, "audio: '", path, "' holds no samples (zero length)");
  TORCH_CHECK(info.frames <= kMaxAudioFrames, "audio: '", path, "' is too long: ", info.frames,
              " frames, the limit is kMaxAudioFrames = ", kMaxAudioFrames);
  sf_command(file.get(), SFC_SET_NORM_FLOAT, nullptr, SF_TRUE);
  auto interleaved = torch::empty({info.frames, info.channels}, torch::kFloat);
  const sf_count_t read = sf_readf_float(file.get(), interleaved.data_ptr<float>(), info.frames);
  if (read > 0)  // compared across the ranks of a run (posenc/io/input_digest.h)
    note_input(interleaved.data_ptr<float>(),
               static_cast<size_t>(read) * static_cast<size_t>(info.channels) * sizeof(float));
  TORCH_CHECK(read == info.frames, "audio: '", path,
              "' is truncated or corrupt: its header announces ", info.frames, " frames, ", read,
              " could be decoded (libsndfile: ", sf_strerror(file.get()), ")");
  TORCH_CHECK(torch::isfinite(interleaved).all().item<bool>(), "audio: '", path,
              "' holds samples that are NaN or infinite");

  AudioClip clip;
  clip.file_rate = info.samplerate;
  clip.channels = info.channels;
  clip.samples = info.channels == 1 ? interleaved.view({-1}) : interleaved.mean(1);  // [T]
  clip.sample_rate = info.samplerate;
  if (options.target_rate > 0 && options.target_rate != info.samplerate) {
    TORCH_CHECK(options.resample, "audio: '", path, "' is sampled at ", info.samplerate,
                " Hz, expected ", options.target_rate, " Hz (resampling is off)");
    clip.samples = resample(clip.samples, info.samplerate, options.target_rate, options.quality);
    clip.sample_rate = options.target_rate;
  }
  return clip;
}

at::Tensor resample(const at::Tensor& samples, int64_t rate, int64_t target,
                    ResampleQuality quality) {
  TORCH_CHECK(samples.dim() == 1, "resample: samples must be [T], got shape ", samples.sizes());
  TORCH_CHECK(rate > 0 && target > 0, "resample: rates must be positive, got ", rate, " -> ",
              target);
  const double ratio = static_cast<double>(target) / static_cast<double>(rate);
  TORCH_CHECK(ratio >= 1.0 / 256 && ratio <= 256, "resample: ratio ", target, "/", rate,
              " is outside libsamplerate's [1/256, 256]");
  auto input = samples.to(torch::kFloat).contiguous();
  if (rate == target) return input.clone();
  const int64_t length = std::llround(static_cast<double>(input.size(0)) * ratio);
  // room for the converter's whole output; it is cut to `length` after
  auto output = torch::zeros({length + 64}, torch::kFloat);
  SRC_DATA data{};
  data.data_in = input.data_ptr<float>();
  data.input_frames = static_cast<long>(input.size(0));
  data.data_out = output.data_ptr<float>();
  data.output_frames = static_cast<long>(output.size(0));
  data.src_ratio = ratio;
  data.end_of_input = 1;
  const int error = src_simple(&data, converter_of(quality), 1);
  TORCH_CHECK(error == 0, "resample: libsamplerate failed: ", src_strerror(error));
  // src_simple's output can fall a few frames short of round(T ratio) (filter delay at the end):
  // the missing tail is silence
  return output.narrow(0, 0, length).clone();
}

void write_wav16(const std::string& path, const at::Tensor& samples, int64_t sample_rate) {
  TORCH_CHECK(samples.dim() == 1, "write_wav16: samples must be [T], got shape ", samples.sizes());
  TORCH_CHECK(sample_rate > 0 && sample_rate <= 1000000, "write_wav16: sample rate ", sample_rate,
              " is outside (0, 1e6]");
  auto pcm = (samples.to(torch::kFloat).clamp(-1.0, 1.0) * 32767.0).round().to(torch::kShort);
  pcm = pcm.contiguous();
  const uint32_t data_bytes = static_cast<uint32_t>(pcm.numel() * 2);
  std::string bytes;
  auto put32 = [&](uint32_t v) {
    for (int i = 0; i < 4; ++i) bytes.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
  };
  auto put16 = [&](uint16_t v) {
    bytes.push_back(static_cast<char>(v & 0xFF));
    bytes.push_back(static_cast<char>(v >> 8));
  };
  bytes += "RIFF";
  put32(36 + data_bytes);
  bytes += "WAVEfmt ";
  put32(16);
  put16(1);  // PCM
  put16(1);  // mono
  put32(static_cast<uint32_t>(sample_rate));
  put32(static_cast<uint32_t>(sample_rate * 2));
  put16(2);
  put16(16);
  bytes += "data";
  put32(data_bytes);
  // little-endian host (x86-64, aarch64): the int16 samples are already in WAV's byte order
  bytes.append(static_cast<const char*>(pcm.data_ptr()), data_bytes);

  const std::string temporary = path + ".tmp";
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  TORCH_CHECK(fd >= 0, "write_wav16: cannot write '", path, "': ", std::strerror(errno));
  size_t done = 0;
  int error = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      error = n < 0 ? errno : EIO;
      break;
    }
    done += static_cast<size_t>(n);
  }
  if (error == 0 && ::fsync(fd) != 0) error = errno;
  if (::close(fd) != 0 && error == 0) error = errno;
  if (error == 0 && std::rename(temporary.c_str(), path.c_str()) != 0) error = errno;
  if (error != 0) ::unlink(temporary.c_str());
  TORCH_CHECK(error == 0, "write_wav16: cannot write '", path, "': ", std::strerror(error));
}

}  // namespace posenc::audio
