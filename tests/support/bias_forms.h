// Test support: the attention bias forms the fused-attention tests (CPU and CUDA) sweep, as
// BiasSpecs: none; ALiBi (Press et al. 2022) causal or symmetric; T5 buckets (Raffel et al. 2020)
// bidirectional or not, with a given [num_buckets, H] table and max_distance 40.
#pragma once

#include <torch/torch.h>

#include "posenc/posenc.h"

namespace posenc::test {

enum class Form { kNone, kAlibiCausal, kAlibiSymmetric, kT5Bidirectional, kT5Unidirectional };

inline BiasSpec spec_for(Form form, int64_t heads, const at::Tensor& table) {
  BiasSpec spec;
  switch (form) {
    case Form::kNone:
      break;
    case Form::kAlibiCausal:
    case Form::kAlibiSymmetric:
      spec.form = BiasForm::kAlibi;
      spec.slopes = torch::tensor(alibi_slopes(heads), torch::kFloat64).to(torch::kFloat32);
      spec.symmetric = form == Form::kAlibiSymmetric;
      break;
    case Form::kT5Bidirectional:
    case Form::kT5Unidirectional:
      spec.form = BiasForm::kBucketTable;
      spec.table = table;
      spec.num_buckets = table.size(0);
      spec.max_distance = 40;
      spec.bidirectional = form == Form::kT5Bidirectional;
      break;
  }
  return spec;
}

}  // namespace posenc::test
