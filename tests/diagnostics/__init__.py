"""Tests of torchcompile_kit.diagnostics."""
