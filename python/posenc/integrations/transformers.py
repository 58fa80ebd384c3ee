"""posenc in a loaded transformers model: its rotary modules and its rotation replaced by posenc's.

    model = AutoModelForCausalLM.from_config(config)
    posenc.integrations.transformers.patch(model)     # logits equal (float32: to the bit)
    posenc.integrations.transformers.unpatch(model)

What is replaced, for the model families listed in SUPPORTED (each checked against transformers'
own modeling code by tests/python/test_transformers_patch.py, logits and gradients):
  - every <Model>RotaryEmbedding module of the family's modeling file -> posenc.RotaryEmbedding
    built from the same config (the same contract: forward(x, position_ids[, layer_type]));
  - the modeling file's apply_rotary_pos_emb -> posenc.apply_rotary_pos_emb in the layout the
    config resolves to (GLM: interleaved, partial).
The function is a global of the modeling file, so every model of that family in the process
takes posenc's rotation until unpatch. A family not listed is refused with one line: its rotary
code has not been compared with posenc's, and a silent difference is the one thing posenc must
not give.
"""

from __future__ import annotations

import importlib

import torch

from ..rotary import RotaryEmbedding, apply_rotary_pos_emb

# model_type -> (the modeling file, its text rotary classes replaced). A tower's rotary class
# (Qwen2-VL's vision rotary) is left as it is.
SUPPORTED = {
    "llama": ("transformers.models.llama.modeling_llama", ("LlamaRotaryEmbedding",)),
    "mistral": ("transformers.models.mistral.modeling_mistral", ("MistralRotaryEmbedding",)),
    "qwen2": ("transformers.models.qwen2.modeling_qwen2", ("Qwen2RotaryEmbedding",)),
    "qwen3": ("transformers.models.qwen3.modeling_qwen3", ("Qwen3RotaryEmbedding",)),
    "qwen2_vl": ("transformers.models.qwen2_vl.modeling_qwen2_vl", ("Qwen2VLRotaryEmbedding",)),
    "gemma3_text": ("transformers.models.gemma3.modeling_gemma3", ("Gemma3RotaryEmbedding",)),
    "phi3": ("transformers.models.phi3.modeling_phi3", ("Phi3RotaryEmbedding",)),
    "glm": ("transformers.models.glm.modeling_glm", ("GlmRotaryEmbedding",)),
}

_ORIGINAL = "_posenc_original_apply_rotary_pos_emb"


def _rotation(layout: str):
    def posenc_apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
        return apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim, layout=layout)

    posenc_apply_rotary_pos_emb.posenc_layout = layout
    return posenc_apply_rotary_pos_emb


def _buffer_device(module: torch.nn.Module) -> torch.device:
    for b in module.buffers():
        return b.device
    return torch.device("cpu")


def patch(model: torch.nn.Module, angle_dtype: str = "float32") -> torch.nn.Module:
    """Replaces the model's rotary modules and rotation by posenc's; returns the model."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type not in SUPPORTED:
        raise ValueError(f"posenc.patch: model type '{model_type}' is not one posenc has checked "
                         f"against transformers' code; supported: {', '.join(sorted(SUPPORTED))}")
    module_name, classes = SUPPORTED[model_type]
    modeling = importlib.import_module(module_name)
    layouts = set()
    replaced = 0
    for name, sub in list(model.named_modules()):
        if type(sub).__module__ != modeling.__name__ or type(sub).__name__ not in classes:
            continue
        ours = RotaryEmbedding.from_hf_config(sub.config, angle_dtype=angle_dtype)
        ours.to(_buffer_device(sub))
        ours.posenc_replaced = (type(sub), sub.config)
        layouts.update(t.layout for t in ours._tables.values())
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, ours)
        replaced += 1
    if replaced == 0:
        raise ValueError(f"posenc.patch: no rotary module of {modeling.__name__} in this model")
    if len(layouts) != 1:
        raise ValueError(f"posenc.patch: the rotary modules resolve to different layouts {sorted(layouts)}")
    if not hasattr(modeling, _ORIGINAL):
        setattr(modeling, _ORIGINAL, modeling.apply_rotary_pos_emb)
    modeling.apply_rotary_pos_emb = _rotation(layouts.pop())
    return model


def unpatch(model: torch.nn.Module) -> torch.nn.Module:
    """Restores transformers' rotation and rotary modules (rebuilt from the model's config)."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type not in SUPPORTED:
        return model
    modeling = importlib.import_module(SUPPORTED[model_type][0])
    for name, sub in list(model.named_modules()):
        replaced = getattr(sub, "posenc_replaced", None)
        if replaced is None:
            continue
        cls, config = replaced
        theirs = cls(config)
        theirs.to(_buffer_device(sub))
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, theirs)
    if hasattr(modeling, _ORIGINAL):
        modeling.apply_rotary_pos_emb = getattr(modeling, _ORIGINAL)
        delattr(modeling, _ORIGINAL)
    return model
