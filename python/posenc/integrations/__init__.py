"""Drop-ins for the libraries posenc's users write in (transformers; timm to come)."""
