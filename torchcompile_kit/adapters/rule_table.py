"""The PEFT x torch.compile rule table: which adapter configurations to refuse, warn about or allow.

Data only (:mod:`.evaluation` applies it): each :class:`~.schema.AdapterRule` names its trigger, the
versions where it applies, its evidence (a section of ``docs/peft.md``, or an upstream issue, doc
or test; never this repository's ``tests/``, which an installed copy lacks) and what to do instead.
"""

from __future__ import annotations

from .schema import TESTED_PEFT_TYPES, AdapterRule

__all__ = ["RULES"]


def _names(items: list[str], limit: int = 4) -> str:
    shown = ", ".join(repr(i) for i in items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


def _if(condition: bool, detail: str) -> str | None:
    return detail if condition else None


# Sections of the project's documentation (docs/peft.md names the test behind each figure).
_DOCS = "docs/peft.md"
_TABLE = f"{_DOCS}#methods--features-what-the-library-does"  # the methods x features table
_RUNTIME = f"{_DOCS}#peft-at-run-time-no-stale-graph"
_PEFT_COMPILE_TESTS = "https://github.com/huggingface/peft/blob/main/tests/test_torch_compile.py"

RULES: tuple[AdapterRule, ...] = (
    # --- what was handed over ----------------------------------------------------------------
    AdapterRule(
        id="not-peft-model",
        severity="refuse",
        condition="the model is not a PeftModel (no peft_config)",
        evidence="API contract: the rules are about PEFT adapters",
        message="{detail} is not a PEFT model (no peft_config, so no adapters): there is "
        "nothing for the PEFT rules to check. To compile a plain model use "
        "torchcompile_kit.compile_regional(model) (and check_compile_equivalence(model, "
        "batch) to compare it with eager); to train adapters, wrap it first with "
        "peft.get_peft_model(model, config) and pass that.",
        check=lambda f: _if(not f.is_peft_model, repr(f.model_class)),
    ),
    AdapterRule(
        id="peft-on-compiled-model",
        severity="refuse",
        condition="PEFT was applied to a torch.compile(...) wrapper: '_orig_mod' inside the model",
        evidence=f"{_TABLE} (the reload gives base-model outputs); huggingface/peft#949, #2957",
        message="PEFT was applied to a torch.compile() wrapper ({detail}): adapters save "
        "under '_orig_mod.' keys and a reload silently gives base-model outputs. Apply "
        "PEFT to the uncompiled model (base._orig_mod), then call compile_peft(model).",
        check=lambda f: _if(bool(f.wrapped_before_peft), _names(f.wrapped_before_peft)),
    ),
    AdapterRule(
        id="already-compiled",
        severity="refuse",
        condition="the model or one of its modules is already compiled (_orig_mod or "
        "_compiled_call_impl)",
        evidence=f"{_TABLE}; peft's utils/hotswap.py check_compiled uses the same test",
        message="the model is already compiled ({detail}); compiling again stacks "
        "compilers and hides which settings apply. Pass the uncompiled model "
        "(model._orig_mod, or torchcompile_kit.uncompile(model)) and compile it once with "
        "compile_peft. After compile_peft, an adapter added later needs no refresh: the "
        "compiled blocks pick it up on first use (one recompile); to change settings, "
        "compile_peft(uncompile(model), ...).",
        check=lambda f: _if(bool(f.compiled_modules), _names(f.compiled_modules)),
    ),
    # --- loud failures and graph breaks on every version ---------------------------------------
    AdapterRule(
        id="dora-fullgraph",
        severity="refuse",
        condition="DoRA with fullgraph=True",
        evidence=f"{_TABLE} (dynamo: 'Unsupported method call' in peft's "
        "dequantize_module_weight, one per DoRA layer)",
        message="DoRA adapters {detail} cannot be traced with fullgraph=True (a graph "
        "break in every DoRA layer); pass fullgraph=False.",
        check=lambda f: _if(f.fullgraph and bool(f.dora_adapters), _names(f.dora_adapters)),
    ),
    AdapterRule(
        id="dora-graph-breaks",
        severity="warn",
        condition="DoRA without fullgraph",
        evidence=f"{_TABLE} (DoRA matches eager; 24 breaks on a 2-layer OPT, one per DoRA layer)",
        message="DoRA adapters {detail} break the graph once per DoRA layer, so the speed-up is "
        "small; correct results are kept. Consider plain LoRA for compiled training.",
        check=lambda f: _if(not f.fullgraph and bool(f.dora_adapters), _names(f.dora_adapters)),
    ),
    AdapterRule(
        id="lokr-loha-training-fullgraph",
        severity="refuse",
        condition="LoKr/LoHa in training with fullgraph=True",
        evidence=f"{_TABLE} (dynamo: 'Data-dependent branching' on torch.rand(1) > module_dropout "
        "in peft's LoKr/LoHa forward)",
        message="LoKr/LoHa adapters {detail} branch on torch.rand(1) > module_dropout in training, "
        "which fullgraph=True cannot trace; pass fullgraph=False, or compile for inference "
        "(model.eval()).",
        check=lambda f: _if(
            f.training and f.fullgraph and bool(f.adapters_of("LOKR", "LOHA")),
            _names(f.adapters_of("LOKR", "LOHA")),
        ),
    ),
    AdapterRule(
        id="lokr-loha-training-graph-breaks",
        severity="warn",
        condition="LoKr/LoHa in training without fullgraph",
        evidence=f"{_TABLE} (LoKr/LoHa training: 14 graphs, 10 breaks on a 2-layer OPT)",
        message="LoKr/LoHa adapters {detail} break the graph in every adapted layer during "
        "training (data-dependent module_dropout branch); results stay correct, the speed-up is "
        "small.",
        check=lambda f: _if(
            f.training and not f.fullgraph and bool(f.adapters_of("LOKR", "LOHA")),
            _names(f.adapters_of("LOKR", "LOHA")),
        ),
    ),
    # --- silent failures on every version ------------------------------------------------------
    AdapterRule(
        id="inductor-freezing-training",
        severity="refuse",
        condition="backend='inductor' with freezing=True while training",
        evidence=f"{_TABLE} (research run: LoRA hotswap under freezing=True, max diff "
        "0.57, outputs silently stale); inductor freezing treats parameters as constants by design",
        message="inductor freezing=True bakes the adapter weights into the graph as "
        "constants ({detail}): training, hotswapping or loading adapters afterwards is "
        "silently ignored. Drop options={{'freezing': True}} (and "
        "torch._inductor.config.freezing) for training.",
        check=lambda f: _if(f.freezing and f.training, "training"),
    ),
    AdapterRule(
        id="inductor-freezing",
        severity="warn",
        condition="backend='inductor' with freezing=True, not training",
        evidence=f"{_TABLE} (hotswap under freezing: max diff 0.57)",
        message="inductor freezing=True bakes the adapter weights into the graph "
        "({detail}): hotswap_adapter, load_adapter into an existing name or any later "
        "weight update is silently ignored. Use it only for a fixed adapter.",
        check=lambda f: _if(f.freezing and not f.training, "inference"),
    ),
    AdapterRule(
        id="cuda-dropout-checkpointing",
        severity="refuse",
        condition="adapter dropout > 0, inductor on CUDA, gradient checkpointing, torch >= 2.13",
        evidence="pytorch/pytorch#198333 (open: inductor corrupts CUDA dropout masks under "
        "activation checkpointing; labelled correctness (silent))",
        message="adapter dropout in {detail} with gradient checkpointing gives wrong gradients "
        "with inductor on CUDA in this torch (pytorch#198333); set the adapter dropout to 0, turn "
        "off gradient checkpointing, or use backend='aot_eager'.",
        check=lambda f: _if(
            bool(f.dropout_adapters)
            and f.backend == "inductor"
            and f.device_type == "cuda"
            and f.gradient_checkpointing
            and f.training,
            _names(f.dropout_adapters),
        ),
        torch_since="2.13",
    ),
    # --- performance and coverage warnings -----------------------------------------------------
    AdapterRule(
        id="many-adapters",
        severity="warn",
        condition="more adapters loaded than torch._dynamo.config.recompile_limit",
        evidence=f"{_TABLE} (cycling 10 adapters: 8 graphs, then eager without an error)",
        message="{detail} adapters are loaded but dynamo keeps at most recompile_limit "
        "graphs per code object; switching past that runs eagerly without an error. "
        "Hotswap instead (compile_peft(..., hotswap_target_rank=r), then "
        "peft.utils.hotswap.hotswap_adapter), or raise "
        "torch._dynamo.config.recompile_limit.",
        check=lambda f: _if(f.n_adapters > f.recompile_limit, str(f.n_adapters)),
    ),
    AdapterRule(
        id="untested-method",
        severity="warn",
        condition="adapter method outside the tested set, prompt learning, or a PeftMixedModel",
        evidence=f"{_TABLE} covers {sorted(TESTED_PEFT_TYPES - {'VBLORA', 'MISS'})}; "
        f"peft's {_PEFT_COMPILE_TESTS} adds VBLORA, MISS",
        message="{detail} has no torch.compile coverage here or upstream; verify it with "
        "torchcompile_kit.check_compile_equivalence(model, batch) before relying on it.",
        check=lambda f: _if(
            f.is_mixed_model
            or bool(f.prompt_learning)
            or any(kind not in TESTED_PEFT_TYPES for kind in f.peft_types.values()),
            "a PeftMixedModel"
            if f.is_mixed_model
            else _names(
                sorted({k for k in f.peft_types.values() if k not in TESTED_PEFT_TYPES})
                + [f"{n} (prompt learning)" for n in f.prompt_learning]
            ),
        ),
    ),
    AdapterRule(
        id="target-parameters",
        severity="warn",
        condition="LoraConfig(target_parameters=...)",
        evidence="huggingface/peft#3304; LoraConfig docstring ('re-compilation and/or graph breaks "
        "are expected')",
        message="LoRA with target_parameters ({detail}) uses torch.nn.utils.parametrize, which "
        "recompiles and breaks the graph; target modules instead where possible.",
        check=lambda f: _if(
            bool(f.target_parameters_adapters), _names(f.target_parameters_adapters)
        ),
    ),
    AdapterRule(
        id="quantized-base",
        severity="warn",
        condition="quantized base model",
        evidence=f"peft's {_PEFT_COMPILE_TESTS} (4-bit bitsandbytes, GPU only); not run here",
        message="the base model is quantized ({detail}); this combination was not "
        "verified by this library. Check it with "
        "torchcompile_kit.check_compile_equivalence(model, batch).",
        check=lambda f: _if(f.quantization is not None, repr(f.quantization)),
    ),
    # --- runtime: compile_peft's guards --------------------------------------------------------
    AdapterRule(
        id="mixed-batch-fullgraph",
        severity="refuse",
        condition="forward(..., adapter_names=[...]) on a model compiled with fullgraph=True",
        evidence=f"{_TABLE} (dynamo: setattr() on RemovableHandle in peft's forward hooks)",
        message="adapter_names={detail} registers forward hooks, which fullgraph=True "
        "cannot trace; compile with fullgraph=False, or batch by adapter and call "
        "set_adapter.",
    ),
    AdapterRule(
        id="recompile-limit",
        severity="warn",
        condition="the compiled model has run in more adapter states than recompile_limit",
        evidence=f"{_TABLE} (a third adapter state past recompile_limit=2 ran eagerly)",
        message="the compiled model has now run with {detail}; each state (active "
        "adapters, disabled, merged, adapter_names) is its own graph and dynamo keeps at "
        "most recompile_limit of them, so later states run eagerly without an error. Load "
        "all adapters before compile_peft and hotswap them (compile_peft(..., "
        "hotswap_target_rank=r)), bucket batches by adapter, or raise "
        "torch._dynamo.config.recompile_limit.",
    ),
    AdapterRule(
        id="generate-eager",
        severity="warn",
        condition="generate() on a regionally compiled model with compile_peft(generate='eager')",
        evidence=f"{_RUNTIME} ('generate()': a 4-layer OPT compiled 16 block graphs for "
        "two generate() calls, over the default recompile_limit of 8)",
        message="generate() runs the compiled blocks eagerly ({detail}): with a KV cache "
        "every layer compiles its own graphs (transformers indexes the cache with the "
        "block's layer_idx; prefill and decode shapes differ), about 4 per layer, which "
        "would exhaust the recompile limit and crowd out the training graphs. Forwards "
        "stay compiled. To compile generation too, pass compile_peft(..., "
        "generate='compiled'): the blocks' limit is raised for it, at the cost of about 4 "
        "compiles per layer.",
    ),
    AdapterRule(
        id="generate-uncompiled",
        severity="warn",
        condition="generate() on a model compiled whole (regional=False)",
        evidence=f"{_TABLE} (compiled.generate(): 0 graphs; PeftModel.generate calls the "
        "eager base model)",
        message="generate() on {detail} never runs the compiled graph; compile with "
        "compile_peft(model) (regional=True), which compiles the blocks generate() runs "
        "through.",
    ),
)
