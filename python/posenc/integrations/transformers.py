"""posenc in a loaded transformers model: its rotary modules and its rotation replaced by posenc's.

    model = AutoModelForCausalLM.from_config(config)
    posenc.integrations.transformers.patch(model)     # logits equal (float32: to the bit)
    posenc.integrations.transformers.unpatch(model)

What is replaced, for the model families listed in SUPPORTED (each checked against transformers'
own modeling code by tests/python/test_transformers_patch.py, logits and gradients):
  - every <Model>RotaryEmbedding module of the family's modeling file -> posenc.RotaryEmbedding
    built from the same config, with the same contract: forward(x, position_ids[, layer_type])
    returns the tables in transformers' order (cat(t, t)), its frequencies are the buffer
    `inv_freq` (`<layer_type>_inv_freq`) as transformers' are, with the dtypes of the buffers they
    replace (a model cast to bfloat16 before patch() keeps turning at bfloat16-rounded
    frequencies, as transformers' module does); the construction-time copy that dynamic NTK
    returns to is `initial_inv_freq` (transformers' `original_inv_freq`, a name its _init_weights
    recomputes by its own functions);
  - the modeling file's apply_rotary_pos_emb -> posenc's rotation with that function's contract
    (GLM's re-interleaves the first half of each table, as its own does); for DeepSeek V3's
    families (interleaved weights, config rope_interleave) the file's
    apply_rotary_pos_emb_interleave, whose output lists each head's pair members de-interleaved
    ([x0' x2' ... | x1' x3' ...]).
The function is a global of the modeling file, so every model of that family in the process takes
posenc's rotation until the last patched model of the family is unpatched. That rotation is the
family's own function to the bit (the same tables in, the same rounding), so a model of the
family that was not patched computes what it computed before. A family not listed is refused with
one line: its rotary code has not been compared with posenc's, and a silent difference is the one
thing posenc must not give.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import weakref

import torch

from ..rotary import RotaryEmbedding, apply_rotary_pos_emb
from . import _families

# model_type -> (the modeling file, its text rotary classes replaced, its rotation: a key of
# ROTATIONS, a constant of the file whatever the config says). A tower's rotary class (Qwen2-VL's
# vision rotary) is left.
HAND_CHECKED = {
    "llama": ("transformers.models.llama.modeling_llama", ("LlamaRotaryEmbedding",), "half"),
    "mistral": (
        "transformers.models.mistral.modeling_mistral",
        ("MistralRotaryEmbedding",),
        "half",
    ),
    "qwen2": ("transformers.models.qwen2.modeling_qwen2", ("Qwen2RotaryEmbedding",), "half"),
    "qwen3": ("transformers.models.qwen3.modeling_qwen3", ("Qwen3RotaryEmbedding",), "half"),
    "qwen2_vl": (
        "transformers.models.qwen2_vl.modeling_qwen2_vl",
        ("Qwen2VLRotaryEmbedding",),
        "half",
    ),
    "gemma3_text": (
        "transformers.models.gemma3.modeling_gemma3",
        ("Gemma3RotaryEmbedding",),
        "half",
    ),
    "phi3": ("transformers.models.phi3.modeling_phi3", ("Phi3RotaryEmbedding",), "half"),
    "glm": ("transformers.models.glm.modeling_glm", ("GlmRotaryEmbedding",), "interleaved"),
}
# Every family: the hand-checked ones above (their own tests, more settings) and the generated list
# (tools/gen_patch_families.py: each family's small random causal LM equal with and without patch()).
SUPPORTED = {**_families.CHECKED, **HAND_CHECKED}

_PATCHED = "_posenc_patched_models"  # weak references to the patched models of the modeling file


@dataclasses.dataclass(frozen=True)
class Rotation:
    """What a family's rotation is: the one place patch(), unpatch() and the checker read it."""

    function: str  # the modeling file's function posenc's replaces
    pairs: str  # the pair layout posenc's resolver must give the family's config
    float32_tables: bool = False  # its modules return float32 tables whatever x's dtype
    fresh: bool = False  # its module recomputes frequencies and scaling from the config each call
    # the order of its modules' tables (RotaryEmbedding's table_order): cat(t, t) as most
    # ("transformers"), each pair's value where the layout rotates it (Cohere's repeat_interleave:
    # "layout"), or one value per pair (gpt-oss: "pairs")
    tables: str = "transformers"
    # its rotation computes in float32 (float64 with float64 tables) whatever q's dtype:
    # "products" promotes each product (q * cos with float32 tables, or q.float() * cos: OLMo,
    # Ernie 4.5, ModernBERT-decoder; each product's gradient is rounded to q's dtype), "upfront"
    # casts q and k once first (q = q.float(): Cohere; the gradients sum in float32)
    promotes: str = ""
    # its rotation rounds q and k to float32 (q.float(): a float64 q too) and returns both in q's
    # dtype (Cohere, Ernie 4.5, ModernBERT-decoder)
    rounds_to_float32: bool = False


ROTATIONS = {
    "half": Rotation("apply_rotary_pos_emb", "half"),
    "interleaved": Rotation("apply_rotary_pos_emb", "interleaved"),
    "deinterleave": Rotation("apply_rotary_pos_emb_interleave", "interleaved"),
    "half_one": Rotation("apply_rotary_pos_emb", "half"),
    "half_f32": Rotation("apply_rotary_pos_emb", "half", float32_tables=True, promotes="products"),
    "interleaved_f32": Rotation(
        "apply_rotary_pos_emb",
        "interleaved",
        float32_tables=True,
        promotes="products",
        rounds_to_float32=True,
    ),
    "half_fresh": Rotation("apply_rotary_pos_emb", "half", fresh=True),
    "half_pairs": Rotation("apply_rotary_pos_emb", "half", tables="pairs"),
    "half_float": Rotation(
        "apply_rotary_pos_emb", "half", promotes="products", rounds_to_float32=True
    ),
    "interleaved_float": Rotation(
        "apply_rotary_pos_emb",
        "interleaved",
        tables="layout",
        promotes="upfront",
        rounds_to_float32=True,
    ),
}


def _original(function: str) -> str:
    """The modeling file's attribute keeping transformers' function while posenc's is in."""
    return "_posenc_original_" + function


def _tables_first_half_twice(t: torch.Tensor, pairs: str) -> torch.Tensor:
    """Each table's first half (pair i's value) laid out for `pairs`: t0 t0 t1 t1 ... (GLM's and
    Ernie's repeat_interleave) or cat(h, h) (what DeepSeek's interleave function reads)."""
    half = t[..., : t.shape[-1] // 2]
    return (
        half.repeat_interleave(2, dim=-1) if pairs == "interleaved" else torch.cat([half, half], -1)
    )


def _rotation(layout: str):
    """The family's rotation (ROTATIONS[layout].function) computed by posenc, with its contract.

    Its tables are the family's modules' (cat(t, t) as most transformers rotary modules return
    them; Rotation.tables names the others);
    "interleaved" (GLM) takes each table's first half and repeats every value twice
    (cos[..., :W/2].repeat_interleave(2)), as GLM's own function does, then rotates pairs (2i, 2i+1).
    "half_one" (Gemma 4): apply_rotary_pos_emb(x, cos, sin, unsqueeze_dim) on one tensor.
    "deinterleave" (DeepSeek V3's apply_rotary_pos_emb_interleave, position_ids unused as there):
    q and k de-interleaved ([x0 x2 ... | x1 x3 ...], a copy), then rotated as "half" with
    cat(t, t) of each table's first half (all DeepSeek's function reads): pair i is
    (x_2i, x_2i+1) with angle t_i, the products and sums the same as DeepSeek's
    `q1 * cos - q2 * sin`, `q2 * cos + q1 * sin` (bit-equal).
    "half_pairs" (gpt-oss): tables of one value per pair ([B, N, W/2]) and
    `first * cos - second * sin`, `second * cos + first * sin` over the two halves: the products
    and sums of rotate_half's (a + (-b) is a - b to the bit), so posenc's half rotation with
    cat(t, t) of the family's tables.
    Families that rotate in float32 whatever q's dtype (Rotation.promotes): the result's dtype is
    the promotion of q's, the tables' and float32; OLMo's float32 tables promote each product
    (`q * cos`), Ernie 4.5 and ModernBERT-decoder promote each product of `q.float()`, Cohere
    casts q and k first (`q = q.float()`). posenc's operator takes q in its dtype with tables in
    the promoted one and promotes each product itself (its backward rounds each product's
    gradient to q's dtype, as eager autograd does there), or q and k cast first for Cohere (the
    gradients then sum in float32, as Cohere's do). A float64 q of a family that calls q.float()
    is rounded to float32 first, as there. Results in q's and k's dtypes (OLMo), both in q's
    (the q.float() families).
    """
    rotation = ROTATIONS[layout]
    pairs = rotation.pairs

    def tables(t):
        """The family's table laid out as posenc's rotation of its pairs takes it."""
        if rotation.tables == "pairs":  # t -> cat(t, t) or t0 t0 t1 t1 ...
            return torch.cat([t, t], -1) if pairs == "half" else t.repeat_interleave(2, dim=-1)
        if rotation.tables == "transformers" and pairs == "interleaved":
            return _tables_first_half_twice(t, pairs)
        return t

    if rotation.promotes:

        def posenc_apply_rotary_pos_emb_promoted(q, k, cos, sin, unsqueeze_dim=1):
            q_dtype, k_dtype = q.dtype, (q.dtype if rotation.rounds_to_float32 else k.dtype)
            if rotation.rounds_to_float32:  # q.float(): float64 rounded to float32
                q = q.float() if q.dtype == torch.float64 else q
                k = k.float() if k.dtype == torch.float64 else k
            compute = torch.float32
            for t in (q, k, cos, sin):
                compute = torch.promote_types(compute, t.dtype)

            def operand(x):  # bfloat16/float16 stay: the operator promotes each product
                keep = rotation.promotes == "products" and x.dtype in (
                    torch.bfloat16,
                    torch.float16,
                )
                return x if keep else x.to(compute)

            q_embed, k_embed = apply_rotary_pos_emb(
                operand(q),
                operand(k),
                tables(cos).to(compute),
                tables(sin).to(compute),
                unsqueeze_dim=unsqueeze_dim,
                layout=pairs,
            )
            return q_embed.to(q_dtype), k_embed.to(k_dtype)

        posenc_apply_rotary_pos_emb_promoted.posenc_layout = layout
        return posenc_apply_rotary_pos_emb_promoted

    if layout == "half_one":

        def posenc_apply_rotary_pos_emb_one(x, cos, sin, unsqueeze_dim=1):
            # the operator rotates a pair (q, k); k is one head of x (the dim cos is unsqueezed
            # at), so the second result costs 1/H of the first
            head = x.narrow(unsqueeze_dim, 0, 1) if x.size(unsqueeze_dim) > 0 else x
            return apply_rotary_pos_emb(x, head, cos, sin, unsqueeze_dim=unsqueeze_dim)[0]

        posenc_apply_rotary_pos_emb_one.posenc_layout = layout
        return posenc_apply_rotary_pos_emb_one

    if layout == "deinterleave":

        def posenc_apply_rotary_pos_emb_interleave(
            q, k, cos, sin, position_ids=None, unsqueeze_dim=1
        ):
            def split(x):
                return torch.cat([x[..., 0::2], x[..., 1::2]], dim=-1)

            return apply_rotary_pos_emb(
                split(q),
                split(k),
                _tables_first_half_twice(cos, "half"),
                _tables_first_half_twice(sin, "half"),
                unsqueeze_dim=unsqueeze_dim,
            )

        posenc_apply_rotary_pos_emb_interleave.posenc_layout = layout
        return posenc_apply_rotary_pos_emb_interleave

    def posenc_apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
        return apply_rotary_pos_emb(
            q, k, tables(cos), tables(sin), unsqueeze_dim=unsqueeze_dim, layout=pairs
        )

    posenc_apply_rotary_pos_emb.posenc_layout = layout
    return posenc_apply_rotary_pos_emb


class _FreshRotaryEmbedding(RotaryEmbedding):
    """The replacement for a "fresh" family's module (PhiMoE's recomputes float32 frequencies from
    the config on every call): model.to(dtype) after patch() moves its buffers to the new device
    and keeps their dtype, so it never turns at frequencies the cast rounded, as PhiMoE's does."""

    def _apply(self, fn, recurse=True):
        kept = dict(self.named_buffers(recurse=False))
        super()._apply(fn, recurse)
        for name, before in kept.items():
            after = getattr(self, name)
            if after.dtype != before.dtype:
                setattr(self, name, before.to(device=after.device))
        return self


def _buffer_device(module: torch.nn.Module) -> torch.device:
    for b in module.buffers():
        return b.device
    return torch.device("cpu")


def _is_table(name: str) -> bool:
    """A current frequency buffer (inv_freq, <layer_type>_inv_freq), not a construction-time copy
    (transformers' original_inv_freq, posenc's initial_inv_freq)."""
    return name.endswith("inv_freq") and not name.endswith(
        ("original_inv_freq", "initial_inv_freq")
    )


def _frequency_pairs(source: torch.nn.Module, target: torch.nn.Module) -> list:
    """(source's name, target's name) of each frequency buffer with its counterpart: by name
    (posenc says initial_inv_freq where transformers says original_inv_freq), and a single table on
    each side paired whatever its name (Mellum's one layer type is `full_attention_inv_freq` in
    transformers, `inv_freq` in posenc's module of one table)."""

    def key(name):
        return name.replace("initial_inv_freq", "original_inv_freq")

    theirs = {key(n): n for n, _ in source.named_buffers(recurse=False)}
    mine = {key(n): n for n, _ in target.named_buffers(recurse=False)}
    pairs = [(theirs[k], n) for k, n in mine.items() if k in theirs]
    if not pairs:
        current = [k for k in theirs if _is_table(k)]
        ours = [k for k in mine if _is_table(k)]
        if len(current) == 1 and len(ours) == 1:
            pairs = [(theirs[current[0]], mine[ours[0]])]
            original = current[0][: -len("inv_freq")] + "original_inv_freq"
            initial = ours[0][: -len("inv_freq")] + "original_inv_freq"  # key of initial_inv_freq
            if original in theirs and initial in mine:
                pairs.append((theirs[original], mine[initial]))
    return pairs


def _carry_dtypes(source: torch.nn.Module, target: torch.nn.Module) -> None:
    """Casts target's frequency buffers to the dtypes of source's counterparts."""
    buffers = dict(source.named_buffers(recurse=False))
    for theirs, ours in _frequency_pairs(source, target):
        want, have = buffers[theirs], getattr(target, ours)
        if want.dtype != have.dtype:
            setattr(target, ours, have.to(want.dtype))


def _frequencies_differ(theirs: torch.nn.Module, ours: torch.nn.Module, exact: bool) -> str | None:
    """Why posenc's frequencies are not the replaced module's own (as built, before any dynamic
    update: its original_inv_freq where it keeps one), or None. Every current table must have its
    counterpart; equal to the bit with float32 angles, within 1e-6 with float64 ones."""
    buffers = dict(theirs.named_buffers(recurse=False))
    pairs = [(t, o) for t, o in _frequency_pairs(theirs, ours) if _is_table(o)]
    tables = [n for n, _ in ours.named_buffers(recurse=False) if _is_table(n)]
    if len(pairs) != len(tables):
        return (
            f"its frequency buffers ({', '.join(sorted(buffers))}) do not match posenc's "
            f"tables ({', '.join(tables)})"
        )
    for name, mine in pairs:
        want = getattr(theirs, name.replace("inv_freq", "original_inv_freq"), None)
        if not isinstance(want, torch.Tensor):
            want = buffers[name]
        got = getattr(ours, mine).to(want.dtype)
        same = want.shape == got.shape and (
            torch.equal(got, want)
            if exact
            else torch.allclose(got.double(), want.double(), rtol=1e-6, atol=0.0)
        )
        if not same:
            return (
                f"posenc's frequencies for '{name}' ({tuple(got.shape)}) differ from the "
                f"module's own ({tuple(want.shape)})"
            )
    return None


def _scaling_differs(theirs: torch.nn.Module, ours: RotaryEmbedding, exact: bool) -> str | None:
    """Why posenc's attention scaling (the factor on cos and sin: YaRN's mscale, LongRoPE's,
    a config's attention_factor) is not the replaced module's own, or None. transformers keeps it
    as `attention_scaling` (per layer type `<type>_attention_scaling`); the tables multiply it in
    float32, so with float32 angles the float32 values must be equal, with float64 ones within
    1e-6."""
    mine = {name: table.attention_scaling for name, table in ours._tables.items()}
    found = {}
    for name in mine:
        attr = f"{name}_attention_scaling" if name else "attention_scaling"
        if isinstance(getattr(theirs, attr, None), (int, float)):
            found[name] = getattr(theirs, attr)
    single = [a for a in vars(theirs) if a.endswith("attention_scaling")]
    if not found and len(mine) == 1 and len(single) == 1:  # one table each, other names
        found[next(iter(mine))] = getattr(theirs, single[0])
    for name, want in found.items():
        got = mine[name]
        if exact:
            same = torch.tensor(got, dtype=torch.float32) == torch.tensor(want, dtype=torch.float32)
        else:
            same = abs(got - want) <= 1e-6 * abs(want)
        if not same:
            return (
                f"posenc's attention scaling{' for ' + repr(name) if name else ''} ({got!r}) "
                f"differs from the module's own ({want!r})"
            )
    return None


def _sections_differ(theirs: torch.nn.Module, ours: RotaryEmbedding, exact: bool) -> str | None:
    """Why posenc's M-RoPE tables are not the replaced module's own for positions whose axes
    differ, or None (no sections). The frequencies alone do not show which axis a pair reads:
    Qwen3.5's clamped slices and posenc's round-robin interleave agree for [11, 11, 10] but not
    for [4, 1, 3]. Both modules are run on one probe ([A, 1, 4], each axis its own positions;
    transformers' on a copy, so that no dynamic update can touch the model's): equal to the bit
    with float32 angles, within 1e-6 with float64 ones."""
    names = [n for n, t in ours._tables.items() if t.mrope_section]
    if not names or ours.table_order != "transformers":
        return None
    for name in names:
        axes = len(ours._tables[name].mrope_section)
        probe = (torch.arange(4) + 1 + 5 * torch.arange(axes)[:, None])[:, None]  # [A, 1, 4]
        probe = probe.to(_buffer_device(theirs))
        x = torch.zeros(1, device=probe.device)
        args = (x, probe) if len(ours._tables) == 1 else (x, probe, name)
        with torch.no_grad():
            want, got = copy.deepcopy(theirs)(*args), ours(*args)
        if not all(
            w.shape == g.shape
            and (torch.equal(g, w) if exact else torch.allclose(g, w, rtol=1e-6, atol=1e-7))
            for w, g in zip(want, got)
        ):
            table = ours._tables[name]
            return (
                f"its M-RoPE tables (mrope_section {table.mrope_section}) give some pairs "
                f"another position axis than posenc's {table.section_layout} sections do"
            )
    return None


def _grown(theirs: torch.nn.Module) -> str | None:
    """Why the module's tables are not the ones it was built with: dynamic NTK grew them (the
    model ran past max_position_embeddings; transformers keeps the grown frequencies, in float32,
    until a shorter input resets them), or None. posenc's module starts from the config, so it is
    patched in before such use, not after."""
    original = getattr(theirs, "original_max_seq_len", None)
    if original is None:
        return None
    for name, value in vars(theirs).items():
        if name.endswith("max_seq_len_cached") and value != original:
            return (
                f"its dynamic tables have grown ({name} {value} > original_max_seq_len "
                f"{original}: the model ran past max_position_embeddings); patch it before "
                f"such use"
            )
    return None


def _live_patched(modeling) -> list:
    return [r for r in getattr(modeling, _PATCHED, []) if r() is not None]


def patch(model: torch.nn.Module, angle_dtype: str = "float32") -> torch.nn.Module:
    """Replaces the model's rotary modules and rotation by posenc's; returns the model.

    model: a loaded transformers model of a family in SUPPORTED (its config's model_type);
    angle_dtype "float32" (transformers' arithmetic, to the bit) or "float64" (exact angles).
    unpatch(model) restores transformers' modules and, with the last patched model of the
    family, its rotation.

    Families. Checked by hand, with more settings each (tests/python/test_transformers_patch.py):
    llama, mistral, qwen2, qwen3, qwen2_vl (M-RoPE), gemma3_text (per-layer types), phi3
    (LongRoPE, partial), glm (interleaved, partial). And every other causal-LM family of
    transformers 5.24 whose small random model passes the generator's check
    (posenc.integrations._families.CHECKED, written by tools/gen_patch_families.py), among them
    Gemma 1-2, GPT-NeoX and Phi (partial), Granite, Mixtral, Qwen 2/3 MoE, StarCoder 2, StableLM,
    Falcon-H1, EXAONE 4, SmolLM 3, MiniCPM3 (latent attention), the Qwen 3.5 and Qwen3-Next text
    models (hybrid: the small model keeps a linear-attention and an attention layer; Qwen 3.5's
    256-wide heads, whose 64 rotary dims its M-RoPE sections fill). Special cases:
      - DeepSeek V3, V3.2, GLM-4 MoE Lite, Youtu and A.X K1/K2 rotate interleaved weights
        through apply_rotary_pos_emb_interleave: posenc's replacement de-interleaves q and k (a
        copy) and rotates them as rotate_half does, the same products and sums as DeepSeek's own
        (bit-equal). With rope_interleave=False the attention of DeepSeek V3, GLM-4 MoE Lite,
        Youtu and A.X K1 calls the other function and patch() refuses the model in one line;
        DeepSeek V3.2 and A.X K2 always call the interleaved one.
      - Gemma 4 (text, unified: per-layer-type tables, its full-attention layers' proportional
        partial rotary and wider heads): its apply_rotary_pos_emb(x, cos, sin, unsqueeze_dim)
        rotates one tensor; posenc's takes the same signature (keywords too: its vision tower
        calls it on channel splits with tables of its own, given to the bit as well). Head sizes
        are read as transformers reads them: a saved config's per_layer_config (by layer index;
        the layers of one type must agree; the last layer is full attention, as its config class
        forces), else global_head_dim for the full-attention layers; a per-layer rotary key other
        than head_dim is refused in one line.
      - Families that rotate in float32 on purpose: OLMo 1-3, FlexOlmo, OLMo hybrid, Beam, Ernie
        4.5 (and MoE), ModernBERT-decoder and Cohere 1-2 (Command R, R7B, A; Ernie's,
        ModernBERT's and Cohere's code rounds q and k to float32 first, so a float64 model of
        theirs rotates in float32, and so does posenc's). OLMo's and Ernie's tables stay float32
        (RotaryEmbedding(table_dtype="float32")), the rotation runs in the promoted dtype and is
        cast back to q's, and the backward rounds each product's gradient to q's dtype before
        adding them, as eager autograd does for a promoted product.
      - PhiMoE, whose module recomputes its float32 frequencies and takes its scaling from the
        config's short_mscale / long_mscale on every call: posenc's keeps float32 frequencies
        there whatever the model's dtype (Phi-3.5-MoE's LongRoPE tested at short and long
        lengths).
      - Modules whose tables are not cat(t, t): Cohere 1-2 (repeat_interleave, t0 t0 t1 t1 ...,
        rotated in pairs (2i, 2i+1) after q.float(), the gradients summed in float32 as there)
        and gpt-oss (one value per pair, [B, N, W/2], its first * cos - second * sin over the two
        halves): the replacement modules return those tables (order, width and dtype:
        RotaryEmbedding(table_order="layout" / "pairs")) and the rotations read them so, for
        transformers' own modules' tables as well.
      - Granite SWA's per-theta rotary modules: each replacement keeps the config it was built
        from (Granite reads each module's config).

    The check each family passed: with patch(), float32 logits equal to the bit and gradients
    within rtol 1e-5 (default and packed position_ids); posenc's rotation reaches the logits
    (turned by -angle they change); a model of the family left unpatched meanwhile computes what
    it did; bfloat16 and float16 copies, cast whole (.to(dtype)) or parameters only (as
    from_pretrained(dtype=...) loads them), and a float64 copy give their own logits to the bit
    and their gradients within rtol 1e-5, where transformers' own model runs in that dtype.

    Refused, in one line (ValueError): any other model type, with the reason its check gave
    (_families.LEFT_OUT: e.g. nanochat, whose rotate_half turns by -angle; LFM 3, whose
    per-layer-type parameters posenc's resolver does not pair with its layer types; families
    whose small model does not build); a model whose config no longer gives its live modules'
    frequencies and attention scaling (each replacement is compared with the module it replaces,
    its original_inv_freq where kept: e.g. a rope_parameters block set on a built config without
    the partial factor its constructor filled in), or whose dynamic-NTK tables have already grown
    past max_position_embeddings (patch before such use); a config that resolves to another pair
    layout than the family's code rotates; M-RoPE sections whose tables give a pair another
    position axis than the module's own (Qwen3.5's clamped slices with mrope_section [4, 1, 3]:
    both modules are run on positions whose axes differ).

    The replacements keep transformers' contracts: tables in transformers' order (cat(t, t);
    GLM's rotation re-interleaves them as its own does); the frequencies in the buffer inv_freq
    (per layer type <type>_inv_freq) with the dtypes of the ones they replace, the
    construction-time copy in initial_inv_freq (transformers' _init_weights recomputes any
    original_inv_freq by its own functions); a model cast with .to(torch.bfloat16) before or after
    patch() turns at bfloat16-rounded frequencies, as its own module does. The rotation is a
    global of the modeling file: every model of the family in the process takes it until the last
    patched one is unpatched, and it is that file's own function to the bit, so an unpatched model
    computes what it did.
    """
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type not in SUPPORTED:
        why = _families.LEFT_OUT.get(model_type)
        raise ValueError(
            f"posenc.patch: model type '{model_type}' is not one posenc has checked "
            f"against transformers' code"
            + (f" (its check: {why})" if why else "")
            + f"; {len(SUPPORTED)} families are: posenc.integrations.transformers"
            f".SUPPORTED"
        )
    return _patch_with(model, model_type, SUPPORTED[model_type], angle_dtype)


def _patch_with(
    model: torch.nn.Module, model_type: str, entry: tuple, angle_dtype: str = "float32"
) -> torch.nn.Module:
    """patch() with the family's (modeling file, rotary classes, pair layout) given: the checker
    (tools/patch_families.py) calls it for families not yet listed."""
    module_name, classes, layout = entry
    rotation = ROTATIONS[layout]
    modeling = importlib.import_module(module_name)
    replacements = []  # every module built and checked before the model is touched
    for name, sub in list(model.named_modules()):
        if type(sub).__module__ != modeling.__name__ or type(sub).__name__ not in classes:
            continue
        if _buffer_device(sub).type == "meta":  # nothing to compare with; garbage after to_empty()
            raise ValueError(
                f"posenc.patch: {name or 'the model'}: its rotary buffers are on the meta device "
                f"(the model is not materialized yet); patch it after its weights are loaded; "
                f"not patched"
            )
        try:
            ours = (_FreshRotaryEmbedding if rotation.fresh else RotaryEmbedding).from_hf_config(
                sub.config,
                angle_dtype=angle_dtype,
                table_order=rotation.tables,
                table_dtype="float32" if rotation.float32_tables else "input",
            )
        except RuntimeError as e:  # the resolver's refusal (its operator's TORCH_CHECK)
            why = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise ValueError(f"posenc.patch: {name or 'the model'}: {why}; not patched") from None
        ours.to(_buffer_device(sub))
        # the live module is the oracle: a config edited after construction (from_pretrained's
        # keyword overrides set rope_parameters without the keys the constructor filled in) can
        # resolve to other frequencies than the module was built with; refused, not guessed
        # (a "fresh" module, PhiMoE's, reads its scaling from the config on every call, not from
        # its attention_scaling: the config posenc's module is built from is the oracle there)
        why = (
            _grown(sub)
            or _frequencies_differ(sub, ours, exact=angle_dtype == "float32")
            or (
                None
                if rotation.fresh
                else _scaling_differs(sub, ours, exact=angle_dtype == "float32")
            )
        )
        if why is not None:
            raise ValueError(f"posenc.patch: {name or 'the model'}: {why}; not patched")
        # the dtypes transformers' buffers have now (model.to(dtype)); a "fresh" module recomputes
        # its frequencies in float32 on every call, whatever its buffer holds
        if angle_dtype == "float32" and not rotation.fresh:
            _carry_dtypes(sub, ours)
        # which axis each pair reads (the same buffers now: the same tables)
        why = _sections_differ(sub, ours, exact=angle_dtype == "float32")
        if why is not None:
            raise ValueError(f"posenc.patch: {name or 'the model'}: {why}; not patched")
        ours.posenc_replaced = (type(sub), sub.config)
        ours.config = sub.config  # transformers' modules keep theirs (Granite SWA reads its theta)
        layouts = {t.layout for t in ours._tables.values()}
        if layouts != {rotation.pairs}:  # posenc's resolver and the family's code disagree
            raise ValueError(
                f"posenc.patch: {name or 'the model'}'s config resolves to the "
                f"{'/'.join(sorted(layouts))} pair layout, but "
                f"{modeling.__name__}.{rotation.function} rotates "
                f"{rotation.pairs} pairs; not patched"
            )
        replacements.append((name, ours))
    if not replacements:
        raise ValueError(f"posenc.patch: no rotary module of {modeling.__name__} in this model")
    for name, ours in replacements:
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, ours)
    if not hasattr(modeling, _original(rotation.function)):
        setattr(modeling, _original(rotation.function), getattr(modeling, rotation.function))
    setattr(modeling, rotation.function, _rotation(layout))
    setattr(modeling, _PATCHED, _live_patched(modeling) + [weakref.ref(model)])
    model._posenc_modeling = modeling.__name__
    return model


def unpatch(model: torch.nn.Module) -> torch.nn.Module:
    """Restores transformers' rotation and rotary modules (rebuilt from the model's config).

    Returns the model; a model patch() never saw is returned unchanged. The modeling file's
    rotation returns to transformers' own once no patched model of the family is left.
    """
    module_name = getattr(model, "_posenc_modeling", None)
    if module_name is None:
        return model
    modeling = importlib.import_module(module_name)
    for name, sub in list(model.named_modules()):
        replaced = getattr(sub, "posenc_replaced", None)
        if replaced is None:
            continue
        cls, config = replaced
        theirs = cls(config)
        theirs.to(_buffer_device(sub))
        _carry_dtypes(sub, theirs)
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, theirs)
    others = [r for r in _live_patched(modeling) if r() is not model]
    setattr(modeling, _PATCHED, others)
    if not others:  # the last patched model of the family: transformers' functions back
        for function in {r.function for r in ROTATIONS.values()}:
            if hasattr(modeling, _original(function)):
                setattr(modeling, function, getattr(modeling, _original(function)))
                delattr(modeling, _original(function))
    del model._posenc_modeling
    return model
