// Key-value retrieval prompts; layout and depth rules in retrieval.h (Liu et al. 2023, "Lost in
// the Middle: How Language Models Use Long Contexts", the key-value retrieval experiment).
#include "text/retrieval.h"

#include <torch/torch.h>

#include <cmath>

namespace posenc::text {

Haystack haystack_from_string(const std::string& name) {
  if (name == "records") return Haystack::kRecords;
  if (name == "text") return Haystack::kText;
  TORCH_CHECK(false, "task: haystack must be records or text, got '", name, "'");
}

namespace {

// key index k in [0, 676) -> its two capital letters [.., 2]; value v in [0, 100) -> two digits.
at::Tensor key_bytes(const at::Tensor& k) {
  return torch::stack({k.div(26, "floor"), k.remainder(26)}, -1) + 'A';
}
at::Tensor value_bytes(const at::Tensor& v) {
  return torch::stack({v.div(10, "floor"), v.remainder(10)}, -1) + '0';
}

}  // namespace

RetrievalBatch make_retrieval_batch(int64_t count, int64_t records, Haystack haystack,
                                    std::optional<double> depth, at::Generator generator,
                                    const at::Tensor& filler) {
  TORCH_CHECK(count > 0, "retrieval: count must be > 0, got ", count);
  TORCH_CHECK(records >= 1 && records <= kMaxRecords, "retrieval: records must be in [1, ",
              kMaxRecords, "] (distinct two-letter keys), got ", records);
  TORCH_CHECK(!depth || (*depth >= 0 && *depth <= 1), "retrieval: depth must be in [0, 1], got ",
              depth.value_or(0));
  const auto longs = torch::TensorOptions().dtype(torch::kLong);
  const int64_t hay = kRecordBytes * records;  // haystack bytes
  RetrievalBatch batch;
  at::Tensor gold_key, gold_value;  // [B, 2] bytes each
  at::Tensor body;                  // [B, 6 N]
  if (haystack == Haystack::kRecords) {
    // N distinct keys per prompt: the first N of a random permutation of the 676
    auto keys =
        torch::rand({count, kMaxRecords}, generator).argsort(-1, false).narrow(1, 0, records);
    auto values = torch::randint(0, 100, {count, records}, generator, longs);
    auto kb = key_bytes(keys), vb = value_bytes(values);  // [B, N, 2] each
    auto eq = torch::full({count, records, 1}, '=', longs);
    auto semi = torch::full({count, records, 1}, ';', longs);
    body = torch::cat({kb, eq, vb, semi}, -1).reshape({count, hay});
    at::Tensor gold = depth ? torch::full({count}, std::llround(*depth * (records - 1)), longs)
                            : torch::randint(0, records, {count}, generator, longs);
    auto index = gold.view({count, 1, 1}).expand({count, 1, 2});
    gold_key = kb.gather(1, index).squeeze(1);
    gold_value = vb.gather(1, index).squeeze(1);
    batch.depths = records > 1 ? gold.to(torch::kDouble) / static_cast<double>(records - 1)
                               : torch::zeros({count}, torch::kDouble);
  } else {
    TORCH_CHECK(filler.defined() && filler.dim() == 1 && filler.size(0) >= hay,
                "retrieval: the text haystack needs at least ", hay, " filler bytes, got ",
                filler.defined() ? filler.numel() : 0);
    auto start = torch::randint(0, filler.size(0) - hay + 1, {count, 1}, generator, longs);
    body = filler.to(torch::kLong)
               .index_select(0, (start + torch::arange(hay, longs)).flatten())
               .view({count, hay});
    // the record must be the only one: no '=', '?' or ';' in the prose around it
    body.masked_fill_(body.eq('=').logical_or_(body.eq('?')).logical_or_(body.eq(';')), ' ');
    auto keys = torch::randint(0, kMaxRecords, {count}, generator, longs);
    auto values = torch::randint(0, 100, {count}, generator, longs);
    gold_key = key_bytes(keys);
    gold_value = value_bytes(values);
    const int64_t last = hay - kRecordBytes;  // the last offset where a record fits
    at::Tensor offset = depth ? torch::full({count}, std::llround(*depth * last), longs)
                              : torch::randint(0, last + 1, {count}, generator, longs);
    auto record = torch::cat({gold_key, torch::full({count, 1}, '=', longs), gold_value,
                              torch::full({count, 1}, ';', longs)},
                             -1);  // [B, 6]
    body.scatter_(1, offset.view({count, 1}) + torch::arange(kRecordBytes, longs), record);
    batch.depths = last > 0 ? offset.to(torch::kDouble) / static_cast<double>(last)
                            : torch::zeros({count}, torch::kDouble);
  }
  auto query = torch::cat(
      {torch::full({count, 1}, '?', longs), gold_key, torch::full({count, 1}, '=', longs)},
      -1);  // [B, 4]
  batch.prompts = torch::cat({body, query}, 1);
  batch.answers = gold_value;
  return batch;
}

}  // namespace posenc::text
