"""Which transformers families posenc.integrations.transformers.patch() may take: each checked by
running a small randomly initialised model of the family through transformers' own modeling code
with and without patch(), as tests/python/test_transformers_patch.py does for the hand-written ones.

A family is listed (python/posenc/integrations/_families.py, written by tools/gen_patch_families.py)
only when, for its causal LM built from its config class's defaults made small (SMALL below):
  - the patched model holds posenc's rotary modules in place of every text rotary module of the
    modeling file, and the file's rotation is posenc's (integration.ROTATIONS: apply_rotary_pos_emb
    on "half" or "interleaved" pairs, DeepSeek's apply_rotary_pos_emb_interleave ("deinterleave"),
    Gemma 4's one-tensor apply_rotary_pos_emb ("half_one"); the one under which the logits agree);
  - logits are equal to the bit (float32) with default positions and with packed position_ids (two
    sequences in a row), and every parameter's gradient within rtol 1e-5, atol 1e-7;
  - posenc's rotation reaches the logits, a model of the family left unpatched is unchanged, and
    bfloat16/float16 copies give their own logits to the bit (check() says how);
  - unpatch() gives transformers' rotation back.
Every number comes from transformers' code; posenc's side is the package under test. A family that
does not build small, raises, or differs in one logit is not listed: patch() refuses it by name.

Shared by the generator and tests/python/test_transformers_families.py (which re-checks every listed
family with the same harness).
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import io
import logging
import warnings

import torch

# The sizes a family's config is made small with: each key is set where the config class has it
# (on the config, and on its text_config when it has one). Values chosen to fit the constraints of
# most families: heads divide the width, head_dim even, rotary dims even at partial factor 0.5.
SMALL = dict(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=101,
    max_position_embeddings=256,
    vocab_size_per_layer_input=101,
    hidden_size_per_layer_input=16,
    moe_intermediate_size=32,
    shared_expert_intermediate_size=32,
    num_experts=4,
    num_local_experts=4,
    n_routed_experts=4,
    num_experts_per_tok=2,
    n_shared_experts=1,
    n_group=1,
    topk_group=1,
    first_k_dense_replace=1,
    kv_lora_rank=16,
    q_lora_rank=32,
    qk_rope_head_dim=8,
    qk_nope_head_dim=8,
    v_head_dim=16,
    n_embd=64,
    n_head=4,
    n_layer=2,
    n_positions=256,
    rotary_dim=8,
    d_model=64,
    num_layers=2,
    sliding_window=4,
    index_topk=4,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)
VOCAB = SMALL["vocab_size"]
TOKENS = 13


def modeling_module(model_type: str):
    from transformers.models.auto.configuration_auto import model_type_to_module_name

    name = model_type_to_module_name(model_type)
    return importlib.import_module(f"transformers.models.{name}.modeling_{name}")


# Families whose rotary code fixes a size SMALL would break: Qwen 3.5's modules rotate M-RoPE
# sections of 11 + 11 + 10 pairs (their default) over head_dim * 0.25 dims, so the heads stay 256
# wide (64 rotary dims) for the small model to be the family's.
FAMILY_SMALL = {
    "qwen3_5_text": dict(head_dim=256),
    "qwen3_5_moe_text": dict(head_dim=256),
}


def _small(base: dict, model_type: str = "") -> dict:
    """SMALL's keys the config has (and FAMILY_SMALL's). Multi-head latent attention (DeepSeek's
    qk_rope_head_dim) sizes its heads from its own keys (head_dim left to the config) and has as
    many key heads as query heads. A list of layer types longer than the small model keeps each
    type once, in order (hybrid families: a linear-attention layer and an attention layer), when
    they fit."""
    keys = {k: v for k, v in SMALL.items() if k in base}
    if "qk_rope_head_dim" in base:
        keys.pop("head_dim", None)
        if "num_key_value_heads" in keys:
            keys["num_key_value_heads"] = keys["num_attention_heads"]
    layer_types = base.get("layer_types")
    layers = keys.get("num_hidden_layers")
    if isinstance(layer_types, list) and layers and len(layer_types) > layers:
        distinct = list(dict.fromkeys(layer_types))
        if len(distinct) <= layers:
            keys["layer_types"] = distinct + [distinct[-1]] * (layers - len(distinct))
    keys.update(FAMILY_SMALL.get(model_type, {}))
    return keys


def small_config(model_type: str):
    """The family's config class with its defaults made small (SMALL), eager attention."""
    import transformers

    cls = transformers.CONFIG_MAPPING[model_type]
    base = cls().to_dict()
    kwargs = _small(base, model_type)
    if isinstance(base.get("text_config"), dict):
        kwargs["text_config"] = _small(
            base["text_config"], base["text_config"].get("model_type", "")
        )
    config = cls(**kwargs)
    config._attn_implementation = "eager"
    text = getattr(config, "text_config", None)
    if text is not None and hasattr(text, "_attn_implementation"):
        text._attn_implementation = "eager"
    return config


MAX_PARAMETERS = 4_000_000  # a family whose config does not shrink below this is not built


def build(model_type: str):
    import transformers

    config = small_config(model_type)
    with torch.device("meta"):  # sizes first: a default that SMALL does not reach is not allocated
        size = sum(
            p.numel() for p in transformers.AutoModelForCausalLM.from_config(config).parameters()
        )
    if size > MAX_PARAMETERS:
        raise ValueError(
            f"the small config still has {size} parameters (MAX_PARAMETERS {MAX_PARAMETERS})"
        )
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config).eval()


def inputs():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, VOCAB, (2, TOKENS), generator=g)
    packed = torch.tensor([list(range(TOKENS)), list(range(6)) + list(range(TOKENS - 6))])
    return ids, packed


def run(model, ids, positions=None):
    model.zero_grad()
    out = model(input_ids=ids, position_ids=positions, use_cache=False)
    out.logits.float().square().mean().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.logits.detach(), grads


def text_rotary_classes(model, modeling) -> tuple:
    """The rotary classes of the modeling file with instances in the model taking a config with a
    forward(x, position_ids): the ones patch() replaces."""
    names = set()
    for sub in model.modules():
        cls = type(sub)
        if (
            cls.__module__ == modeling.__name__
            and cls.__name__.endswith("RotaryEmbedding")
            and getattr(sub, "config", None) is not None
        ):
            names.add(cls.__name__)
    return tuple(sorted(names))


@contextlib.contextmanager
def quiet():
    logging.disable(logging.WARNING)
    with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        try:
            yield
        finally:
            logging.disable(logging.NOTSET)


def compare(want, got) -> str | None:
    """None when equal as the contract says, else why not."""
    for (lw, gw), (lg, gg) in zip(want, got):
        if lw.shape != lg.shape or not torch.equal(lw, lg):
            return (
                f"logits differ by {(lw - lg).abs().max().item():.3g}"
                if lw.shape == lg.shape
                else "logits' shapes differ"
            )
        if gw.keys() != gg.keys():
            return "other parameters have gradients"
        for key in gw:
            if not torch.allclose(gg[key], gw[key], rtol=1e-5, atol=1e-7):
                return f"gradient of {key} differs by {(gg[key] - gw[key]).abs().max().item():.3g}"
    return None


def logits(model, ids, positions=None):
    with torch.no_grad():
        return model(input_ids=ids, position_ids=positions, use_cache=False).logits


def other_precision_copies(model):
    """The model in bfloat16 and float16 as users get them: every tensor cast (model.to(dtype):
    the frequency buffers too) and the parameters only (from_pretrained(dtype=...): buffers made
    at construction stay float32); and in float64."""
    for dtype in (torch.bfloat16, torch.float16):
        yield f"{dtype} by .to()", copy.deepcopy(model).to(dtype)
        params_only = copy.deepcopy(model)
        for p in params_only.parameters():
            p.data = p.data.to(dtype)
        yield f"{dtype} parameters (from_pretrained)", params_only
    yield "torch.float64 by .to()", copy.deepcopy(model).to(torch.float64)


def check(model_type: str, classes: tuple, layout: str, model=None) -> str | None:
    """Patches a small model of the family with (classes, layout) and compares: None when equal.

    Beyond the float32 logits and gradients (default and packed positions), a family must show:
      - posenc's rotation reaches the logits: turned by -angle (sin negated) they change;
      - a model of the family left unpatched computes what it did while another is patched (the
        rotation is a global of the file: it must be the family's own for its own tables);
      - bfloat16 and float16 copies (cast whole, or parameters only) and a float64 copy give their
        own logits to the bit and their gradients (rtol 1e-5) when patched, where transformers'
        own model runs in that dtype (families that rotate in float32 on purpose do not).
    """
    from posenc.integrations import transformers as integration

    modeling = modeling_module(model_type)
    if model is None:
        model = build(model_type)
    if model.config.model_type != model_type:
        return f"its causal LM's config is of model type '{model.config.model_type}'"
    ids, packed = inputs()
    want = [run(model, ids), run(model, ids, packed)]
    entry = (modeling.__name__, classes, layout)
    function = integration.ROTATIONS[layout].function  # the file's function posenc's replaces
    patched = integration._patch_with(copy.deepcopy(model), model_type, entry)
    rotation = getattr(modeling, function)
    calls = []

    def counted(*args, **kwargs):
        calls.append(1)
        return rotation(*args, **kwargs)

    def turned_back(*args, **kwargs):  # rotation by -angle: sin is the last table argument
        args = list(args)
        at = 2 if layout == "half_one" else 3  # (x, cos, sin, ...) or (q, k, cos, sin, ...)
        if "sin" in kwargs:
            kwargs["sin"] = -kwargs["sin"]
        else:
            args[at] = -args[at]
        return rotation(*args, **kwargs)

    try:
        if not hasattr(rotation, "posenc_layout"):
            return "the rotation was not replaced"
        setattr(modeling, function, counted)
        got = [run(patched, ids), run(patched, ids, packed)]
        setattr(modeling, function, turned_back)
        reached = not torch.equal(logits(patched, ids), want[0][0])
        setattr(modeling, function, rotation)
        sibling = logits(model, ids)  # not patched, while `patched` is
    finally:
        setattr(modeling, function, rotation)
        integration.unpatch(patched)
    if not calls:
        return f"its attention does not call the file's {function}"
    if not reached:
        return f"the file's {function} does not reach the logits"
    if not torch.equal(sibling, want[0][0]):
        return (
            f"an unpatched model of the family changes while another is patched (by "
            f"{(sibling - want[0][0]).abs().max().item():.3g}): its tables are not in "
            f"transformers' cat(t, t) order"
        )
    if hasattr(getattr(modeling, function), "posenc_layout"):
        return "unpatch left posenc's rotation in"
    why = compare(want, got)
    if why is not None:
        return why
    for what, other in other_precision_copies(model):
        try:
            expected = run(other, ids, packed)
        except Exception:  # noqa: BLE001 - transformers' own model does not run so (MoE in float64)
            continue
        mine = integration._patch_with(copy.deepcopy(other), model_type, entry)
        try:
            seen = run(mine, ids, packed)
        finally:
            integration.unpatch(mine)
        why = compare([expected], [seen])
        if why is not None:
            return f"{what}: {why} (the family rotates in another precision)"
    return None
