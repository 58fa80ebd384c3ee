// posenc's encoders in Python (posenc.build_encoder, python/posenc/encoders.py): TorchScript
// custom classes in the dispatcher's library, no Python.h.
//
// torch.classes.posenc.Encoder(config_text, dim, num_heads, head_dim)
//   One positional encoder built from the same JSON or YAML config text as the C++ library and
//   the tool, under the same limits (posenc/config/registry.h parse_config, build_encoder: "type"
//   plus the type's keys; unknown keys and a config over a limit are one line); config() gives
//   it back as JSON. Its parameters and buffers are the C++ module's own tensors (named as its
//   named_parameters / named_buffers): Python optimizers step them in place, autograd accumulates
//   their .grad, set_data moves them (the Python module's .to()).
// torch.classes.posenc.Plan = Encoder.plan(coords, axes, key_coords, device)
//   The encoder's plan for one forward (posenc/core/plan.h): coords [N, A] or [B, N, A] float,
//   axes A names (queries; key_coords: the keys when they differ, e.g. cached ones). Its entries:
//     add(x [B, N, D], prefix)           x + the additive embedding (prefix tokens left as they
//     are) rotate(q, k [B, N, H, Dh])         RoPE on q and k (the plan's rotary part) bias(heads,
//     q)                     every bias part summed: [H, Nq, Nk] or [B, H, Nq, Nk]
//                                        (None without one; q for query-dependent parts)
//     attention(q, k, v [B, N, H, Dh], causal, key_padding, scale)
//                                        attention with the plan's positions (plan_attention:
//                                        fused bias and RoPE where the kernels take them)
//     attention_route(q, k, v, causal, key_padding)  the backend it takes, and why
//     parts()                            "encoder: role" per contribution
// torch.classes.posenc.ConfigLimits(): max_bytes(), max_depth(), max_values()
//   The config limits every door applies (posenc/config/config_reader.h).
#include <torch/custom_class.h>
#include <torch/library.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include "posenc/config/registry.h"
#include "posenc/core/encoder.h"
#include "posenc/core/plan.h"
#include "posenc/core/positions.h"
#include "posenc/nn/attention.h"
#include "posenc/nn/attention_backend.h"
#include "registration.h"

namespace posenc::ops {

namespace {

constexpr const char* kWho = "posenc.build_encoder: ";

// The config limits (posenc/config/config_reader.h), for Python's check of a dict before it
// becomes text (a dict sharing sub-lists, as yaml.safe_load builds from aliases, would expand in
// json.dumps before the text reached the limits here).
struct ConfigLimitsHolder : torch::CustomClassHolder {};

struct PlanHolder : torch::CustomClassHolder {
  explicit PlanHolder(EncodingPlan plan_) : plan(std::move(plan_)) {}
  EncodingPlan plan;
};

struct EncoderHolder : torch::CustomClassHolder {
  EncoderHolder(const std::string& config, int64_t dim, int64_t num_heads, int64_t head_dim) {
    // JSON or YAML text through the config limits (posenc/config/config_reader.h), as the
    // tool's --config: a 50000-deep "compose" is one line here, not a stack overflow
    parsed = parse_config(config, "posenc.build_encoder config");
    TORCH_CHECK(parsed.is_object(), kWho, "the config must be an object with a \"type\", got ",
                parsed.type_name());
    TORCH_CHECK(dim >= 0 && num_heads >= 0 && head_dim >= 0, kWho,
                "dim, num_heads and head_dim must be >= 0 (0: unknown), got ", dim, ", ", num_heads,
                ", ", head_dim);
    ModelContext context;
    context.dim = dim;
    context.num_heads = num_heads;
    context.head_dim = head_dim;
    encoder = build_encoder(parsed, context);
  }

  // One tensor of the module by its dotted name (parameters first, then buffers).
  at::Tensor find(const std::string& name) const {
    for (const auto& item : encoder->named_parameters())
      if (item.key() == name) return item.value();
    for (const auto& item : encoder->named_buffers())
      if (item.key() == name) return item.value();
    TORCH_CHECK(false, kWho, "the encoder has no parameter or buffer '", name, "'");
  }

  nlohmann::json parsed;  // the config as read (Python's Encoder.config)
  PositionalEncoding encoder = nullptr;
};

Positions positions_of(const at::Tensor& coords, const std::vector<std::string>& axes) {
  TORCH_CHECK(coords.defined(), kWho, "coords is undefined");
  return Positions(coords.scalar_type() == at::kDouble ? coords : coords.to(at::kDouble), axes);
}

}  // namespace

POSENC_LIBRARY_FRAGMENT(m) {
  m.class_<ConfigLimitsHolder>("ConfigLimits")
      .def(torch::init<>())
      .def("max_bytes",
           [](const c10::intrusive_ptr<ConfigLimitsHolder>&) { return kMaxConfigBytes; })
      .def("max_depth",
           [](const c10::intrusive_ptr<ConfigLimitsHolder>&) { return int64_t{kMaxConfigDepth}; })
      .def("max_values",
           [](const c10::intrusive_ptr<ConfigLimitsHolder>&) { return kMaxConfigNodes; });

  m.class_<PlanHolder>("Plan")
      .def("add", [](const c10::intrusive_ptr<PlanHolder>& self, const at::Tensor& x,
                     int64_t prefix) { return self->plan.apply_additive(x, prefix); })
      .def(
          "rotate",
          [](const c10::intrusive_ptr<PlanHolder>& self, const at::Tensor& q, const at::Tensor& k) {
            auto [qr, kr] = self->plan.apply_rotary(q, k);
            return std::make_tuple(qr, kr);
          })
      .def("bias",
           [](const c10::intrusive_ptr<PlanHolder>& self, int64_t heads, const at::Tensor& q) {
             TORCH_CHECK(heads >= 1, kWho, "bias needs heads >= 1, got ", heads);
             return self->plan.materialize_bias(heads, q);
           })
      .def("attention",
           [](const c10::intrusive_ptr<PlanHolder>& self, const at::Tensor& q, const at::Tensor& k,
              const at::Tensor& v, bool causal, const at::Tensor& key_padding, double scale) {
             return plan_attention(self->plan, q, k, v, causal,
                                   key_padding.numel() > 0 ? key_padding : at::Tensor(), scale);
           })
      .def("attention_route",
           [](const c10::intrusive_ptr<PlanHolder>& self, const at::Tensor& q, const at::Tensor& k,
              const at::Tensor& v, bool causal, bool key_padding) {
             return describe(plan_attention_route(self->plan, q, k, v, causal, key_padding));
           })
      .def("has_bias",
           [](const c10::intrusive_ptr<PlanHolder>& self) { return self->plan.has_bias(); })
      .def("parts", [](const c10::intrusive_ptr<PlanHolder>& self) {
        std::vector<std::string> out;
        for (const auto& part : self->plan.parts()) out.push_back(part.encoder + ": " + part.role);
        return out;
      });

  m.class_<EncoderHolder>("Encoder")
      .def(torch::init<std::string, int64_t, int64_t, int64_t>())
      .def("type",
           [](const c10::intrusive_ptr<EncoderHolder>& self) { return self->encoder->type(); })
      .def("config",
           [](const c10::intrusive_ptr<EncoderHolder>& self) { return self->parsed.dump(); })
      .def("parameter_names",
           [](const c10::intrusive_ptr<EncoderHolder>& self) {
             std::vector<std::string> out;
             for (const auto& item : self->encoder->named_parameters()) out.push_back(item.key());
             return out;
           })
      .def("parameters",
           [](const c10::intrusive_ptr<EncoderHolder>& self) {
             std::vector<at::Tensor> out;
             for (const auto& item : self->encoder->named_parameters()) out.push_back(item.value());
             return out;
           })
      .def("buffer_names",
           [](const c10::intrusive_ptr<EncoderHolder>& self) {
             std::vector<std::string> out;
             for (const auto& item : self->encoder->named_buffers()) out.push_back(item.key());
             return out;
           })
      .def("buffers",
           [](const c10::intrusive_ptr<EncoderHolder>& self) {
             std::vector<at::Tensor> out;
             for (const auto& item : self->encoder->named_buffers()) out.push_back(item.value());
             return out;
           })
      .def("set_data",
           [](const c10::intrusive_ptr<EncoderHolder>& self, const std::string& name,
              const at::Tensor& value) {
             auto t = self->find(name);
             TORCH_CHECK(value.sizes() == t.sizes(), kWho, "'", name, "' is ", t.sizes(),
                         ", the new value ", value.sizes());
             t.set_data(value);
           })
      .def("train",
           [](const c10::intrusive_ptr<EncoderHolder>& self, bool on) { self->encoder->train(on); })
      .def("plan", [](const c10::intrusive_ptr<EncoderHolder>& self, const at::Tensor& coords,
                      const std::vector<std::string>& axes, const at::Tensor& key_coords,
                      const std::string& device) {
        PlanRequest request{positions_of(coords, axes)};
        if (key_coords.defined() && key_coords.numel() > 0)
          request.keys = positions_of(key_coords, axes);
        request.device = c10::Device(device);
        return c10::make_intrusive<PlanHolder>(self->encoder->plan(request));
      });
}

}  // namespace posenc::ops
