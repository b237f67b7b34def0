"""A tiny GPT-2 trained for a few steps with regional compilation (CPU friendly).

Run: python examples/quickstart.py
"""

import torch
from transformers import GPT2Config, GPT2LMHeadModel

from torchcompile_kit import compile_regional, fix_loss_function
from torchcompile_kit.regional import find_repeated_blocks

config = GPT2Config(
    vocab_size=256, n_positions=64, n_embd=64, n_layer=4, n_head=4, bos_token_id=1, eos_token_id=2
)
model = fix_loss_function(GPT2LMHeadModel(config))  # no graph break at the loss
print(find_repeated_blocks(model).summary())

compile_regional(model, backend="inductor")  # one graph serves all 4 blocks
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
ids = torch.randint(3, 256, (4, 32))
for step in range(5):
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    print(f"step {step}: loss {loss.item():.3f}")
