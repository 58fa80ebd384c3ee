// Gutenberg text, byte tokens and LM windows; see gutenberg.h.
#include "gutenberg.h"

#include <torch/torch.h>

#include <cstring>
#include <fstream>
#include <sstream>

#include "posenc/io/input_file.h"

namespace posenc::text {

std::string read_text(const std::string& path) {
  return read_regular_file(path, "text file", kMaxTextBytes, "the text file limit");
}

std::string strip_gutenberg(const std::string& raw) {
  std::string text = raw.rfind("\xEF\xBB\xBF", 0) == 0 ? raw.substr(3) : raw;
  std::string lf;
  lf.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i)
    if (!(text[i] == '\r' && i + 1 < text.size() && text[i + 1] == '\n')) lf.push_back(text[i]);
  size_t begin = 0;
  if (auto start = lf.find("*** START OF"); start != std::string::npos) {
    const auto line_end = lf.find('\n', start);
    begin = line_end == std::string::npos ? lf.size() : line_end + 1;
  }
  size_t end = lf.size();
  for (const char* marker :
       {"*** END OF", "\nEnd of Project Gutenberg", "\nEnd of the Project Gutenberg"}) {
    const auto at = lf.find(marker, begin);
    if (at != std::string::npos) end = std::min(end, at);
  }
  return lf.substr(begin, end - begin);
}

at::Tensor ByteTokenizer::encode(const std::string& text) const {
  auto bytes = torch::empty({static_cast<int64_t>(text.size())}, torch::kUInt8);
  std::memcpy(bytes.data_ptr<uint8_t>(), text.data(), text.size());
  return bytes.to(torch::kLong);
}

std::string ByteTokenizer::decode(const at::Tensor& tokens) const {
  TORCH_CHECK(tokens.dim() == 1, "text: decode takes [N] tokens, got ", tokens.sizes());
  if (tokens.numel() == 0) return "";
  TORCH_CHECK(tokens.min().item<int64_t>() >= 0 && tokens.max().item<int64_t>() < kVocabSize,
              "text: byte tokens must be in 0..255, got ", tokens.min().item<int64_t>(), "..",
              tokens.max().item<int64_t>());
  auto bytes = tokens.to(torch::kUInt8).contiguous();
  return std::string(reinterpret_cast<const char*>(bytes.data_ptr<uint8_t>()),
                     static_cast<size_t>(bytes.numel()));
}

TextWindows sample_windows(const at::Tensor& tokens, int64_t length, int64_t count,
                           std::optional<at::Generator> generator) {
  TORCH_CHECK(tokens.dim() == 1, "text: tokens must be [N], got ", tokens.sizes());
  TORCH_CHECK(length > 0 && count > 0, "text: length and count must be positive, got ", length,
              " and ", count);
  TORCH_CHECK(tokens.size(0) > length, "text: ", tokens.size(0), " tokens cannot hold a window of ",
              length, " plus its next-token target");
  auto starts = torch::randint(0, tokens.size(0) - length, {count, 1}, generator,
                               torch::TensorOptions(torch::kLong));
  auto index = starts + torch::arange(length + 1, torch::kLong);  // [count, length + 1]
  auto windows = tokens.index_select(0, index.flatten()).view({count, length + 1});
  return {windows.narrow(1, 0, length).contiguous(), windows.narrow(1, 1, length).contiguous(),
          Positions::sequence(length)};
}

}  // namespace posenc::text
