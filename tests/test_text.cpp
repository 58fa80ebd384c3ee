// modalities/text: the Gutenberg books Debian ships (unpacked by scripts/setup.sh), header and
// footer stripping, lossless byte tokens, LM windows. Expected sizes were computed from the same
// files with Python (bytes, BOM and CRLF handled the same way).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "support/fixtures.h"
#include "text/gutenberg.h"

namespace posenc::text {
namespace {

const std::string kBooks = std::string(POSENC_DATA_DIR) + "/gutenberg";

TEST(Gutenberg, BooksWithoutHeaderAndFooter) {
  auto moby = strip_gutenberg(read_text(kBooks + "/moby-dick.txt"));
  EXPECT_EQ(moby.size(), 1215808u);
  EXPECT_EQ(moby.find("Project Gutenberg License"), std::string::npos);
  EXPECT_EQ(moby.find('\r'), std::string::npos);
  EXPECT_NE(moby.find("Call me Ishmael."), std::string::npos);
  auto holmes = strip_gutenberg(read_text(kBooks + "/sherlock-holmes.txt"));
  EXPECT_EQ(holmes.size(), 562438u);
  auto sawyer = strip_gutenberg(read_text(kBooks + "/tom-sawyer.txt"));  // has no markers
  EXPECT_EQ(sawyer.size(), 387851u);
  auto message = test::error_of([] { read_text("/nonexistent/book.txt"); });
  EXPECT_NE(message.find("cannot read '/nonexistent/book.txt'"), std::string::npos);
}

TEST(ByteTokens, LosslessAndWindowsShiftByOne) {
  ByteTokenizer tokenizer;
  const std::string text = "Call me Ishmael. \xE2\x80\x94 caf\xC3\xA9";
  auto tokens = tokenizer.encode(text);
  EXPECT_EQ(tokens.size(0), static_cast<int64_t>(text.size()));
  EXPECT_EQ(tokenizer.decode(tokens), text);
  torch::manual_seed(1);
  auto book = tokenizer.encode(strip_gutenberg(read_text(kBooks + "/moby-dick.txt")));
  auto windows = sample_windows(book, 128, 4);
  EXPECT_EQ(windows.inputs.sizes(), torch::IntArrayRef({4, 128}));
  EXPECT_TRUE(torch::equal(windows.inputs.narrow(1, 1, 127), windows.targets.narrow(1, 0, 127)));
  EXPECT_EQ(windows.positions.size(), 128);
  auto message = test::error_of([&] { sample_windows(tokens, 64, 1); });
  EXPECT_NE(message.find("cannot hold a window of 64"), std::string::npos) << message;
}

}  // namespace
}  // namespace posenc::text
