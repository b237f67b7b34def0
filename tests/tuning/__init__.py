"""Tests of torchcompile_kit.tuning (the `tune` command and API)."""
