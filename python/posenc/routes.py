"""AttentionRoute: one shape for every "which path does this call take, and why" explainer.

posenc's kernels each pick a path by named rules and can say why they passed the others over
(PyTorch's sdp_utils does the same for SDPA's backends). Three explainers say it, each as one line
written by the C++ code that decides (so the answer is the decision itself, not a second copy):

* Plan.attention_route (posenc::select_attention and describe, src/nn/attention_backend.cpp), the
  C++ layers' self-attention backend in priority order short_rotary, short, sdpa, fused,
  reference: ``"sdpa (short_rotary: the plan has a bias; short: the plan has a bias)"``,
  ``"fused with RoPE inside (...)"``.
* torch.ops.posenc.positional_attention_route (src/bindings/attention_operators.cpp), the
  SDPA-layout attention: ``"fused"``, ``"fused, RoPE inside"``, ``"fused, RoPE outside: <why>"``,
  ``"reference: <why>"``, ``"CUDA kernel"``, ``"CUDA kernel, RoPE outside (float32)"``, after
  ``"apply_rotary first (cos/sin require grad), then "`` where the tables are learned.
* torch.ops.posenc.apply_rotary_route and apply_rotary_backward_route (src/bindings/rotary.cpp,
  autograd/rotary_autograd.cpp): ``"fused"``, ``"reference: <why>"``, ``"per-term: <why>"``,
  after ``"gradients made dense first, then "``.

posenc.positional_attention_route, posenc.apply_rotary_route and Plan.attention_route return each
line as an AttentionRoute:

    route = posenc.positional_attention_route(q, k, v, cos=cos, sin=sin, slopes=slopes)
    route.taken        # "fused"  (the path that runs: "fused", "cuda", "reference", "sdpa", ...)
    route.rope_inside  # True     (the kernel rotates q and k as it loads its tiles)
    route.not_taken    # (("RoPE inside", "the two members of a pair read ..."), ...): each path
                       # passed over, in priority order, with the first rule it failed
    route.first        # ("apply_rotary (cos/sin require grad)",): steps run before the path
    str(route)         # the explainer's own line

A line none of the grammars above reads is a ValueError (never a guessed route); the torch.ops
explainers keep returning their line (str), for code that reads it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

__all__ = ["AttentionRoute", "apply_rotary_route", "positional_attention_route"]


@dataclass(frozen=True)
class AttentionRoute:
    """The path a call takes (``taken``), whether RoPE is applied inside the kernel's tiles
    (``rope_inside``), each path passed over with why (``not_taken``: (path, reason) pairs in
    priority order), the steps run before the path (``first``), and the explainer's line
    (``text``, also ``str(route)``)."""

    taken: str
    rope_inside: bool = False
    not_taken: tuple[tuple[str, str], ...] = ()
    first: tuple[str, ...] = ()
    text: str = ""

    def __str__(self) -> str:
        return self.text

    def why_not(self, path: str) -> str | None:
        """Why ``path`` was passed over, or None where it was not (taken, or not a candidate)."""
        return dict(self.not_taken).get(path)

    # ---- the three explainers' lines --------------------------------------------------------

    @classmethod
    def from_plan(cls, text: str) -> AttentionRoute:
        """Plan.attention_route's line: ``backend[ with RoPE inside][ (name: why; name: why)]``
        (describe in src/nn/attention_backend.cpp)."""
        match = _PLAN.fullmatch(text)
        if match is None:
            raise ValueError(f"posenc.AttentionRoute: not a Plan.attention_route line: {text!r}")
        not_taken: tuple[tuple[str, str], ...] = ()
        if match["passed"]:
            parts = re.split(rf"; (?=(?:{_PLAN_BACKENDS}): )", match["passed"])
            not_taken = tuple(tuple(p.split(": ", 1)) for p in parts)  # type: ignore[misc]
        return cls(
            taken=match["backend"],
            rope_inside=bool(match["inside"]),
            not_taken=not_taken,
            text=text,
        )

    @classmethod
    def from_positional(cls, text: str, *, cuda: bool) -> AttentionRoute:
        """positional_attention_route's line; ``cuda``: the call's tensors are on a CUDA device
        (there "reference: <why>" passes over the CUDA kernel, on the CPU the tiled kernel)."""
        rest, first = _strip_first(text, _LEARNED, "apply_rotary (cos/sin require grad)")
        if rest.startswith("reference: "):
            passed = "cuda" if cuda else "fused"
            return cls("reference", False, ((passed, rest[len("reference: ") :]),), first, text)
        kernel = {"fused": "fused", "CUDA kernel": "cuda"}
        for name, taken in kernel.items():
            if rest == name:
                return cls(taken, False, (), first, text)
            if rest == f"{name}, RoPE inside":
                return cls(taken, True, (), first, text)
            if rest.startswith(f"{name}, RoPE outside: "):
                why = rest[len(f"{name}, RoPE outside: ") :]
                return cls(taken, False, (("RoPE inside", why),), first, text)
            if rest == f"{name}, RoPE outside (float32)":
                why = "the CUDA kernel reads q and k rotated first (float32)"
                return cls(taken, False, (("RoPE inside", why),), first, text)
        raise ValueError(f"posenc.AttentionRoute: not a positional_attention_route line: {text!r}")

    @classmethod
    def from_rotary(cls, text: str) -> AttentionRoute:
        """apply_rotary_route's and apply_rotary_backward_route's line."""
        rest, first = _strip_first(text, _DENSE, "gradients made dense")
        if rest == "fused":
            return cls("fused", False, (), first, text)
        for path in ("reference", "per-term"):
            if rest.startswith(f"{path}: "):
                return cls(path, False, (("fused", rest[len(path) + 2 :]),), first, text)
        raise ValueError(f"posenc.AttentionRoute: not an apply_rotary route line: {text!r}")


_PLAN_BACKENDS = "short_rotary|short|sdpa|fused"
_PLAN = re.compile(
    rf"(?P<backend>{_PLAN_BACKENDS}|reference)(?P<inside> with RoPE inside)?"
    r"(?: \((?P<passed>.*)\))?",
    re.DOTALL,
)
_LEARNED = "apply_rotary first (cos/sin require grad), then "
_DENSE = "gradients made dense first, then "


def _strip_first(text: str, prefix: str, step: str) -> tuple[str, tuple[str, ...]]:
    return (text[len(prefix) :], (step,)) if text.startswith(prefix) else (text, ())


def positional_attention_route(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    cos: torch.Tensor | None = None,
    sin: torch.Tensor | None = None,
    layout: str = "half",
    slopes: torch.Tensor | None = None,
    symmetric: bool = False,
    t5_table: torch.Tensor | None = None,
    bidirectional: bool = True,
    max_distance: int = 128,
    causal: bool = False,
    scale: float | None = None,
    attention_mask: torch.Tensor | None = None,
    sample_ids: torch.Tensor | None = None,
    variate_ids: torch.Tensor | None = None,
    variate_bias: torch.Tensor | None = None,
    causal_ids: torch.Tensor | None = None,
) -> AttentionRoute:
    """The path posenc.positional_attention (and alibi_attention, t5_attention, which are it)
    takes for these arguments: the tiled CPU kernel ("fused", RoPE inside its tiles or rotated
    first), the CUDA kernel ("cuda"), or the plain-ATen reference, and why the others were passed
    over. Checks the arguments as the call does (one-line RuntimeError)."""
    text = torch.ops.posenc.positional_attention_route(
        q,
        k,
        v,
        cos,
        sin,
        layout,
        slopes,
        symmetric,
        t5_table,
        bidirectional,
        max_distance,
        causal,
        scale,
        attention_mask,
        sample_ids,
        variate_ids,
        variate_bias,
        causal_ids,
    )
    return AttentionRoute.from_positional(text, cuda=q.device.type == "cuda")


def apply_rotary_route(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    unsqueeze_dim: int = 1,
    *,
    layout: str = "half",
    backward: bool = False,
    grad_q: torch.Tensor | None = None,
    grad_k: torch.Tensor | None = None,
) -> AttentionRoute:
    """The path posenc.apply_rotary_pos_emb takes for these arguments ("fused": rope_rotate's
    kernel; "reference": the formula in plain ATen, with why), or with backward=True (or a
    gradient given) the path of its backward for the gradients grad_q and grad_k of the two
    results (None: dense ones; "per-term": the backward's formula term by term)."""
    if not backward and grad_q is None and grad_k is None:
        text = torch.ops.posenc.apply_rotary_route(q, k, cos, sin, unsqueeze_dim, layout)
    else:
        text = torch.ops.posenc.apply_rotary_backward_route(
            q, k, cos, sin, unsqueeze_dim, layout, grad_q, grad_k
        )
    return AttentionRoute.from_rotary(text)
