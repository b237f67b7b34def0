"""Tests of torchcompile_kit.adapters."""
