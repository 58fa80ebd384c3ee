// modalities/text: the Gutenberg books Debian ships (unpacked by scripts/setup.sh), header and
// footer stripping, lossless byte tokens, LM windows. Expected sizes were computed from the same
// files with Python (bytes, BOM and CRLF handled the same way).
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cctype>
#include <set>

#include "support/fixtures.h"
#include "text/gutenberg.h"
#include "text/retrieval.h"

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
  EXPECT_NE(message.find("cannot open text file '/nonexistent/book.txt'"), std::string::npos);
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

// Key-value retrieval prompts (the "lost in the middle" task): every prompt parsed back by hand.
std::string bytes_of(const at::Tensor& row) {
  std::string text;
  for (int64_t i = 0; i < row.size(0); ++i)
    text.push_back(static_cast<char>(row[i].item<int64_t>()));
  return text;
}

TEST(Retrieval, RecordLayoutDepthAndAnswer) {
  auto generator = at::detail::createCPUGenerator(7);
  const int64_t n = 20;
  for (double depth : {0.0, 0.5, 1.0}) {
    auto batch = make_retrieval_batch(50, n, Haystack::kRecords, depth, generator);
    ASSERT_EQ(batch.prompts.sizes(), (std::vector<int64_t>{50, 6 * n + 4}));
    ASSERT_EQ(batch.answers.sizes(), (std::vector<int64_t>{50, 2}));
    const int64_t gold = std::llround(depth * (n - 1));
    for (int64_t e = 0; e < 50; ++e) {
      const auto prompt = bytes_of(batch.prompts[e]);
      std::set<std::string> keys;
      for (int64_t r = 0; r < n; ++r) {
        const auto record = prompt.substr(static_cast<size_t>(6 * r), 6);
        ASSERT_TRUE(std::isupper(record[0]) && std::isupper(record[1])) << record;
        ASSERT_EQ(record[2], '=');
        ASSERT_TRUE(std::isdigit(record[3]) && std::isdigit(record[4])) << record;
        ASSERT_EQ(record[5], ';');
        keys.insert(record.substr(0, 2));
      }
      EXPECT_EQ(keys.size(), static_cast<size_t>(n));  // distinct keys: one right answer
      const auto query = prompt.substr(static_cast<size_t>(6 * n));
      ASSERT_EQ(query.size(), 4u);
      EXPECT_EQ(query[0], '?');
      EXPECT_EQ(query[3], '=');
      // the queried key sits at the requested depth, and the answer is its value
      const auto gold_record = prompt.substr(static_cast<size_t>(6 * gold), 6);
      EXPECT_EQ(gold_record.substr(0, 2), query.substr(1, 2));
      EXPECT_EQ(bytes_of(batch.answers[e]), gold_record.substr(3, 2));
      EXPECT_DOUBLE_EQ(batch.depths[e].item<double>(), static_cast<double>(gold) / (n - 1));
    }
  }
  // uniform depth: every record index is drawn, the answer always the queried key's value
  auto uniform = make_retrieval_batch(2000, 5, Haystack::kRecords, std::nullopt, generator);
  auto seen = torch::zeros({5}, torch::kLong);
  for (int64_t e = 0; e < 2000; ++e) {
    const auto prompt = bytes_of(uniform.prompts[e]);
    const auto key = prompt.substr(31, 2);
    const auto at = prompt.find(key + "=");
    ASSERT_LT(at, 30u);
    EXPECT_EQ(at % 6, 0u);
    seen[static_cast<int64_t>(at / 6)] += 1;
    EXPECT_EQ(bytes_of(uniform.answers[e]), prompt.substr(at + 3, 2));
  }
  EXPECT_GT(seen.min().item<int64_t>(), 300);  // 400 expected per index
  // the same generator state gives the same prompts
  auto a = make_retrieval_batch(4, 8, Haystack::kRecords, 0.3, at::detail::createCPUGenerator(1));
  auto b = make_retrieval_batch(4, 8, Haystack::kRecords, 0.3, at::detail::createCPUGenerator(1));
  EXPECT_TRUE(torch::equal(a.prompts, b.prompts));
}

TEST(Retrieval, TextHaystackHidesOneRecord) {
  ByteTokenizer tokenizer;
  auto filler = tokenizer.encode("Call me Ishmael; = ? Some years ago, never mind how long. " +
                                 std::string(400, 'x'));
  auto generator = at::detail::createCPUGenerator(3);
  const int64_t n = 10;  // 60 haystack bytes
  for (double depth : {0.0, 0.25, 1.0}) {
    auto batch = make_retrieval_batch(20, n, Haystack::kText, depth, generator, filler);
    const int64_t offset = std::llround(depth * 54);
    for (int64_t e = 0; e < 20; ++e) {
      const auto prompt = bytes_of(batch.prompts[e]);
      ASSERT_EQ(prompt.size(), 64u);
      const auto haystack = prompt.substr(0, 60);
      // exactly one '=' and one ';' in the haystack: the record's
      EXPECT_EQ(std::count(haystack.begin(), haystack.end(), '='), 1) << haystack;
      EXPECT_EQ(std::count(haystack.begin(), haystack.end(), ';'), 1) << haystack;
      EXPECT_EQ(std::count(haystack.begin(), haystack.end(), '?'), 0) << haystack;
      EXPECT_EQ(haystack.find('='), static_cast<size_t>(offset + 2));
      EXPECT_EQ(prompt.substr(61, 2), haystack.substr(static_cast<size_t>(offset), 2));
      EXPECT_EQ(bytes_of(batch.answers[e]), haystack.substr(static_cast<size_t>(offset) + 3, 2));
      EXPECT_DOUBLE_EQ(batch.depths[e].item<double>(), static_cast<double>(offset) / 54);
    }
  }
  // refusals name the numbers
  auto few = test::error_of([&] {
    make_retrieval_batch(1, 100, Haystack::kText, 0.5, generator, filler.narrow(0, 0, 10));
  });
  EXPECT_NE(few.find("needs at least 600 filler bytes, got 10"), std::string::npos) << few;
  auto many =
      test::error_of([&] { make_retrieval_batch(1, 677, Haystack::kRecords, 0.5, generator); });
  EXPECT_NE(many.find("records must be in [1, 676]"), std::string::npos) << many;
  auto deep =
      test::error_of([&] { make_retrieval_batch(1, 5, Haystack::kRecords, 1.5, generator); });
  EXPECT_NE(deep.find("depth must be in [0, 1], got 1.5"), std::string::npos) << deep;
  auto kind = test::error_of([] { haystack_from_string("json"); });
  EXPECT_NE(kind.find("haystack must be records or text, got 'json'"), std::string::npos) << kind;
}

}  // namespace
}  // namespace posenc::text
