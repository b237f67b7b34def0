"""Drop-in use where users already train (HF Trainer, accelerate, DDP, FSDP2).

Integrations import the core topics; nothing below imports them.
"""

__all__: list[str] = []
