"""A fresh process for the precompiled-region tests: build, ``compile_regional(precompile=True)``,
one inductor train step; save the cache (cold) or load it first (warm; then a step of another
batch shape). Prints one JSON line.

``python precompile_worker.py cold|warm MODEL_DIR ARTIFACT [VARIANT]``, with
``TORCHINDUCTOR_CACHE_DIR`` set by the test. ``MODEL_DIR`` holds ``tck_blocks.py`` (the test writes,
and edits, it). Variants: ``frozen`` (every block's ``up.bias`` frozen), ``config`` (another
``scale``), ``swap`` (every block's activation function gelu -> silu), ``torch-key`` (combinable:
the region's fingerprint emptied, so torch's key alone decides: the control), ``verified``
(combinable: ``verify=True``, the first call after the load checked against eager),
``install-fails`` (torch's install of the loaded entry raises a ``TypeError``, as it did for a LoRA
block on torch 2.13).
"""

from __future__ import annotations

import hashlib
import json
import sys
import warnings

import torch

import torchcompile_kit as tck
from torchcompile_kit import _dynamo
from torchcompile_kit.regional import compile as regional_compile


def main(mode: str, model_dir: str, artifact: str, variant: str = "") -> dict:
    if model_dir == "llama":
        return _llama(mode, artifact)
    if model_dir in ("gpt2-whole", "lora-regional"):
        return _transformers(model_dir, mode, artifact)
    if model_dir == "adamw-step":
        return _optimizer_step(mode, artifact)
    sys.path.insert(0, model_dir)
    import tck_blocks

    if "torch-key" in variant:
        regional_compile.region_fingerprint = lambda module, kwargs: {}
    if (
        variant == "install-fails"
    ):  # torch's install of a loaded entry raising what it does not catch
        from torch._dynamo import package

        def install(self, backends):
            raise TypeError(
                "assigned grad expected to be a Tensor or None but got grad of type _Missing"
            )

        package.CompilePackage.install = install
    if mode == "warm":
        tck.load_compile_cache(artifact)
    torch.manual_seed(0)
    model = tck_blocks.Model(tck_blocks.BlockConfig(scale=3.0 if variant == "config" else 2.0))
    for block in model.blocks:
        if variant == "frozen":
            block.up.bias.requires_grad_(False)
        if "swap" in variant:
            block.act = torch.nn.functional.silu
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tck.compile_regional(model, precompile=True, verify="verified" in variant)
        with tck.CompileMonitor() as monitor:
            loss = model(torch.randn(4, 16, generator=torch.Generator().manual_seed(1)))
            loss.backward()
    paths = {group.precompile_path for group in tck.get_regional_plan(model).groups}
    grads = b"".join(p.grad.numpy().tobytes() for p in model.parameters() if p.grad is not None)
    result = {
        "path": paths.pop() if len(paths) == 1 else sorted(paths),  # every group's, when one
        "frames": len(monitor.frames),
        "dynamo_cache": _dynamo.dynamo_cache_counters(),
        "loss": loss.item(),
        "grads": hashlib.sha256(grads).hexdigest(),
        "warnings": [str(w.message) for w in caught if "compile cache" in str(w.message)],
        # inductor's C++ prelude, made or checked
        "header_precompiles": _dynamo.header_precompiles(),
    }
    if mode == "warm" and not variant:  # a new shape after a precompiled start: a trace beside it
        with tck.CompileMonitor() as again:
            model(torch.randn(7, 16)).backward()
        result["second_shape_frames"] = len(again.frames)
    if mode == "cold":
        saved = tck.save_compile_cache(artifact)
        result["entries"] = saved.mega_cache_entries
    return result


def _llama(mode: str, artifact: str) -> dict:
    """A tiny transformers Llama: its blocks and its pinned loss are precompiled regions."""
    import transformers

    if mode == "warm":
        tck.load_compile_cache(artifact)
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32,
        use_cache=False,
    )
    model = tck.compile_regional(transformers.LlamaForCausalLM(config), precompile=True)
    ids = torch.randint(0, 128, (2, 8), generator=torch.Generator().manual_seed(1))
    with tck.CompileMonitor() as monitor:
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
    grads = b"".join(p.grad.numpy().tobytes() for p in model.parameters() if p.grad is not None)
    result = {
        "path": tck.get_regional_plan(model).groups[0].precompile_path,
        "frames": len(monitor.frames),
        "loss": loss.item(),
        "grads": hashlib.sha256(grads).hexdigest(),
    }
    if mode == "cold":
        tck.save_compile_cache(artifact)
    return result


def _transformers(case: str, mode: str, artifact: str) -> dict:
    """A tiny GPT-2 compiled whole (``compile_model``), or with a LoRA adapter pair
    (``compile_peft``): one train step, then (LoRA) a batch that mixes the two adapters
    (``adapter_names=``) against the eager model."""
    import transformers

    if mode == "warm":
        tck.load_compile_cache(artifact)
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=128,
        n_positions=32,
        n_embd=32,
        n_layer=2,
        n_head=2,
        use_cache=False,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    model = transformers.GPT2LMHeadModel(config)
    if case == "gpt2-whole":
        tck.compile_model(model, precompile=True)
    else:
        import peft

        lora = {
            "r": 4,
            "target_modules": ["c_attn"],
            "init_lora_weights": False,
            "lora_dropout": 0.0,
        }
        model = peft.get_peft_model(model, peft.LoraConfig(**lora))
        model.add_adapter("other", peft.LoraConfig(**lora))
        eager = __import__("copy").deepcopy(model)
        tck.compile_peft(model, precompile=True)
    ids = torch.randint(0, 128, (2, 8), generator=torch.Generator().manual_seed(1))
    with tck.CompileMonitor() as monitor:
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
    grads = b"".join(p.grad.numpy().tobytes() for p in model.parameters() if p.grad is not None)
    result = {
        "paths": {r["label"]: r["path"] for r in _dynamo.precompiled_regions()},
        "frames": len(monitor.frames),
        "dynamo_cache": _dynamo.dynamo_cache_counters(),
        "loss": loss.item(),
        "grads": hashlib.sha256(grads).hexdigest(),
    }
    if case != "gpt2-whole":  # a batch that mixes the adapters, against eager
        model.eval(), eager.eval()
        with torch.no_grad():
            mixed = model(input_ids=ids, adapter_names=["default", "other"]).logits
            reference = eager(input_ids=ids, adapter_names=["default", "other"]).logits
        result["mixed_max_diff"] = (mixed - reference).abs().max().item()
    if mode == "cold":
        tck.save_compile_cache(artifact)
    return result


def _optimizer_step(mode: str, artifact: str) -> dict:
    """torch.optim.AdamW's own step run through a precompiled region (what compile_optimizer would
    need): three steps after the eager one that creates the state."""
    from torchcompile_kit.regional.precompiled import PrecompiledRegion

    if mode == "warm":
        tck.load_compile_cache(artifact)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    region = PrecompiledRegion(
        "AdamW_step",
        {"optimizer": "AdamW"},
        {},
        call=lambda optimizer: type(optimizer).step(optimizer),
    )
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    model(x).sum().backward()
    opt.step()  # the state
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(3):
            model(x).pow(2).sum().backward()
            region(opt)
            opt.zero_grad()
    weights = b"".join(p.detach().numpy().tobytes() for p in model.parameters())
    result = {"path": region.path, "weights": hashlib.sha256(weights).hexdigest()}
    if mode == "cold":
        result["entries"] = tck.save_compile_cache(artifact).mega_cache_entries
    return result


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:])))
