// Audio modality: the log-mel front end against librosa (tests/fixtures/log_mel.json from
// tools/gen_fixtures_audio.py), the libsndfile reader on every format it claims and on broken
// files, libsamplerate resampling, AST patch grids and positions in seconds, and the
// frequency-absolute / time-rotary hybrid's invariance to a time shift.
#include <gtest/gtest.h>
#include <sndfile.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>

#include "audio/audio_file.h"
#include "audio/audio_positions.h"
#include "audio/log_mel.h"
#include "posenc/config/registry.h"
#include "support/fixtures.h"

namespace posenc::audio {
namespace {

namespace fs = std::filesystem;
using test::error_of;
using test::load_fixture;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

fs::path temp_folder(const std::string& name) {
  auto path = fs::temp_directory_path() / ("posenc_audio_" + std::to_string(getpid()) + "_" + name);
  fs::remove_all(path);
  fs::create_directories(path);
  return path;
}

LogMelOptions options_of(const nlohmann::json& o) {
  LogMelOptions options;
  options.sample_rate = o["sample_rate"];
  options.n_fft = o["n_fft"];
  options.win_length = o["win_length"];
  options.hop_length = o["hop_length"];
  options.n_mels = o["n_mels"];
  options.f_min = o["f_min"];
  options.f_max = o["f_max"];
  options.scale = mel_scale_from_string(o["mel_scale"]);
  options.norm = mel_norm_from_string(o["norm"]);
  options.center = o["center"];
  options.pad = pad_mode_from_string(o["pad_mode"]);
  options.power = o["power"];
  options.log_floor = o["log_floor"];
  return options;
}

// librosa's log-mel to 1e-4 relative (|ours - librosa| <= 1e-4 max(1, |librosa|)), and its
// filterbank to float64 rounding.
TEST(LogMel, MatchesLibrosa) {
  const auto fixture = load_fixture("log_mel.json");
  ASSERT_GE(fixture["cases"].size(), 5u);
  for (const auto& c : fixture["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    const auto options = options_of(c["options"]);
    auto samples = torch::tensor(c["samples"].get<std::vector<double>>()).to(torch::kFloat);
    auto want = torch::tensor(c["log_mel"].get<std::vector<double>>(), torch::kDouble)
                    .view(c["log_mel_shape"].get<std::vector<int64_t>>());
    EXPECT_EQ(options.frames(samples.size(0)), want.size(0));
    auto got = log_mel_spectrogram(samples, options).to(torch::kDouble);
    ASSERT_EQ(got.sizes(), want.sizes());
    const double worst = ((got - want).abs() / want.abs().clamp_min(1.0)).max().item<double>();
    EXPECT_LE(worst, 1e-4);
    // a batch gives the same rows
    auto batch = log_mel_spectrogram(torch::stack({samples, samples.flip(0)}), options);
    EXPECT_TRUE(torch::allclose(batch[0].to(torch::kDouble), got, 1e-5, 1e-5));
    if (c.contains("filterbank")) {
      auto bank = mel_filterbank(options);
      auto want_bank = torch::tensor(c["filterbank"].get<std::vector<double>>(), torch::kDouble)
                           .view(c["filterbank_shape"].get<std::vector<int64_t>>());
      ASSERT_EQ(bank.sizes(), want_bank.sizes());
      EXPECT_LE(test::max_abs_diff(bank, want_bank), 1e-12 * want_bank.abs().max().item<double>());
    }
  }
}

TEST(LogMel, MelScalesAndErrors) {
  // HTK: 1000 Hz is 1000.0 mel by construction of 2595 log10(1 + f / 700)
  EXPECT_NEAR(hz_to_mel(1000, MelScale::kHtk), 999.9855, 1e-3);
  // Slaney: linear below 1 kHz (15 mel at 1 kHz), logarithmic above; both invert
  EXPECT_NEAR(hz_to_mel(1000, MelScale::kSlaney), 15.0, 1e-12);
  EXPECT_NEAR(hz_to_mel(6400, MelScale::kSlaney), 42.0, 1e-12);  // 15 + 27 ln(6.4)/ln(6.4)
  for (double hz : {0.0, 300.0, 999.0, 1000.0, 4000.0, 11025.0})
    for (auto scale : {MelScale::kHtk, MelScale::kSlaney})
      EXPECT_NEAR(mel_to_hz(hz_to_mel(hz, scale), scale), hz, 1e-9 * std::max(1.0, hz));
  LogMelOptions options;
  EXPECT_EQ(options.frames(16000), 101);  // centred: 1 + T / hop
  options.center = false;
  EXPECT_EQ(options.frames(16000), 98);  // 1 + (16000 - 400) / 160
  EXPECT_EQ(options.frames(399), 0);
  EXPECT_TRUE(contains(error_of([&] { log_mel_spectrogram(torch::zeros({399}), options); }),
                       "399 samples make no frame"));
  options = LogMelOptions{};
  options.f_max = 9000;
  EXPECT_TRUE(contains(error_of([&] { options.validate(); }), "f_max 9000"));
  options = LogMelOptions{};
  options.win_length = 512;
  EXPECT_TRUE(
      contains(error_of([&] { options.validate(); }), "win_length must be in [0, n_fft = 400]"));
  EXPECT_TRUE(
      contains(error_of([] { mel_scale_from_string("bark"); }), "unknown mel_scale 'bark'"));
  EXPECT_TRUE(contains(error_of([] {
                         log_mel_spectrogram(torch::zeros({2, 3, 400}), {});
                       }),
                       "must be [T] or [B, T]"));
}

// Writes `frames` x channels float samples with libsndfile in `format`.
void write_with_sndfile(const std::string& path, const at::Tensor& interleaved, int rate,
                        int format) {
  SF_INFO info{};
  info.samplerate = rate;
  info.channels = static_cast<int>(interleaved.size(1));
  info.format = format;
  SNDFILE* file = sf_open(path.c_str(), SFM_WRITE, &info);
  ASSERT_NE(file, nullptr) << sf_strerror(nullptr) << " for " << path;
  auto data = interleaved.contiguous();
  ASSERT_EQ(sf_writef_float(file, data.data_ptr<float>(), data.size(0)), data.size(0));
  sf_close(file);
}

at::Tensor tone(double hz, int64_t rate, int64_t samples, double amplitude = 0.5) {
  return (torch::sin(torch::arange(samples, torch::kDouble) * (2 * M_PI * hz / rate)) * amplitude)
      .to(torch::kFloat);
}

TEST(AudioFile, ReadsEveryFormatAndMixesDown) {
  const auto dir = temp_folder("formats");
  const int64_t rate = 16000, n = 4000;
  auto stereo = torch::stack({tone(440, rate, n), tone(660, rate, n, 0.25)}, 1);  // [T, 2]
  auto mono = stereo.mean(1);
  struct Case {
    std::string name;
    int format;
    double tolerance;  // on the mono samples; < 0: lossy (correlation instead)
  };
  const std::vector<Case> cases{
      {"pcm16.wav", SF_FORMAT_WAV | SF_FORMAT_PCM_16, 2.0 / 32768},
      {"pcm24.wav", SF_FORMAT_WAV | SF_FORMAT_PCM_24, 2.0 / 8388608},
      {"pcm32.wav", SF_FORMAT_WAV | SF_FORMAT_PCM_32, 1e-6},
      {"u8.wav", SF_FORMAT_WAV | SF_FORMAT_PCM_U8, 2.0 / 128},
      {"float.wav", SF_FORMAT_WAV | SF_FORMAT_FLOAT, 1e-7},
      {"double.wav", SF_FORMAT_WAV | SF_FORMAT_DOUBLE, 1e-7},
      {"pcm16.flac", SF_FORMAT_FLAC | SF_FORMAT_PCM_16, 2.0 / 32768},
      {"pcm16.aiff", SF_FORMAT_AIFF | SF_FORMAT_PCM_16, 2.0 / 32768},
      {"vorbis.ogg", SF_FORMAT_OGG | SF_FORMAT_VORBIS, -1},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const auto path = (dir / c.name).string();
    write_with_sndfile(path, stereo, rate, c.format);
    const auto clip = read_audio(path);
    EXPECT_EQ(clip.sample_rate, rate);
    EXPECT_EQ(clip.file_rate, rate);
    EXPECT_EQ(clip.channels, 2);
    ASSERT_EQ(clip.samples.dim(), 1);
    ASSERT_EQ(clip.samples.size(0), n);
    if (c.tolerance > 0) {
      EXPECT_LE(test::max_abs_diff(clip.samples, mono), c.tolerance);
    } else {  // lossy: the same waveform, not the same samples
      auto a = clip.samples.to(torch::kDouble), b = mono.to(torch::kDouble);
      const double r = (a * b).sum().item<double>() /
                       std::sqrt((a * a).sum().item<double>() * (b * b).sum().item<double>());
      EXPECT_GT(r, 0.99);
    }
  }
  // our own writer reads back to 16-bit precision
  const auto own = (dir / "own.wav").string();
  write_wav16(own, mono, rate);
  EXPECT_LE(test::max_abs_diff(read_audio(own).samples, mono), 1.0 / 32767);
  fs::remove_all(dir);
}

TEST(AudioFile, BrokenFilesNameTheFileAndTheProblem) {
  const auto dir = temp_folder("broken");
  const int64_t rate = 8000;
  const auto good = (dir / "good.wav").string();
  write_wav16(good, tone(300, rate, 8000), rate);
  std::ifstream in(good, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto write_bytes = [&](const std::string& name, const std::string& contents) {
    const auto path = (dir / name).string();
    std::ofstream(path, std::ios::binary) << contents;
    return path;
  };
  const auto missing = (dir / "missing.wav").string();
  EXPECT_TRUE(contains(error_of([&] { read_audio(missing); }), "'" + missing + "'"));
  EXPECT_TRUE(contains(error_of([&] { read_audio(missing); }), "No such file"));
  const auto empty = write_bytes("empty.wav", "");
  EXPECT_TRUE(contains(error_of([&] { read_audio(empty); }), "is empty (0 bytes)"));
  const auto text = write_bytes("notes.wav", "these are not samples, just some words\n");
  EXPECT_TRUE(contains(error_of([&] { read_audio(text); }), "is not an audio file"));
  EXPECT_TRUE(contains(error_of([&] { read_audio(text); }), text));
  // cut after 3000 of 16044 bytes: the header still announces 8000 frames
  const auto cut = write_bytes("cut.wav", bytes.substr(0, 3000));
  const auto cut_error = error_of([&] { read_audio(cut); });
  EXPECT_TRUE(contains(cut_error, "'" + cut + "' is truncated")) << cut_error;
  // a header with no samples
  const auto silent = (dir / "silent.wav").string();
  write_wav16(silent, torch::zeros({0}), rate);
  EXPECT_TRUE(contains(error_of([&] { read_audio(silent); }), "holds no samples (zero length)"));
  AudioReadOptions allow;
  allow.allow_empty = true;
  EXPECT_EQ(read_audio(silent, allow).samples.size(0), 0);
  // a FLAC cut in half decodes fewer frames than its STREAMINFO announces
  const auto flac = (dir / "whole.flac").string();
  write_with_sndfile(flac, (torch::rand({rate * 2, 1}) - 0.5), static_cast<int>(rate),
                     SF_FORMAT_FLAC | SF_FORMAT_PCM_16);
  std::ifstream flac_in(flac, std::ios::binary);
  const std::string flac_bytes((std::istreambuf_iterator<char>(flac_in)),
                               std::istreambuf_iterator<char>());
  const auto half = write_bytes("half.flac", flac_bytes.substr(0, flac_bytes.size() / 2));
  const auto half_error = error_of([&] { read_audio(half); });
  EXPECT_TRUE(contains(half_error, "'" + half + "'")) << half_error;
  EXPECT_TRUE(contains(half_error, "truncated")) << half_error;
  // another rate with resampling off
  AudioReadOptions strict;
  strict.target_rate = 16000;
  strict.resample = false;
  EXPECT_TRUE(contains(error_of([&] { read_audio(good, strict); }),
                       "is sampled at 8000 Hz, expected 16000 Hz (resampling is off)"));
  fs::remove_all(dir);
}

// Band-limited: a tone below both Nyquist frequencies survives; one above the target's is removed.
TEST(AudioFile, ResamplesBandLimited) {
  auto up = resample(tone(440, 8000, 8000), 8000, 16000);
  ASSERT_EQ(up.size(0), 16000);
  auto want = tone(440, 16000, 16000);
  // away from the ends (the filter's start-up and tail)
  EXPECT_LT(test::max_abs_diff(up.narrow(0, 1000, 14000), want.narrow(0, 1000, 14000)), 2e-3);
  auto down = resample(tone(5000, 16000, 16000), 16000, 8000);  // above the new 4 kHz Nyquist
  ASSERT_EQ(down.size(0), 8000);
  EXPECT_LT(down.narrow(0, 500, 7000).abs().max().item<double>(), 5e-3);
  auto kept = resample(tone(1000, 16000, 16000), 16000, 8000);
  EXPECT_LT(
      test::max_abs_diff(kept.narrow(0, 500, 7000), tone(1000, 8000, 8000).narrow(0, 500, 7000)),
      2e-3);
  EXPECT_EQ(resample(torch::zeros({1001}), 44100, 16000).size(0), 363);  // round(1001 * 16 / 44.1)
  EXPECT_TRUE(contains(error_of([] { resample(torch::zeros({10}), 8000, 8000 * 300); }),
                       "outside libsamplerate's [1/256, 256]"));
  // read_audio resamples to the target rate
  const auto dir = temp_folder("resample");
  const auto path = (dir / "a.wav").string();
  write_wav16(path, tone(440, 8000, 4000), 8000);
  AudioReadOptions options;
  options.target_rate = 16000;
  const auto clip = read_audio(path, options);
  EXPECT_EQ(clip.sample_rate, 16000);
  EXPECT_EQ(clip.file_rate, 8000);
  EXPECT_EQ(clip.samples.size(0), 8000);
  fs::remove_all(dir);
}

#ifdef POSENC_DATA_DIR
// Every prompt scripts/setup.sh unpacks reads: 8 kHz mono, counts per language; the one empty
// file of the packages (ru/is.wav: a WAV header and no samples) is an error unless allowed.
TEST(AudioFile, ReadsEveryAsteriskPrompt) {
  const fs::path root = fs::path(POSENC_DATA_DIR) / "asterisk";
  if (!fs::exists(root / ".complete")) GTEST_SKIP() << "no " << root << " (run scripts/setup.sh)";
  const std::map<std::string, int64_t> expected{
      {"en", 568}, {"es", 527}, {"fr", 561}, {"it", 599}, {"ru", 576}};
  for (const auto& [language, count] : expected) {
    int64_t files = 0;
    for (const auto& entry : fs::recursive_directory_iterator(root / language)) {
      if (entry.path().extension() != ".wav") continue;
      if (entry.path() == root / "ru" / "is.wav") {
        const auto path = entry.path().string();
        EXPECT_TRUE(
            contains(error_of([&] { read_audio(path); }), "holds no samples (zero length)"));
        AudioReadOptions allow;
        allow.allow_empty = true;
        EXPECT_EQ(read_audio(path, allow).samples.size(0), 0);
        ++files;
        continue;
      }
      const auto clip = read_audio(entry.path().string());
      ASSERT_EQ(clip.sample_rate, 8000) << entry.path();
      ASSERT_EQ(clip.channels, 1) << entry.path();
      ASSERT_GT(clip.samples.size(0), 0) << entry.path();
      ++files;
    }
    EXPECT_EQ(files, count) << language;
  }
}
#endif

TEST(AstPatches, GridOrderAndPositionsInSeconds) {
  // AST's formula: 128 mels x 1024 frames, 16 x 16 patches every 10 -> 12 x 101 = 1212
  const auto grid = ast_patch_grid(128, 1024);
  EXPECT_EQ(grid.freq, 12);
  EXPECT_EQ(grid.time, 101);
  EXPECT_EQ(grid.tokens(), 1212);
  // token f T' + t is the square at bands [10 f, 10 f + 16) x frames [10 t, 10 t + 16)
  auto mel = torch::randn({40, 32});  // [frames, mels]
  auto patches = ast_patches(mel);
  const auto small = ast_patch_grid(32, 40);
  ASSERT_EQ(small.freq, 2);
  ASSERT_EQ(small.time, 3);
  ASSERT_EQ(patches.sizes(), (std::vector<int64_t>{6, 256}));
  for (int64_t f = 0; f < 2; ++f)
    for (int64_t t = 0; t < 3; ++t) {
      auto square = mel.narrow(0, 10 * t, 16).narrow(1, 10 * f, 16).t();  // [band, frame]
      EXPECT_TRUE(torch::equal(patches[f * 3 + t], square.reshape({256})));
    }
  EXPECT_TRUE(torch::equal(ast_patches(mel.unsqueeze(0))[0], patches));
  // positions: (freq row, start time in seconds): 10 frames of 10 ms per patch step
  auto p = ast_positions(small, {}, 0.01, TimeUnit::kSeconds, 2.5);
  EXPECT_EQ(p.axes(), (std::vector<std::string>{"freq", "time"}));
  auto want = torch::tensor({0., 2.5, 0., 2.6, 0., 2.7, 1., 2.5, 1., 2.6, 1., 2.7}, torch::kDouble)
                  .view({6, 2});
  EXPECT_LT(test::max_abs_diff(p.coords(), want), 1e-12);
  auto index = ast_positions(small, {}, 0.01, TimeUnit::kIndex);
  EXPECT_TRUE(torch::equal(index.coords().select(1, 1),
                           torch::tensor({0., 1., 2., 0., 1., 2.}, torch::kDouble)));
  // Whisper: 1500 encoder frames of 20 ms
  auto w = frame_positions(1500, 0.02);
  EXPECT_EQ(w.axes(), (std::vector<std::string>{"time"}));
  EXPECT_NEAR(w.coords()[1499][0].item<double>(), 29.98, 1e-9);
  EXPECT_TRUE(
      contains(error_of([] { ast_patch_grid(10, 100); }), "smaller than one 16 x 16 patch"));
  EXPECT_TRUE(contains(error_of([] {
                         ast_patch_grid(128, 100, {16, 20});
                       }),
                       "stride must be in [1, patch = 16]"));
}

// logits[i, j] = <R(t_i) W_q (x_i + E(f_i)), R(t_j) W_k (x_j + E(f_j))>: with E on frequency and
// R rotary in time, moving the whole clip in time changes nothing; an absolute time code does.
TEST(FreqTimeHybrid, InvariantToATimeShift) {
  torch::manual_seed(0);
  const int64_t dim = 32, heads = 2, head_dim = 16;
  auto grid = ast_patch_grid(48, 64);  // 4 x 5 patches
  auto here = ast_positions(grid, {}, 0.01);
  auto later = ast_positions(grid, {}, 0.01, TimeUnit::kSeconds, 1.37);
  auto x = torch::randn({1, grid.tokens(), dim});
  auto wq = torch::randn({dim, dim}), wk = torch::randn({dim, dim});
  auto logits = [&](PositionalEncoding encoder, const Positions& p) {
    auto plan = encoder->plan(p);
    auto h = plan.apply_additive(x);
    auto q = torch::matmul(h, wq).view({1, -1, heads, head_dim});
    auto k = torch::matmul(h, wk).view({1, -1, heads, head_dim});
    auto [qr, kr] = plan.apply_rotary(q, k);
    return torch::einsum("bihd,bjhd->bhij", {qr, kr});
  };
  auto hybrid = build_encoder(nlohmann::json{{"type", "freq_time"}}, {dim, heads, 0});
  auto a = logits(hybrid, here), b = logits(hybrid, later);
  EXPECT_LT(test::max_abs_diff(a, b), 1e-3 * a.abs().max().item<double>());
  // frequency is absolute: moving the clip up one band changes the logits
  auto up = Positions(here.coords() + torch::tensor({1.0, 0.0}, torch::kDouble), here.axes());
  EXPECT_GT(test::max_abs_diff(logits(hybrid, up), a), 1e-2 * a.abs().max().item<double>());
  // an absolute code on both axes is not shift invariant (the test can fail)
  auto absolute = build_encoder(nlohmann::json{{"type", "axial_sincos"}}, {dim, heads, 0});
  EXPECT_GT(test::max_abs_diff(logits(absolute, here), logits(absolute, later)),
            1e-2 * a.abs().max().item<double>());
  // custom parts: a learned frequency table and RoPE with another base
  auto custom =
      build_encoder(nlohmann::json{{"type", "freq_time"},
                                   {"frequency", {{"type", "learned"}, {"max_positions", 8}}},
                                   {"time", {{"type", "rope"}, {"rope_theta", 100.0}}}},
                    {dim, heads, 0});
  EXPECT_LT(test::max_abs_diff(logits(custom, here), logits(custom, later)),
            1e-3 * logits(custom, here).abs().max().item<double>());
  EXPECT_TRUE(
      contains(error_of([&] {
                 build_encoder(nlohmann::json{{"type", "freq_time"}, {"time", 3}}, {dim, heads, 0});
               }),
               "time: expected an encoder config object"));
  // a bias encoder on some axes is refused with a reason
  auto bias = build_encoder(
      nlohmann::json{{"type", "compose"}, {"encoders", {{{"type", "alibi"}, {"axes", {"time"}}}}}},
      {dim, heads, 0});
  EXPECT_TRUE(contains(error_of([&] { bias->plan(here); }), "a bias part must read every axis"));
}

}  // namespace
}  // namespace posenc::audio
