// A deterministic mutation fuzzer for posenc's input readers: config text (JSON/YAML ->
// parse_config -> build_encoder), HF config.json resolution, the tool's --positions parser, the
// CSV reader and the IDX reader.
//
//   fuzz_inputs TARGET SECONDS [SEED]      TARGET: config | hf | positions | csv | idx
//
// Why not libFuzzer: it needs the whole library compiled by clang with -fsanitize=fuzzer; posenc
// and LibTorch's headers are built with GCC here, and a second full clang build did not fit the
// session. This driver is plain C++ in the normal build: it starts from a seed corpus
// (tests/fuzz/corpus/TARGET/, committed), applies random mutations (bit flips, byte insertions
// and deletions, splices of two seeds, tokens from a per-target dictionary that reach the
// parsers' corners: deep nesting, aliases, huge numbers, separators), and feeds each input to the
// target. The contract under test: every input ends in a result or in one c10::Error / posenc
// error — never a crash, an abort, a hang or another exception type. The input being run is
// written to fuzz-current.bin first, so after a crash it is the reproducer (then it becomes a
// regression test). Built with scripts/check.sh's sanitizers it also catches memory errors.
#include <c10/util/Exception.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "../../src/cli/cli.h"
#include "posenc/config/hf_config.h"
#include "posenc/config/registry.h"
#include "posenc/core/errors.h"
#include "timeseries/csv_series.h"
#include "vision/idx.h"

namespace fs = std::filesystem;
using posenc::PositionalEncoding;

namespace {

const std::vector<std::string>& dictionary(const std::string& target) {
  static const std::vector<std::string> config{"[",
                                               "]",
                                               "{",
                                               "}",
                                               ":",
                                               ",",
                                               "\n",
                                               "  ",
                                               "- ",
                                               "&a ",
                                               "*a",
                                               "<<: *a",
                                               "---",
                                               "1e400",
                                               "-1",
                                               "9223372036854775808",
                                               "nan",
                                               "inf",
                                               "null",
                                               "true",
                                               "\"",
                                               "'",
                                               "#",
                                               "rope_scaling",
                                               "rope_parameters",
                                               "type",
                                               "rope_type",
                                               "yarn",
                                               "llama3",
                                               "longrope",
                                               "dynamic",
                                               "factor",
                                               "head_dim",
                                               "mrope_section",
                                               "[1, 2, 3]",
                                               "{\"type\": \"rope\"}"};
  static const std::vector<std::string> positions{
      ":",       ",",          "x",        "[",       "]",      "stream:",  "times:", "grid:",
      "volume:", "video=",     "text=",    "pad=",    "image=", "0",        "-1",     "1e308",
      "nan",     "2010-13-01", "20101301", "T",       "Z",      "+02:00",   " ",      "omni:",
      "audio=",  "s",          "@",        "+audio=", "1.5s",   "4x2x2@1.0"};
  static const std::vector<std::string> csv{
      ",",   "\"",     "\"\"",  "\r",         "\n",       "\r\n",          "\xEF\xBB\xBF",
      "nan", "inf",    "1e400", "2010-01-01", "20101301", "1262304000000", "T",
      "Z",   "+02:00", ".5",    ":60"};
  static const std::vector<std::string> binary{std::string(4, '\0'), "\x08", "\x03",
                                               std::string("\xff\xff\xff\xff", 4),
                                               std::string("\x00\x00\x08\x03", 4)};
  if (target == "positions") return positions;
  if (target == "csv") return csv;
  if (target == "idx") return binary;
  return config;
}

std::string mutate(std::string s, const std::vector<std::string>& seeds,
                   const std::vector<std::string>& words, std::mt19937_64& rng) {
  auto pick = [&rng](size_t n) { return n == 0 ? size_t{0} : static_cast<size_t>(rng() % n); };
  const int rounds = 1 + static_cast<int>(rng() % 4);
  for (int r = 0; r < rounds; ++r) {
    switch (rng() % 7) {
      case 0:  // flip a bit
        if (!s.empty()) s[pick(s.size())] ^= static_cast<char>(1 << (rng() % 8));
        break;
      case 1:  // insert a random byte
        s.insert(s.begin() + static_cast<std::ptrdiff_t>(pick(s.size() + 1)),
                 static_cast<char>(rng() % 256));
        break;
      case 2:  // delete a run
        if (!s.empty()) {
          const size_t at = pick(s.size());
          s.erase(at, 1 + pick(std::min<size_t>(16, s.size() - at)));
        }
        break;
      case 3:  // a dictionary token
      case 4:
        s.insert(pick(s.size() + 1), words[pick(words.size())]);
        break;
      case 5: {  // splice with another seed
        const auto& other = seeds[pick(seeds.size())];
        if (!other.empty()) s = s.substr(0, pick(s.size() + 1)) + other.substr(pick(other.size()));
        break;
      }
      case 6: {  // repeat a piece (nesting, long lines)
        if (!s.empty()) {
          const size_t at = pick(s.size()), len = 1 + pick(std::min<size_t>(8, s.size() - at));
          const auto piece = s.substr(at, len);
          std::string repeated;
          for (size_t k = 0, n = 1 + pick(200); k < n; ++k) repeated += piece;
          s.insert(at, repeated);
        }
        break;
      }
    }
  }
  if (s.size() > (1u << 16)) s.resize(1u << 16);
  return s;
}

void write(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// One input through the target; returns true when it was accepted, false on a clean error.
bool run_one(const std::string& target, const std::string& input, const std::string& scratch) {
  try {
    if (target == "config") {
      auto config = posenc::parse_config(input, "fuzz");
      if (config.is_object()) posenc::build_encoder(config, {64, 4, 0});
    } else if (target == "hf") {
      posenc::from_hf_config(posenc::parse_config(input, "fuzz"));
    } else if (target == "positions") {
      const auto cut = input.find('\n');
      posenc::cli::parse_positions(input.substr(0, cut),
                                   cut == std::string::npos ? "" : input.substr(cut + 1));
    } else if (target == "csv") {
      write(scratch, input);
      posenc::timeseries::load_csv(scratch, "time");
    } else if (target == "idx") {
      write(scratch, input);
      posenc::vision::read_idx(scratch);
    }
    return true;
  } catch (const c10::Error&) {
    return false;
  } catch (const posenc::EnvironmentError&) {
    return false;
  }
  // anything else escapes: the process aborts with the input in fuzz-current.bin
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: fuzz_inputs config|hf|positions|csv|idx SECONDS [SEED]\n";
    return 2;
  }
  const std::string target = argv[1];
  const double seconds = std::stod(argv[2]);
  std::mt19937_64 rng(argc > 3 ? std::stoull(argv[3]) : 0);
  c10::WarningUtils::WarningHandlerGuard quiet([] {
    struct Silent : c10::WarningHandler {
      void process(const c10::Warning&) override {}
    };
    static Silent silent;
    return &silent;
  }());
  const fs::path corpus = fs::path(POSENC_FUZZ_CORPUS) / target;
  std::vector<std::string> seeds;
  if (fs::is_directory(corpus))
    for (const auto& entry : fs::directory_iterator(corpus)) {
      std::ifstream in(entry.path(), std::ios::binary);
      seeds.emplace_back((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    }
  if (seeds.empty()) {
    std::cerr << "fuzz_inputs: no seeds in " << corpus << "\n";
    return 2;
  }
  const auto& words = dictionary(target);
  const std::string scratch = (fs::temp_directory_path() / ("fuzz-input-" + target)).string();
  const auto start = std::chrono::steady_clock::now();
  int64_t runs = 0, accepted = 0;
  for (const auto& seed : seeds) accepted += run_one(target, seed, scratch);  // seeds first
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() <
         seconds) {
    const auto input = mutate(seeds[static_cast<size_t>(rng() % seeds.size())], seeds, words, rng);
    write("fuzz-current.bin", input);
    accepted += run_one(target, input, scratch);
    ++runs;
  }
  std::remove("fuzz-current.bin");
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << "fuzz " << target << ": " << runs << " mutated inputs in " << elapsed << " s, "
            << accepted << " accepted, the rest clean errors; no crash\n";
  return 0;
}
