"""Tests of torchcompile_kit.shapes."""
