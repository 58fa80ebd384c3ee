"""posenc: positional encodings for transformers, in PyTorch's dispatcher.

    import posenc
    q, k = posenc.apply_rotary_pos_emb(q, k, cos, sin)            # transformers' function
    rope = posenc.RotaryEmbedding.from_hf_config("config.json")    # transformers' module contract
    cos, sin = rope(x, position_ids)
    posenc.integrations.transformers.patch(model)                  # a loaded HF model, patched

    posenc.timm_layers.resample_abs_pos_embed(posemb, (h, w))      # timm's functions
    pos, deltas = posenc.get_rope_index(input_ids, mm_token_type_ids, image_grid_thw)  # Qwen2-VL

    enc = posenc.build_encoder({"type": "alibi"}, num_heads=8)     # any encoder of the C++ library
    plan = enc(posenc.Positions.sequence(n))                       # add / rotate / bias entries
    pos, deltas = posenc.get_rope_index_omni(input_ids, image_grid_thw, video_grid_thw)  # 2.5-Omni

The operators are torch.ops.posenc.{apply_rotary, apply_rotary_, rope_cos_sin, hf_rope} and
{rope_rotate, rope_rotate_qk, rope_rotate_} (the C++ library's rotation, which its encoders and
trainer call through the dispatcher), with CPU, CUDA, Autograd and fake kernels
(torch.compile(fullgraph=True) and torch.export take them), and {resample_grid_table,
axial_sincos_table, sinusoidal_table, patch_grid_bands, patch_grid_coords, dinov3_periods,
rope_periods_cos_sin, rope_mixed_cos_sin},
compositions of ATen ops, patch_grid_rope (timm's axial RoPE tables), and
qwen2_vl_rope_index and qwen2_5_omni_rope_index (stream positions, integer bookkeeping on the
CPU), and shaw_attention and positional_attention (the bias computed on the fly, RoPE inside the
tiles; CPU, CUDA, Autograd and fake kernels; posenc.alibi_attention and posenc.t5_attention are
positional_attention with one bias part). Which path a call
takes, and why the others were passed over: posenc.positional_attention_route,
posenc.apply_rotary_route and Plan.attention_route, each a posenc.AttentionRoute.
"""

from . import _library

_library.load()

from . import integrations, timm_layers  # noqa: E402
from .attention import (  # noqa: E402
    alibi_attention,
    alibi_slopes,
    positional_attention,
    shaw_attention,
    t5_attention,
)
from .encoders import Encoder, Plan, Positions, build_encoder  # noqa: E402
from .integrations import chronos as _chronos_integration  # noqa: E402,F401
from .integrations import diffusers as _diffusers_integration  # noqa: E402,F401
from .integrations import timesfm as _timesfm_integration  # noqa: E402,F401
from .integrations import timm as _timm_integration  # noqa: E402,F401
from .integrations import toto as _toto_integration  # noqa: E402,F401
from .integrations import transformers as _transformers_integration  # noqa: E402,F401
from .integrations import uni2ts as _uni2ts_integration  # noqa: E402,F401
from .rotary import (  # noqa: E402
    RotaryEmbedding,
    apply_rotary_pos_emb,
    apply_rotary_pos_emb_,
    hf_rope,
    rope_cos_sin,
    rope_rotate,
    rope_rotate_qk,
)
from .routes import AttentionRoute, apply_rotary_route, positional_attention_route  # noqa: E402
from .streams import get_rope_index, get_rope_index_omni  # noqa: E402
from .tables import sinusoidal_table  # noqa: E402

__version__ = "0.1.0"
__all__ = [
    "AttentionRoute",
    "Encoder",
    "Plan",
    "Positions",
    "build_encoder",
    "RotaryEmbedding",
    "alibi_attention",
    "alibi_slopes",
    "get_rope_index",
    "get_rope_index_omni",
    "apply_rotary_pos_emb",
    "apply_rotary_pos_emb_",
    "apply_rotary_route",
    "hf_rope",
    "rope_cos_sin",
    "rope_rotate",
    "rope_rotate_qk",
    "positional_attention",
    "positional_attention_route",
    "shaw_attention",
    "sinusoidal_table",
    "t5_attention",
    "integrations",
    "timm_layers",
]
