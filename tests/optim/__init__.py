"""Tests of torchcompile_kit.optim."""
