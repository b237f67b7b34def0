"""The architecture sweep: does ``RegionalPlan.report()`` agree with dynamo on every model type?

For each model type transformers can build tiny (``AutoConfig.for_model`` with small sizes,
random weights, nothing downloaded), in a fresh process each: two training steps eagerly and two
with ``compile_regional(model, backend="aot_eager")`` (the loss compiled too, a row of the
report of its own) under a ``CompileMonitor``, then compare

- the compiled losses and gradients with eager (``equal``),
- the report, group by group, with dynamo's own record: graphs (``counters["stats"]
  ["unique_graphs"]``), graph breaks (the lines of dynamo's graph-break log, the stream
  ``TORCH_LOGS=graph_breaks`` prints: one per break met; ``counters["graph_break"]`` leaves out
  data-dependent branches at a frame's top level, so it is recorded beside them, not compared),
  recompiles (cache entries per code object, minus one) and the monitor's snapshot with the same.

Run (from the repository root; each type in its own process, a JSON line each)::

    python tests/regional/arch_sweep.py bert t5 llama            # some types
    python tests/regional/arch_sweep.py --all --out sweep.jsonl  # every type (hours on 2 cores)
    python tests/regional/arch_sweep.py --table sweep.jsonl      # the docs table from a run

``tests/regional/test_arch_sweep.py`` runs a sample as a slow test; the table of the last full
run is in ``docs/regional.md`` ("Every architecture").
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import os
import subprocess
import sys
import time
import traceback
from itertools import chain, zip_longest
from typing import Any, Self

VOCAB = 128
# the sweep: the causal-LM mapping plus encoders, encoder-decoders and vision models
EXTRA_TYPES = (
    "bert",
    "roberta",
    "electra",
    "deberta-v2",
    "longformer",
    "camembert",
    "xlm-roberta",
    "albert",
    "distilbert",
    "mpnet",
    "t5",
    "mt5",
    "umt5",
    "bart",
    "vit",
    "swin",
)
SAMPLE = ("bert", "t5", "llama", "diffllama", "jetmoe")
"""The slow test's sample: the BERT family, T5, llama, a preflight warning that dynamo disproves
(diffllama: a per-layer float read in forward, predicted 4 graphs, 2 made) and breaks inside the
blocks' callees (jetmoe: data-dependent expert routing). A restarted trace is in the non-slow
tests (``test_report.py``), with a block built for it."""

# sizes every config that has the attribute gets (sub-configs too)
_SIZES = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "d_model": 64,
    "n_embd": 64,
    "embed_dim": 64,
    "num_hidden_layers": 4,
    "num_layers": 4,
    "n_layer": 4,
    "num_decoder_layers": 4,
    "encoder_layers": 4,
    "decoder_layers": 4,
    "num_attention_heads": 4,
    "n_head": 4,
    "num_heads": 4,
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "ffn_dim": 128,
    "d_ff": 128,
    "encoder_ffn_dim": 128,
    "decoder_ffn_dim": 128,
    "n_inner": 128,
    "head_dim": 16,
    "d_kv": 16,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 32,
    "num_experts": 4,
    "num_local_experts": 4,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "max_position_embeddings": 256,
    "n_positions": 256,
    "image_size": 32,
    "patch_size": 8,
    "num_channels": 3,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "decoder_start_token_id": 0,
    "use_cache": False,
}
# dropped on a second try when the first fails to build or run eagerly: derived sizes (rope and
# latent-attention head dims, expert widths) that some configs tie to these
_RELAXED = frozenset(
    {
        "head_dim",
        "d_kv",
        "num_key_value_heads",
        "moe_intermediate_size",
        "shared_expert_intermediate_size",
        "num_experts",
        "num_local_experts",
        "n_routed_experts",
        "num_experts_per_tok",
    }
)
_DROPOUTS = (
    "dropout",
    "attention_dropout",
    "hidden_dropout",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "resid_pdrop",
    "embd_pdrop",
    "attn_pdrop",
    "dropout_rate",
    "activation_dropout",
    "classifier_dropout",
    "embed_dropout",
    "resid_dropout",
    "ffn_dropout",
)


def model_types() -> list[str]:
    """Every type of the causal-LM mapping, then :data:`EXTRA_TYPES`."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return list(dict.fromkeys([*MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, *EXTRA_TYPES]))


def _overrides(config: Any, relaxed: bool = False) -> dict[str, Any]:
    from transformers import PretrainedConfig

    names = set(vars(config)) | set(getattr(config, "attribute_map", {}))
    out: dict[str, Any] = {
        k: v for k, v in _SIZES.items() if k in names and not (relaxed and k in _RELAXED)
    }
    out.update({k: 0.0 for k in _DROPOUTS if isinstance(getattr(config, k, None), float)})
    # every other random draw in train mode (seed_oss's residual_dropout, phimoe's router jitter)
    out.update(
        {
            k: 0.0
            for k, v in vars(config).items()
            if isinstance(v, float) and ("dropout" in k or "jitter" in k)
        }
    )
    for name, value in vars(config).items():
        if isinstance(value, PretrainedConfig):
            out[name] = {**value.to_dict(), **_overrides(value, relaxed)}
    return out


def tiny_config(model_type: str, *, relaxed: bool = False) -> Any:
    """``AutoConfig.for_model(model_type)`` rebuilt with tiny sizes (attributes it has only);
    ``relaxed`` leaves the derived sizes of :data:`_RELAXED` at their defaults."""
    from transformers import AutoConfig

    default = AutoConfig.for_model(model_type)
    config = AutoConfig.for_model(model_type, **_overrides(default, relaxed))
    if (
        getattr(config, "is_encoder_decoder", False)
        and getattr(config, "decoder_start_token_id", None) is None
    ):  # labels are shifted right into decoder inputs from this token
        config.decoder_start_token_id = 0
    if hasattr(config, "layer_types") and isinstance(config.layer_types, list):
        layers = getattr(config, "num_hidden_layers", None)
        if layers and len(config.layer_types) != layers:  # a default list of the full size
            config.layer_types = (config.layer_types * layers)[:layers]
    return config


def build(model_type: str, *, relaxed: bool = False) -> tuple[Any, dict[str, Any]]:
    """The tiny model (train mode, seeded) and a batch with labels for it."""
    import torch
    from transformers.models.auto import modeling_auto as auto

    config = tiny_config(model_type, relaxed=relaxed)
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    if model_type in auto.MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES and model_type in (
        "vit",
        "swin",
    ):
        from transformers import AutoModelForImageClassification

        model = AutoModelForImageClassification.from_config(config)
        batch = {
            "pixel_values": torch.randn(2, 3, 32, 32, generator=gen),
            "labels": torch.tensor([0, 1]),
        }
        return model.train(), batch
    ids = torch.randint(3, VOCAB, (2, 16), generator=gen)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}
    for mapping, loader in (
        (auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, "AutoModelForCausalLM"),
        (auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES, "AutoModelForSeq2SeqLM"),
        (auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES, "AutoModelForMaskedLM"),
    ):
        if model_type in mapping:
            import transformers

            model = getattr(transformers, loader).from_config(config)
            return model.train(), batch
    raise LookupError(f"no causal-LM, seq2seq or masked-LM head for {model_type!r}")


def _loss(output: Any) -> Any:
    loss = output["loss"] if isinstance(output, dict) else output[0]
    if getattr(loss, "ndim", 0):
        loss = loss.mean()
    return loss


def _train(model: Any, batch: dict[str, Any], steps: int) -> tuple[list[float], list[Any]]:
    import torch

    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    losses, grads = [], []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = _loss(model(**batch))
        loss.backward()
        losses.append(loss.detach())
        grads.append([p.grad.detach().clone() for p in model.parameters() if p.grad is not None])
        optimizer.step()
    return losses, grads


def _max_diff(a: Any, b: Any) -> float:
    return max(((x.float() - y.float()).abs().max().item() for x, y in zip(a, b)), default=0.0)


class BreakLog(logging.Handler):
    """Counts the lines of dynamo's graph-break log (``TORCH_LOGS=graph_breaks``) while entered.

    dynamo writes one line per graph break it meets (a duplicate gets a short line, not none)
    to its ``graph_breaks`` artifact loggers (``torch._dynamo.<module>.__graph_breaks``); they
    are switched to DEBUG with this handler only, and restored on exit.
    """

    def __init__(self) -> None:
        import torch._dynamo  # noqa: F401  # registers the artifact loggers

        super().__init__(level=logging.DEBUG)
        self.count = 0
        names = [n for n in logging.root.manager.loggerDict if n.endswith(".__graph_breaks")]
        self._loggers = [logging.getLogger(name) for name in names]
        self._saved: list[tuple[int, bool]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1  # each of dynamo's three call sites logs one record per break

    def __enter__(self) -> Self:
        self._saved = [(log.level, log.propagate) for log in self._loggers]
        for log in self._loggers:
            log.setLevel(logging.DEBUG)
            log.propagate = False
            log.addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        for log, (level, propagate) in zip(self._loggers, self._saved):
            log.removeHandler(self)
            log.setLevel(level)
            log.propagate = propagate


def dynamo_record(breaks: BreakLog) -> dict[str, int]:
    """What dynamo itself counted: graphs, breaks met, recompiles (cache entries - 1 per code)."""
    from torch._dynamo import convert_frame, eval_frame
    from torch._dynamo.utils import counters

    recompiles = 0
    for ref in convert_frame.input_codes.seen:
        code = ref()
        if code is not None:
            recompiles += max(len(eval_frame._debug_get_cache_entry_list(code)) - 1, 0)
    from torch._dynamo.utils import get_compilation_metrics

    restarts = sum(
        "Tensorify" in str(m.restart_reasons)
        for m in get_compilation_metrics()
        if m.restart_reasons
    )
    return {
        "tensorify_restarts": restarts,
        "frames": int(counters["frames"]["ok"]),
        "graphs": int(counters["stats"]["unique_graphs"]),
        "graph_breaks": breaks.count,
        "graph_break_counter": int(sum(counters["graph_break"].values())),
        "recompiles": recompiles,
    }


def run_one(model_type: str, *, backend: str = "aot_eager", steps: int = 2) -> dict[str, Any]:
    """Eager vs ``compile_regional`` on one type; the report next to dynamo's record."""
    import torch
    import transformers

    from torchcompile_kit import CompileMonitor, compile_regional, get_regional_plan

    row: dict[str, Any] = {
        "type": model_type,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "backend": backend,
    }
    start = time.perf_counter()
    failed: dict[str, Any] = {}
    for relaxed in (False, True):  # a second try with the derived sizes left alone
        try:
            model, batch = build(model_type, relaxed=relaxed)
            compiled = copy.deepcopy(model)
        except Exception as exc:  # noqa: BLE001  # a type that cannot be built tiny: say why
            failed = failed or {**row, "stage": "build", "error": _short(exc)}
            continue
        called: set[str] = set()
        hooks = [
            module.register_forward_pre_hook(lambda *_, name=name, seen=called: seen.add(name))
            for name, module in model.named_modules()
        ]
        try:
            eager_losses, eager_grads = _train(model, batch, steps)
        except Exception as exc:  # noqa: BLE001
            failed = failed or {**row, "stage": "eager", "error": _short(exc)}
            continue
        finally:
            for hook in hooks:
                hook.remove()
        row["relaxed"] = relaxed
        break
    else:
        return failed
    torch._dynamo.reset()
    from torch._dynamo.utils import counters

    counters.clear()
    try:
        # as a user calls it: the loss is compiled too, and is a row of the report of its own
        compile_regional(compiled, backend=backend)
    except Exception as exc:  # noqa: BLE001  # no repeated blocks, ...
        return {**row, "stage": "compile_regional", "error": _short(exc)}
    try:
        with BreakLog() as breaks, CompileMonitor() as monitor:
            losses, grads = _train(compiled, batch, steps)
    except Exception as exc:  # noqa: BLE001  # a crash in torch itself
        return {**row, "stage": "compiled", "error": _short(exc)}
    report = get_regional_plan(compiled).report(monitor)
    dynamo = dynamo_record(breaks)
    snapshot = monitor.snapshot()
    planned = get_regional_plan(compiled).groups
    groups = [
        {
            "class": g.class_name,
            "blocks": g.blocks,
            "predicted": g.predicted_graphs,
            "graphs": g.graphs,
            "recompiles": len(g.recompiles),
            "breaks": g.graph_break_count,
            "flags": g.flags,
            "ran": plan is None or any(name in called for name in plan.names),
        }
        for g, plan in zip_longest(report.groups, planned)  # the block groups, then the loss
    ]
    summed = {key: sum(g[key] for g in groups) for key in ("graphs", "recompiles", "breaks")}
    diffs = [_max_diff([a], [b]) for a, b in zip(eager_losses, losses)]
    diffs += [_max_diff(a, b) for a, b in zip(eager_grads, grads)]
    row.update(
        stage="done",
        seconds=round(time.perf_counter() - start, 1),
        groups=groups,
        dynamo=dynamo,
        snapshot={k: snapshot[k] for k in ("frames", "graphs", "recompiles", "graph_breaks_met")},
        max_diff=max(diffs, default=0.0),
        equal=all(
            torch.allclose(a.float(), b.float(), rtol=1e-4, atol=1e-5)
            for a, b in zip([*eager_losses, *chain(*eager_grads)], [*losses, *chain(*grads)])
        ),
        bit_identical=max(diffs, default=0.0) == 0.0,
        one_graph_per_class=all(g["graphs"] <= 1 for g in groups) and not summed["breaks"],
        report_equals_dynamo=(
            summed
            == {
                "graphs": dynamo["graphs"],
                "recompiles": dynamo["recompiles"],
                "breaks": dynamo["graph_breaks"],
            }
        ),
        snapshot_equals_dynamo=(
            (
                snapshot["frames"],
                snapshot["graphs"],
                snapshot["recompiles"],
                snapshot["graph_breaks_met"],
            )
            == (dynamo["frames"], dynamo["graphs"], dynamo["recompiles"], dynamo["graph_breaks"])
        ),
        # a group whose blocks ran (in the eager run of the same batch) said "compiled nothing"
        # while dynamo compiled and hit no limit (phi4_multimodal's vision and audio blocks do
        # not run on a text batch: "compiled nothing" is then the truth)
        compiled_nothing_wrongly=any(
            g["ran"] and any("compiled nothing" in f for f in g["flags"]) for g in groups
        )
        and dynamo["graphs"] > 0
        and not snapshot["recompile_limit_hits"],
    )
    return row


def _short(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip().splitlines()
    where = traceback.extract_tb(exc.__traceback__)
    origin = f" [{os.path.basename(where[-1].filename)}:{where[-1].lineno}]" if where else ""
    return (text[0][:300] if text else type(exc).__name__) + origin


def run_in_subprocess(model_type: str, *, timeout: float = 900) -> dict[str, Any]:
    """:func:`run_one` in a fresh Python process (dynamo, torch and transformers start clean)."""
    command = [sys.executable, os.path.abspath(__file__), "--one", model_type]
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, env=env, check=False
        )
    except subprocess.TimeoutExpired:
        return {"type": model_type, "stage": "timeout", "error": f"over {timeout:.0f} s"}
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
    return {
        "type": model_type,
        "stage": "crashed",
        "error": f"exit {done.returncode}: " + " | ".join(tail)[:300],
    }


def table(rows: list[dict[str, Any]]) -> str:
    """The docs table: totals, the types that did not run (with why), then one row per type."""
    done = [r for r in rows if r.get("stage") == "done"]

    def count(key: str) -> int:
        return sum(bool(r.get(key)) for r in done)

    agree = sum(bool(r["report_equals_dynamo"] and r["snapshot_equals_dynamo"]) for r in done)
    lines = [
        (
            "| types tried | ran compiled | equal to eager (bit-identical) | <= 1 graph per class, "
            'no break | report and snapshot = dynamo | "compiled nothing" while dynamo compiled |'
        ),
        "|---|---|---|---|---|---|",
        (
            f"| {len(rows)} | {len(done)} | {count('equal')} ({count('bit_identical')}) | "
            f"{count('one_graph_per_class')} | {agree} | {count('compiled_nothing_wrongly')} |"
        ),
    ]
    failed = [r for r in rows if r.get("stage") != "done"]
    if failed:
        lines += [
            "",
            (
                "Not run (stage that failed: `build`/`eager` = cannot be built tiny by the "
                "generic shrinker, `compile_regional` = no repeated blocks, `compiled` = a "
                "crash under compile, `timeout`):"
            ),
            "",
            "| type | stage | reason |",
            "|---|---|---|",
        ]
        lines += [
            f"| {r['type']} | {r['stage']} | {str(r.get('error', ''))[:140].replace('|', '/')} |"
            for r in failed
        ]
    lines += [
        "",
        "<details><summary>Every type that ran</summary>",
        "",
        (
            "| type | class: graphs / predicted | recompiles | breaks | max diff vs eager "
            "| report = dynamo |"
        ),
        "|---|---|---|---|---|---|",
    ]
    for r in done:
        classes = ", ".join(f"{g['class']}: {g['graphs']} / {g['predicted']}" for g in r["groups"])
        agrees = r["report_equals_dynamo"] and r["snapshot_equals_dynamo"]
        lines.append(
            f"| {r['type']} | {classes} | {sum(g['recompiles'] for g in r['groups'])} | "
            f"{sum(g['breaks'] for g in r['groups'])} | {r['max_diff']:.1e}"
            f"{'' if r['equal'] else ' (NOT equal)'} | {'yes' if agrees else 'NO'} |"
        )
    lines += ["", "</details>"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("types", nargs="*", help="model types (default: the sample)")
    parser.add_argument("--all", action="store_true", help="every type of model_types()")
    parser.add_argument("--out", help="append one JSON line per type to this file")
    parser.add_argument("--skip-done", action="store_true", help="skip types already in --out")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per type")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # the child process
    parser.add_argument("--table", help="print the docs table of a --out file and exit")
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(run_one(args.one), default=str), flush=True)
        return 0
    if args.table:
        with open(args.table) as handle:
            print(table([json.loads(line) for line in handle if line.strip()]))
        return 0
    types = model_types() if args.all else (args.types or list(SAMPLE))
    if args.skip_done and args.out and os.path.exists(args.out):
        with open(args.out) as handle:
            done = {json.loads(line)["type"] for line in handle if line.strip()}
        types = [t for t in types if t not in done]
    rows = []
    for model_type in types:
        row = run_in_subprocess(model_type, timeout=args.timeout)
        rows.append(row)
        print(f"{model_type}: {row.get('stage')} {row.get('error', '')}"[:200], flush=True)
        if args.out:
            with open(args.out, "a") as handle:
                handle.write(json.dumps(row, default=str) + "\n")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
