"""Triton kernel sources, one file per kernel family."""
