// Composite encoder: every part contributes to one plan; see posenc/encoders/compose.h.
#include "posenc/encoders/compose.h"

#include <torch/torch.h>

namespace posenc {

ComposeImpl::ComposeImpl(std::vector<ComposePart> parts_) : parts(std::move(parts_)) { reset(); }

void ComposeImpl::reset() {
  TORCH_CHECK(!parts.empty(), "compose: at least one encoder is required");
  for (size_t i = 0; i < parts.size(); ++i) {
    TORCH_CHECK(!parts[i].encoder.is_empty(), "compose: encoder ", i, " is empty");
    register_module(std::to_string(i), parts[i].encoder);
  }
}

namespace {

std::string part_name(const ComposePart& part) {
  std::string name = part.encoder->type();
  if (part.modality) name += " on " + to_string(*part.modality);
  return name;
}

// The positions of the selected tokens, on the selected axes: coords [n, A'] (unbatched) or
// [B, n, A'].
Positions select(const Positions& positions, const at::Tensor& tokens,
                 const std::vector<std::string>& axes) {
  const auto device = positions.coords().device();  // the positions may be on a GPU
  auto coords = positions.coords().index_select(-2, tokens.to(device));
  if (axes.empty()) return Positions(coords, positions.axes());
  std::vector<int64_t> index;
  for (const auto& name : axes) index.push_back(positions.axis_index(name));
  return Positions(coords.index_select(-1, torch::tensor(index, torch::kLong).to(device)), axes);
}

}  // namespace

void ComposeImpl::contribute(EncodingPlan& plan, const PlanRequest& request) {
  for (auto& part : parts) {
    if (!part.modality && part.axes.empty()) {
      part.encoder->contribute(plan, request);
      continue;
    }
    if (!part.modality) {
      // Every token, some axes (e.g. RoPE on an audio patch's time axis beside a sinusoidal
      // embedding of its frequency row): the part plans over those axes of the queries and keys;
      // its embedding and rotary tables apply to the whole sequence as they are.
      auto axes_of = [&](const Positions& p) {
        return select(p, torch::arange(p.size(), torch::kLong), part.axes);
      };
      PlanRequest sub(axes_of(request.queries),
                      request.keys.defined() ? axes_of(request.keys) : Positions{},
                      request.rotated_keys.defined() ? axes_of(request.rotated_keys) : Positions{},
                      request.device);
      sub.token_kinds = request.token_kinds;
      EncodingPlan own(sub);
      part.encoder->contribute(own, sub);
      const auto name = part_name(part);
      TORCH_CHECK(!own.has_bias(), "compose: ", name,
                  " reads some axes only and biases the logits; a bias part must read every "
                  "axis (give it no 'axes')");
      if (own.has_additive()) plan.add_embedding(name, own.embedding(), own.prefix_embedding());
      if (own.has_rotary()) plan.set_rotary(name, own.rotary());
      continue;
    }
    // A part on some tokens / axes: its own plan over those, then its embedding scattered into
    // the stream's rows (zeros elsewhere).
    const auto name = part_name(part);
    const int64_t n = request.queries.size();
    std::vector<int64_t> rows;
    {
      TORCH_CHECK(static_cast<int64_t>(request.token_kinds.size()) == n, "compose: ", name,
                  " acts on ", to_string(*part.modality), " tokens, but the positions carry ",
                  request.token_kinds.size(), " token kinds for ", n,
                  " tokens (mixed streams: positions and kinds from build_stream)");
      for (int64_t i = 0; i < n; ++i)
        if (request.token_kinds[i] == *part.modality) rows.push_back(i);
    }
    auto index = torch::tensor(rows, torch::kLong);
    PlanRequest sub;
    sub.queries = select(request.queries, index, part.axes);
    sub.device = request.device;
    EncodingPlan own(sub);
    part.encoder->contribute(own, sub);
    TORCH_CHECK(!own.has_rotary() && !own.has_bias() && !own.prefix_embedding().defined(),
                "compose: ", name, " acts on some tokens only, so it must be additive (it ",
                own.has_rotary() ? "rotates" : "biases the logits",
                "); give rotary and bias encoders the whole stream");
    if (!own.has_additive()) continue;
    const auto& e = own.embedding();  // [n', D] or [B, n', D]
    auto sizes = e.sizes().vec();
    sizes[sizes.size() - 2] = n;
    auto full = torch::zeros(sizes, e.options()).index_copy(-2, index.to(e.device()), e);
    plan.add_embedding(name, full);
  }
}

Description ComposeImpl::describe(const Positions& positions, const DescribeOptions& options) {
  Description out;
  for (size_t i = 0; i < parts.size(); ++i) {
    auto& part = parts[i];
    Positions own = positions;
    if (!part.axes.empty()) {
      own = select(positions, torch::arange(positions.size(), torch::kLong), part.axes);
    }
    if (part.modality) continue;  // needs token kinds: shown through the plan instead
    for (auto& [name, tensor] : part.encoder->describe(own, options))
      out.emplace_back(std::to_string(i) + "." + part.encoder->type() + "/" + name, tensor);
  }
  return out;
}

Restore ComposeImpl::adapt(const Extent& extent) {
  std::vector<Restore> undo;
  for (auto& part : parts) undo.push_back(part.encoder->adapt(extent));
  return [undo] {
    for (auto it = undo.rbegin(); it != undo.rend(); ++it) (*it)();
  };
}

}  // namespace posenc
