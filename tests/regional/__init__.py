"""Tests of torchcompile_kit.regional."""
