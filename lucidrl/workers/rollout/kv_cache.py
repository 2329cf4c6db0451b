"""A key-value cache that reserves room for the whole generation, for lucidrl's decode loop."""

from __future__ import annotations

import functools

import torch
from transformers.cache_utils import Cache, DynamicLayer


class ReservedLayer(DynamicLayer):
    """A KV cache layer that reserves room for the whole generation up front.

    DynamicLayer grows by torch.cat, copying the whole cache at every decoded token: most of the decode
    time of a small model (benchmarks/decode_cpu.py). This layer writes each new token
    into preallocated buffers and hands attention a view of the filled part.

    With `dtype` the buffers hold that dtype whatever the keys and values come in as (each new token
    is converted once, when written): shared-prefix attention reads the rows' own cache in float32
    at every step, and under bf16 autocast the values arrive in bfloat16, so it converted the whole
    cache per step and layer.
    """

    def __init__(self, capacity: int, dtype: torch.dtype | None = None):
        super().__init__()
        self.capacity = capacity
        self.dtype = dtype
        self.length = 0

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.device = key_states.device
            shape = (*key_states.shape[:2], max(self.capacity, key_states.shape[-2]), key_states.shape[-1])
            self._k = torch.empty(shape, dtype=self.dtype or key_states.dtype, device=self.device)
            self._v = torch.empty(shape, dtype=self.dtype or value_states.dtype, device=self.device)
            self.is_initialized = True
        new = key_states.shape[-2]
        if self.length + new > self._k.shape[-2]:  # out of room: grow (never expected, but stay correct)
            grow = self.length + new - self._k.shape[-2] + 64
            self._k = torch.cat(
                [self._k, self._k.new_empty((*self._k.shape[:2], grow, self._k.shape[-1]))], -2
            )
            self._v = torch.cat(
                [self._v, self._v.new_empty((*self._v.shape[:2], grow, self._v.shape[-1]))], -2
            )
        self._k[:, :, self.length : self.length + new] = key_states
        self._v[:, :, self.length : self.length + new] = value_states
        self.length += new
        self.keys, self.values = self._k[:, :, : self.length], self._v[:, :, : self.length]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.length:
            self._k = self._k.repeat_interleave(repeats, dim=0)
            self._v = self._v.repeat_interleave(repeats, dim=0)
            self.keys, self.values = self._k[:, :, : self.length], self._v[:, :, : self.length]

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.length:
            self._k, self._v = self._k[indices], self._v[indices]
            self.keys, self.values = self._k[:, :, : self.length], self._v[:, :, : self.length]


def reserved_cache(capacity: int, dtype: torch.dtype | None = None) -> Cache:
    """A cache whose layers hold `capacity` positions without reallocating (in `dtype`, if given)."""
    return Cache(layer_class_to_replicate=functools.partial(ReservedLayer, capacity, dtype))
