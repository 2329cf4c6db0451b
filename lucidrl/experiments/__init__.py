"""Experiments beyond the demo, each a command of its own (`lucidrl experiment NAME`)."""
