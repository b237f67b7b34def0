"""``python -m torchcompile_kit``: the same as the ``torchcompile-kit`` command."""

from .cli import main

if __name__ == "__main__":
    raise SystemExit(main())
