"""Command line: ``torchcompile-kit bench [RECIPE ...] [--size small|full] [--json PATH]``.

Also ``python -m torchcompile_kit``. Nothing in the package imports this module.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from .bench import RECIPES


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="torchcompile-kit",
        description="Measure, on this machine, what each torch.compile recipe buys.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    bench = sub.add_parser(
        "bench",
        help="run benchmark recipes side by side and print ratios",
        description="Recipes:\n"
        + "\n".join(f"  {name:10s} {desc}" for name, (_, desc) in RECIPES.items()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    bench.add_argument(
        "recipes",
        nargs="*",
        metavar="RECIPE",
        help=f"which recipes to run (default: all of {', '.join(RECIPES)})",
    )
    bench.add_argument(
        "--size",
        choices=("small", "full"),
        default="small",
        help="small: minutes on a 2-core CPU (default); full: the sizes quoted in docs/benchmarks.md",
    )
    bench.add_argument(
        "--json",
        default="bench-results.json",
        metavar="PATH",
        help="where to write the results with versions and machine (default: %(default)s)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    unknown = [r for r in args.recipes if r not in RECIPES]
    if unknown:
        print(
            f"torchcompile-kit bench: unknown recipe(s) {unknown!r}; choose from {list(RECIPES)}",
            file=sys.stderr,
        )
        return 2
    from .bench.report import format_table, write_json

    results = []
    for name in args.recipes or list(RECIPES):
        module = importlib.import_module(RECIPES[name][0])
        result = module.run(size=args.size)
        print(format_table(result), flush=True)
        print(flush=True)
        results.append(result)
    path = write_json(args.json, results)
    print(f"results written to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
