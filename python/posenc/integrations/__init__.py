"""Drop-ins for the libraries posenc's users write in: transformers (patch a loaded model's
rotary embedding and rotation), timm (patch a model's RoPE modules) and diffusers (patch a video
or image transformer's rotary module and attention processors)."""
