"""Drop-ins for the libraries posenc's users write in: transformers (patch a loaded model's
rotary embedding and rotation), timm (patch a model's RoPE modules), diffusers (patch a video
or image transformer's rotary module and attention processors), and the time-series foundation
models' packages: chronos (Chronos-2's time attention), uni2ts (Moirai-2's rotary part) and
timesfm (TimesFM 2.5's rotary embedding and attention) and toto (Toto's time-wise rotation)."""
