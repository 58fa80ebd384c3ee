"""Drop-ins for the libraries posenc's users write in: transformers (patch a loaded model's
rotary embedding and rotation) and timm (patch a model's axial RoPE modules)."""
