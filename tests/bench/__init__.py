"""Tests of torchcompile_kit.bench."""
