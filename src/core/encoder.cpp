// Default entry points of the encoder interface: identities, so an attention layer may call all
// three on any encoder (include/posenc/core/encoder.h).
#include "posenc/core/encoder.h"

#include <torch/torch.h>

#include <cerrno>
#include <thread>

#include "posenc/core/errors.h"

namespace posenc {

bool is_environment_errno(int error) {
  switch (error) {
    case ENOSPC:
    case EDQUOT:
    case EIO:
    case EROFS:
    case EACCES:
    case EPERM:
    case ENOMEM:
    case EMFILE:
    case ENFILE:
      return true;
    default:
      return false;
  }
}

std::string to_string(EncodingKind kind) {
  switch (kind) {
    case EncodingKind::kNone:
      return "none";
    case EncodingKind::kAdditive:
      return "additive";
    case EncodingKind::kRotary:
      return "rotary";
    case EncodingKind::kBias:
      return "bias";
  }
  return "unknown";
}

std::string to_string(BiasForm form) {
  switch (form) {
    case BiasForm::kNone:
      return "none";
    case BiasForm::kAlibi:
      return "alibi";
    case BiasForm::kBucketTable:
      return "bucket_table";
    case BiasForm::kRelativeTable:
      return "relative_table";
  }
  return "unknown";
}

at::Tensor PositionalEncodingImpl::add(const at::Tensor& x, const Positions& /*positions*/) {
  return x;
}

std::pair<at::Tensor, at::Tensor> PositionalEncodingImpl::rotate(const at::Tensor& q,
                                                                 const at::Tensor& k,
                                                                 const Positions& /*q_positions*/,
                                                                 const Positions& /*k_positions*/) {
  return {q, k};
}

at::Tensor PositionalEncodingImpl::bias(const Positions& /*q_positions*/,
                                        const Positions& /*k_positions*/, const at::Tensor& /*q*/) {
  return {};
}

BiasSpec PositionalEncodingImpl::bias_spec() const { return {}; }

Description PositionalEncodingImpl::describe(const Positions& /*positions*/,
                                             const DescribeOptions& /*options*/) {
  return {};
}

void use_all_cores() {
  const unsigned cores = std::thread::hardware_concurrency();
  if (cores > 0) at::set_num_threads(static_cast<int>(cores));
}

}  // namespace posenc
