"""Qwen-Image (diffusers 0.42.1, transformers/transformer_qwenimage.py): QwenEmbedRope and
QwenEmbedLayer3DRope (complex tables) and QwenDoubleStreamAttnProcessor2_0, the rotation computed
by posenc.

diffusers' tables, reproduced here:
  ladder     per axis a (axes_dim (t, h, w), e.g. (16, 56, 56)): f_a,i = 1 / theta ** (2i / dim_a)
             (float32: arange(0, dim_a, 2).float().div(dim_a), the pow, the reciprocal)
  rows       pos_freqs[p] = polar(1, p f) for p = 0 .. 4095 and neg_freqs[p] for p = -4096 .. -1,
             complex64 [4096, sum dim_a / 2], the three axes side by side (built at __init__)
  image      token (t, h, w) of frame idx: cat(pos_t[idx + t], h row, w row), where with
             scale_rope the h rows are centred: neg rows -(H - H//2) .. -1, then pos rows
             0 .. H//2 - 1 (negative indices: the image centred on 0), w likewise
             (Layer3D: the last image, the condition, takes frame row neg_t[-1], i.e. -1)
  text       after the image: pos rows max_vid_index .. + L - 1 for every axis (max_vid_index =
             max(H//2, W//2) over the images with scale_rope, else max(H, W); Layer3D: at least
             the number of layers)
  Tables are complex64 [S, head_dim / 2]: computed with diffusers' own torch ops in its order
  (torch.polar rounds cos/sin with the scalar libm, not torch.cos's vector kernel, so posenc's
  rope_cos_sin would not give them to the bit); equal to diffusers' to the bit on every device.

The rotation (apply_rotary_emb_qwen(x, freqs, use_real=False): x [B, S, heads, Dh] read as
complex pairs (2i, 2i+1), times freqs[s, i]) is the interleaved rotation with cos = Re, sin = Im:
Re = x_e c - x_o s, Im = x_e s + x_o c, the products rounded apart. posenc's processor computes it
with torch.ops.posenc.apply_rotary, interleaved layout, on the tables' real and imaginary parts
(view_as_real, repeated per pair): equal to the bit where ATen's complex product runs its vector
kernel throughout, i.e. on the CPU when the head has a multiple of 16 pairs (head_dim % 32 == 0:
Qwen-Image's 128) and each thread's share of the product is a multiple of 16 pairs too. Where a
loop of ATen's ends off that step (the last head_dim / 2 mod 16 pairs of a row; a thread's chunk,
ceil(elements / threads), cut inside a row) its remainder goes through ATen's scalar complex
product, which the compiler contracts into a fused multiply-add (one rounding): diffusers' result
then depends on the thread count (measured: 15 of 3.1M values differ at 5 threads, none at 1-3).
So a head of another size is refused in one line, and posenc's processor rotates through posenc
only where it predicts no scalar remainder (_posenc_rotates: one thread, fewer than 32768
elements, or OpenMP chunks of a multiple of 16 pairs); elsewhere, and on other devices (CUDA's
complex product is compiled with fused multiply-adds too), it hands the rotation to diffusers' own
apply_rotary_emb_qwen, keeping diffusers' output exactly.
"""

from __future__ import annotations

import logging

import torch
from diffusers.models.attention_dispatch import dispatch_attention_fn
from diffusers.models.transformers import transformer_qwenimage as _dqwen

from . import _common
from ._registry import Family, qualified_name, register

__all__ = [
    "QwenEmbedRope",
    "QwenEmbedLayer3DRope",
    "QwenDoubleStreamAttnProcessor2_0",
    "rotate_complex",
]

_NAME = "posenc.integrations.diffusers.QwenEmbedRope"
_logger = logging.getLogger(__name__)
# ATen's complex64 product: the vector kernel takes 2 vectors of complex<float> a step (2 x 8 with
# AVX-512, 2 x 4 with AVX2); a row of pairs that is a multiple of 16 never reaches the scalar tail
_VECTOR_STEP = 16


def rotate_complex(x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """diffusers' apply_rotary_emb_qwen(x, freqs, use_real=False) through posenc's operator:
    x [B, S, heads, Dh], freqs complex [S, Dh / 2]."""
    pairs = torch.view_as_real(freqs)  # [S, Dh/2, 2]: (cos, sin) of each pair
    cos = pairs[..., 0].repeat_interleave(2, dim=-1)
    sin = pairs[..., 1].repeat_interleave(2, dim=-1)
    xf = x.float()
    head = xf.narrow(2, 0, 1)  # the operator rotates a pair; the second costs 1 / heads
    return torch.ops.posenc.apply_rotary(xf, head, cos, sin, 1, "interleaved")[0].type_as(x)


# at::internal::GRAIN_SIZE: TensorIterator runs an elementwise op serially below it, else splits
# its elements among the threads in chunks of ceil(n / threads) (OpenMP backend)
_GRAIN_SIZE = 32768
_OPENMP = "ATen parallel backend: OpenMP" in torch.__config__.parallel_info()


def _posenc_rotates(x: torch.Tensor) -> bool:
    """Whether ATen computes diffusers' complex product of x (q or k [B, S, heads, Dh]) with its
    vector kernel only (then posenc's rotation equals it to the bit). Every loop ATen runs must be
    a multiple of 16 pairs: the rows (Dh / 2 pairs; the tables broadcast over the heads) and, with
    several threads, each thread's chunk of the flattened elements (a chunk ending inside a row
    leaves a scalar tail, a fused multiply-add, on both sides of the cut)."""
    pairs = x.shape[-1] // 2
    if x.device.type != "cpu" or pairs % _VECTOR_STEP != 0:
        return False
    elements = x.numel() // 2
    threads = torch.get_num_threads()
    if elements < _GRAIN_SIZE or threads == 1:
        return True
    if not _OPENMP:  # another backend splits otherwise: not predicted here
        return False
    threads = min(threads, -(-elements // _GRAIN_SIZE))
    return (-(-elements // threads)) % _VECTOR_STEP == 0


class QwenEmbedRope(_common.DiffusersRotary):
    """diffusers' QwenEmbedRope (the same settings, tables and forward) for posenc's processor."""

    def __init__(self, theta: int, axes_dim: list[int], scale_rope: bool = False) -> None:
        super().__init__()
        if len(axes_dim) != 3 or any(not isinstance(d, int) or d <= 0 or d % 2 for d in axes_dim):
            raise ValueError(
                f"{_NAME}: axes_dim must be three positive even integers, got {list(axes_dim)!r}"
            )
        pairs = sum(axes_dim) // 2
        if pairs % _VECTOR_STEP != 0:
            raise ValueError(
                f"{_NAME}: a head of {sum(axes_dim)} channels ({pairs} pairs) is "
                f"not computed by posenc: diffusers rotates the last "
                f"{pairs % _VECTOR_STEP} pairs of each row with ATen's scalar "
                f"complex product (a fused multiply-add); heads with a multiple of "
                f"{2 * _VECTOR_STEP} channels are"
            )
        self.theta = theta
        self.axes_dim = list(axes_dim)
        self.scale_rope = scale_rope
        pos_index = torch.arange(4096)
        neg_index = torch.arange(4096).flip(0) * -1 - 1
        self.pos_freqs = torch.cat([self.rope_params(pos_index, d, theta) for d in axes_dim], dim=1)
        self.neg_freqs = torch.cat([self.rope_params(neg_index, d, theta) for d in axes_dim], dim=1)

    @classmethod
    def from_diffusers(cls, module: torch.nn.Module) -> QwenEmbedRope:
        new = cls(module.theta, module.axes_dim, module.scale_rope)
        for name in ("pos_freqs", "neg_freqs"):
            theirs, ours = getattr(module, name), getattr(new, name)
            if theirs.device.type == "meta":  # plain attributes: built on meta, they stay there
                raise ValueError(
                    f"{_NAME}: its {name} is on the meta device (built under "
                    f"torch.device('meta'); not buffers, so never materialised)"
                )
            if (
                theirs.shape != ours.shape
                or theirs.dtype != ours.dtype
                or not torch.equal(theirs.cpu(), ours)
            ):
                raise ValueError(
                    f"{_NAME}: the module's {name} is not what its settings give "
                    f"(theta {module.theta}, axes_dim {module.axes_dim})"
                )
        return new

    @staticmethod
    def rope_params(index: torch.Tensor, dim: int, theta=10000) -> torch.Tensor:
        """diffusers' rows: polar(1, outer(index, 1 / theta ** (arange(0, dim, 2) / dim)))."""
        freqs = torch.outer(
            index, 1.0 / torch.pow(theta, torch.arange(0, dim, 2).to(torch.float32).div(dim))
        )
        return torch.polar(torch.ones_like(freqs), freqs)

    def _get_device_freqs(self, device) -> tuple[torch.Tensor, torch.Tensor]:
        return self.pos_freqs.to(device), self.neg_freqs.to(device)

    def _rows(self, height: int, width: int, freqs_pos, freqs_neg, frame, frame_count: int):
        if self.scale_rope:
            freqs_height = torch.cat(
                [freqs_neg[1][-(height - height // 2) :], freqs_pos[1][: height // 2]], dim=0
            )
            freqs_width = torch.cat(
                [freqs_neg[2][-(width - width // 2) :], freqs_pos[2][: width // 2]], dim=0
            )
        else:
            freqs_height = freqs_pos[1][:height]
            freqs_width = freqs_pos[2][:width]
        freqs_frame = frame.view(frame_count, 1, 1, -1).expand(frame_count, height, width, -1)
        freqs_height = freqs_height.view(1, height, 1, -1).expand(frame_count, height, width, -1)
        freqs_width = freqs_width.view(1, 1, width, -1).expand(frame_count, height, width, -1)
        freqs = torch.cat([freqs_frame, freqs_height, freqs_width], dim=-1)
        return freqs.reshape(frame_count * height * width, -1).clone().contiguous()

    def _split(self, device):
        pos_freqs, neg_freqs = (
            self._get_device_freqs(device)
            if device is not None
            else (self.pos_freqs, self.neg_freqs)
        )
        halves = [x // 2 for x in self.axes_dim]
        return pos_freqs.split(halves, dim=1), neg_freqs.split(halves, dim=1)

    def _compute_video_freqs(
        self, frame: int, height: int, width: int, idx: int = 0, device=None
    ) -> torch.Tensor:
        freqs_pos, freqs_neg = self._split(device)
        return self._rows(
            height, width, freqs_pos, freqs_neg, freqs_pos[0][idx : idx + frame], frame
        )

    def _first_shapes(self, video_fhw, what: str):
        if isinstance(video_fhw, list) and len(video_fhw) > 1:
            first = video_fhw[0]
            if not all(fhw == first for fhw in video_fhw):
                _logger.warning(
                    f"Batch inference with variable-sized images is not currently "
                    f"supported in {what}; using the first image's {first}"
                )
        if isinstance(video_fhw, list):
            video_fhw = video_fhw[0]
        if not isinstance(video_fhw, list):
            video_fhw = [video_fhw]
        return video_fhw

    def _text(self, max_vid_index: int, max_txt_seq_len, device) -> torch.Tensor:
        pos_freqs_device, _ = self._get_device_freqs(device)
        count = int(max_txt_seq_len)
        return pos_freqs_device[max_vid_index : max_vid_index + count, ...]

    def forward(
        self, video_fhw, device=None, max_txt_seq_len=None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if max_txt_seq_len is None:
            raise ValueError("`max_txt_seq_len` must be provided.")
        video_fhw = self._first_shapes(video_fhw, "QwenEmbedRope")
        vid_freqs = []
        max_vid_index = 0
        for idx, fhw in enumerate(video_fhw):
            frame, height, width = fhw
            vid_freqs.append(self._compute_video_freqs(frame, height, width, idx, device))
            if self.scale_rope:
                max_vid_index = max(height // 2, width // 2, max_vid_index)
            else:
                max_vid_index = max(height, width, max_vid_index)
        txt_freqs = self._text(max_vid_index, max_txt_seq_len, device)
        return torch.cat(vid_freqs, dim=0), txt_freqs


class QwenEmbedLayer3DRope(QwenEmbedRope):
    """diffusers' QwenEmbedLayer3DRope (layers of one image, the last one the condition)."""

    def _compute_condition_freqs(
        self, frame: int, height: int, width: int, device=None
    ) -> torch.Tensor:
        freqs_pos, freqs_neg = self._split(device)
        return self._rows(height, width, freqs_pos, freqs_neg, freqs_neg[0][-1:], frame)

    def forward(self, video_fhw, max_txt_seq_len, device=None) -> tuple[torch.Tensor, torch.Tensor]:
        video_fhw = self._first_shapes(video_fhw, "QwenEmbedLayer3DRope")
        vid_freqs = []
        max_vid_index = 0
        layer_num = len(video_fhw) - 1
        for idx, fhw in enumerate(video_fhw):
            frame, height, width = fhw
            if idx != layer_num:
                vid_freqs.append(self._compute_video_freqs(frame, height, width, idx, device))
            else:  # the condition image: frame row -1
                vid_freqs.append(self._compute_condition_freqs(frame, height, width, device))
            if self.scale_rope:
                max_vid_index = max(height // 2, width // 2, max_vid_index)
            else:
                max_vid_index = max(height, width, max_vid_index)
        max_vid_index = max(max_vid_index, layer_num)
        txt_freqs = self._text(max_vid_index, max_txt_seq_len, device)
        return torch.cat(vid_freqs, dim=0), txt_freqs


def _rotate(x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    if _posenc_rotates(x):
        return rotate_complex(x, freqs)
    return _dqwen.apply_rotary_emb_qwen(x, freqs, use_real=False)


class QwenDoubleStreamAttnProcessor2_0(_dqwen.QwenDoubleStreamAttnProcessor2_0):
    """diffusers' QwenDoubleStreamAttnProcessor2_0 with the rotation computed by posenc."""

    @classmethod
    def from_diffusers(cls, processor) -> QwenDoubleStreamAttnProcessor2_0:
        new = cls()
        for setting in ("_attention_backend", "_parallel_config"):
            if setting in vars(processor):
                setattr(new, setting, getattr(processor, setting))
        return new

    def __call__(
        self,
        attn,
        hidden_states: torch.FloatTensor,
        encoder_hidden_states: torch.FloatTensor = None,
        encoder_hidden_states_mask: torch.FloatTensor = None,
        attention_mask: torch.FloatTensor | None = None,
        image_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if encoder_hidden_states is None:
            raise ValueError(
                "QwenDoubleStreamAttnProcessor2_0 requires encoder_hidden_states (text stream)"
            )
        if attention_mask is not None:
            raise ValueError(
                "QwenDoubleStreamAttnProcessor2_0 does not accept an external "
                "attention_mask. Pass encoder_hidden_states_mask to let the "
                "processor build the joint mask."
            )
        if encoder_hidden_states_mask is not None:
            seq_img = hidden_states.shape[1]
            image_mask = torch.ones(
                (hidden_states.shape[0], seq_img), dtype=torch.bool, device=hidden_states.device
            )
            attention_mask = torch.cat([encoder_hidden_states_mask, image_mask], dim=1)
            attention_mask = attention_mask[:, None, None, :]
        seq_txt = encoder_hidden_states.shape[1]

        img_query = attn.to_q(hidden_states)
        img_key = attn.to_k(hidden_states)
        img_value = attn.to_v(hidden_states)
        txt_query = attn.add_q_proj(encoder_hidden_states)
        txt_key = attn.add_k_proj(encoder_hidden_states)
        txt_value = attn.add_v_proj(encoder_hidden_states)
        head_dim = attn.inner_dim // attn.heads
        img_query = img_query.unflatten(-1, (-1, head_dim))
        img_key = img_key.unflatten(-1, (-1, head_dim))
        img_value = img_value.unflatten(-1, (-1, head_dim))
        txt_query = txt_query.unflatten(-1, (-1, head_dim))
        txt_key = txt_key.unflatten(-1, (-1, head_dim))
        txt_value = txt_value.unflatten(-1, (-1, head_dim))
        if attn.norm_q is not None:
            img_query = attn.norm_q(img_query)
        if attn.norm_k is not None:
            img_key = attn.norm_k(img_key)
        if attn.norm_added_q is not None:
            txt_query = attn.norm_added_q(txt_query)
        if attn.norm_added_k is not None:
            txt_key = attn.norm_added_k(txt_key)

        if image_rotary_emb is not None:
            img_freqs, txt_freqs = image_rotary_emb
            img_query = _rotate(img_query, img_freqs)
            img_key = _rotate(img_key, img_freqs)
            txt_query = _rotate(txt_query, txt_freqs)
            txt_key = _rotate(txt_key, txt_freqs)

        joint_query = torch.cat([txt_query, img_query], dim=1)
        joint_key = torch.cat([txt_key, img_key], dim=1)
        joint_value = torch.cat([txt_value, img_value], dim=1)
        joint_hidden_states = dispatch_attention_fn(
            joint_query,
            joint_key,
            joint_value,
            attn_mask=attention_mask,
            dropout_p=0.0,
            is_causal=False,
            backend=self._attention_backend,
            parallel_config=self._parallel_config,
        )
        joint_hidden_states = joint_hidden_states.flatten(2, 3)
        joint_hidden_states = joint_hidden_states.to(joint_query.dtype)
        txt_attn_output = joint_hidden_states[:, :seq_txt, :]
        img_attn_output = joint_hidden_states[:, seq_txt:, :]
        img_attn_output = attn.to_out[0](img_attn_output.contiguous())
        if len(attn.to_out) > 1:
            img_attn_output = attn.to_out[1](img_attn_output)
        txt_attn_output = attn.to_add_out(txt_attn_output.contiguous())
        return img_attn_output, txt_attn_output


register(
    Family(
        name="qwenimage",
        rotary_class=qualified_name(_dqwen.QwenEmbedRope),
        replace=QwenEmbedRope.from_diffusers,
        processors={
            qualified_name(
                _dqwen.QwenDoubleStreamAttnProcessor2_0
            ): QwenDoubleStreamAttnProcessor2_0.from_diffusers
        },
    )
)
register(
    Family(
        name="qwenimage_layer3d",
        rotary_class=qualified_name(_dqwen.QwenEmbedLayer3DRope),
        replace=QwenEmbedLayer3DRope.from_diffusers,
    )
)
