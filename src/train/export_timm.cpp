// A run's ViT as timm's VisionTransformer; the correspondence and the refusals are in
// posenc/train/export_timm.h.
#include "posenc/train/export_timm.h"

#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <set>

#include "posenc/config/registry.h"
#include "posenc/io/durable_file.h"
#include "posenc/nn/models.h"
#include "posenc/train/checkpoint.h"
#include "posenc/train/task.h"

namespace posenc::train {

namespace fs = std::filesystem;

namespace {

constexpr double kTimmNormEps = 1e-6;  // timm's LayerNorm default (timm/layers/norm.py)

at::Tensor host(const at::Tensor& t) { return t.detach().to(torch::kCPU).contiguous(); }

}  // namespace

TimmExport timm_export(const nlohmann::json& config, const std::string& weights) {
  const auto type = config.at("task").value("type", std::string());
  TORCH_CHECK(type == "image_classification", "export --to timm: the run's task is '", type,
              "'; only image_classification ViTs have a timm counterpart");
  torch::manual_seed(0);
  auto task = make_task(config);
  auto model = std::dynamic_pointer_cast<TokenClassifierImpl>(task->model());
  TORCH_CHECK(model, "export --to timm: the run's model is not a TokenClassifier");
  load_parameters(weights, *model);
  model->eval();
  torch::NoGradGuard no_grad;
  const auto input = task->image_input();
  const auto& t = model->options.transformer();
  auto transformer = model->transformer;
  const int64_t d = t.dim(), heads = t.num_heads(), layers = t.num_layers();
  const int64_t patch = input.at("patch").get<int64_t>();
  const int64_t channels = input.at("channels").get<int64_t>();
  const int64_t side = input.at("image_size").get<int64_t>() + 2 * input.at("pad").get<int64_t>();
  const int64_t grid = side / patch;
  const bool cls = model->options.pooling() == Pooling::kCls;
  const std::string encoder = transformer->encoder->type();
  // Settings timm's ViT fixes.
  const double eps = transformer->norm->options.eps();
  TORCH_CHECK(eps == kTimmNormEps, "export --to timm: the model's LayerNorm eps is ", eps,
              ", timm's ViT uses 1e-06 (train with model.norm_eps: 1e-6 to export)");
  TORCH_CHECK(!t.causal(),
              "export --to timm: the model's attention is causal; timm's ViT's is not");
  TORCH_CHECK(t.temperature() == AttentionTemperature::kNone,
              "export --to timm: the model scales its logits by an attention temperature; timm's "
              "ViT has none");
  TORCH_CHECK(t.attention_scale() == 0 ||
                  t.attention_scale() == 1.0 / std::sqrt(static_cast<double>(d / heads)),
              "export --to timm: the model's attention scale is ", t.attention_scale(),
              ", timm's ViT uses 1/sqrt(head_dim)");
  const auto hidden =
      model->transformer->blocks[0]->as<TransformerBlockImpl>()->fc1->options.out_features();
  TORCH_CHECK(static_cast<int64_t>(static_cast<double>(d) * t.mlp_ratio()) == hidden,
              "export --to timm: the MLP width ", hidden, " is not int(D mlp_ratio)");
  // The encoder through its plan at the training grid: additive only.
  auto plan = transformer->encoder->plan(Positions::grid(grid, grid));
  TORCH_CHECK(!plan.has_rotary(), "export --to timm: the '", encoder,
              "' encoder rotates q and k; timm's EVA / ViT-RoPE attention has no key bias (a zero "
              "buffer) while posenc's qkv learns one, which the rotation makes "
              "position-dependent: no timm architecture computes the same");
  TORCH_CHECK(!plan.has_bias(), "export --to timm: the '", encoder,
              "' encoder adds a bias to the attention logits; timm's ViT adds none");
  const int64_t prefix = cls ? 1 : 0;
  at::Tensor pos_embed;
  if (plan.has_additive()) {
    auto added = plan.apply_additive(torch::zeros({1, prefix + grid * grid, d}), prefix);
    TORCH_CHECK(prefix == 0 || host(added.narrow(1, 0, prefix)).abs().max().item<double>() == 0,
                "export --to timm: the '", encoder,
                "' encoder gives the class token a position; timm's no_embed_class does not");
    pos_embed = host(added.narrow(1, prefix, grid * grid));
  }

  TimmExport out;
  out.input = input;
  out.classes = task->class_names();
  out.model_name = "vit_base_patch16_224";  // its defaults all overridden below
  out.model_args = {{"img_size", side},
                    {"patch_size", patch},
                    {"in_chans", channels},
                    {"num_classes", model->options.num_classes()},
                    {"embed_dim", d},
                    {"depth", layers},
                    {"num_heads", heads},
                    {"mlp_ratio", t.mlp_ratio()},
                    {"qkv_bias", true},
                    {"class_token", cls},
                    {"global_pool", cls ? "token" : "avg"},
                    {"fc_norm", false},
                    {"no_embed_class", true},
                    {"pos_embed", pos_embed.defined() ? "learn" : "none"},
                    {"init_values", nullptr}};
  auto& w = out.tensors;
  std::set<std::string> used;  // posenc names mapped
  auto take = [&](const std::string& timm_name, const std::string& name, at::Tensor value) {
    w.emplace_back(timm_name, host(value).to(torch::kFloat32));
    used.insert(name);
  };
  take("patch_embed.proj.weight", "embed.weight",
       model->embed->weight.view({d, channels, patch, patch}));
  take("patch_embed.proj.bias", "embed.bias", model->embed->bias);
  if (cls) take("cls_token", "cls", model->cls);
  if (pos_embed.defined()) w.emplace_back("pos_embed", pos_embed.to(torch::kFloat32));
  for (int64_t i = 0; i < layers; ++i) {
    auto block = transformer->blocks[i]->as<TransformerBlockImpl>();
    const auto ours = "transformer.blocks." + std::to_string(i) + ".";
    const auto theirs = "blocks." + std::to_string(i) + ".";
    auto linear = [&](const std::string& timm_part, const std::string& our_part,
                      const torch::nn::Linear& layer) {
      take(theirs + timm_part + ".weight", ours + our_part + ".weight", layer->weight);
      take(theirs + timm_part + ".bias", ours + our_part + ".bias", layer->bias);
    };
    auto norm = [&](const std::string& part, const torch::nn::LayerNorm& layer) {
      TORCH_CHECK(layer->options.eps() == kTimmNormEps, "export --to timm: block ", i,
                  "'s LayerNorm eps is ", layer->options.eps(), ", timm's is 1e-06");
      take(theirs + part + ".weight", ours + part + ".weight", layer->weight);
      take(theirs + part + ".bias", ours + part + ".bias", layer->bias);
    };
    norm("norm1", block->norm1);
    linear("attn.qkv", "attention.qkv", block->attention->qkv);
    linear("attn.proj", "attention.out", block->attention->out);
    norm("norm2", block->norm2);
    linear("mlp.fc1", "fc1", block->fc1);
    linear("mlp.fc2", "fc2", block->fc2);
  }
  take("norm.weight", "transformer.norm.weight", transformer->norm->weight);
  take("norm.bias", "transformer.norm.bias", transformer->norm->bias);
  take("head.weight", "head.weight", model->head->weight);
  take("head.bias", "head.bias", model->head->bias);
  // Every parameter is mapped or is the encoder's (carried by pos_embed through its plan).
  for (const auto& item : model->named_parameters()) {
    const auto& name = item.key();
    TORCH_CHECK(used.count(name) || name.rfind("transformer.encoder.", 0) == 0,
                "export --to timm: the parameter '", name, "' has no place in timm's ViT");
  }
  return out;
}

std::string export_run_to_timm(const std::string& run, const std::string& out) {
  const auto config_path = run + "/config.json";
  TORCH_CHECK(fs::is_regular_file(config_path), "export: '", run,
              "' is not a run folder with a config.json (runs trained by this posenc write it)");
  const auto config = load_config(config_path);
  const auto weights = fs::is_regular_file(run + "/weights.safetensors")
                           ? run + "/weights.safetensors"
                           : run + "/weights.pt";
  TORCH_CHECK(fs::is_regular_file(weights), "export: '", run,
              "' has no weights.safetensors or weights.pt (has the run finished?)");
  auto exported = timm_export(config, weights);
  const std::string folder = out.empty() ? run + "/timm" : out;
  fs::create_directories(folder);
  write_safetensors(folder + "/model.safetensors", exported.tensors, {{"format", "pt"}});
  nlohmann::ordered_json description = {{"model_name", exported.model_name},
                                        {"model_args", exported.model_args},
                                        {"input", exported.input},
                                        {"classes", exported.classes}};
  write_file_atomically(folder + "/timm.json", description.dump(2) + "\n");
  return folder;
}

}  // namespace posenc::train
