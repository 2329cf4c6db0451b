"""Placement: worker groups (in-process or Ray actors), dispatch of a Batch across ranks, remote errors."""
