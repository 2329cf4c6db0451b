import pytest
import torch

from lucidrl.batch import Batch, BatchError


def make(n=3):
    return Batch(
        tensors={"x": torch.arange(n * 2).view(n, 2)},
        non_tensors={"uid": [f"u{i}" for i in range(n)]},
        meta={"step": 1},
    )


def test_mismatched_sizes_are_named():
    with pytest.raises(BatchError, match="tensor 'x': 3.*non-tensor 'uid': 2"):
        Batch(tensors={"x": torch.zeros(3, 1)}, non_tensors={"uid": ["a", "b"]})


def test_repeat_interleaves_samples_of_one_prompt():
    b = make(2).repeat(3)
    assert b["uid"] == ["u0", "u0", "u0", "u1", "u1", "u1"]
    assert b["x"][:, 0].tolist() == [0, 0, 0, 2, 2, 2]
    assert make(2).repeat(2, interleave=False)["uid"] == ["u0", "u1", "u0", "u1"]


def test_split_concat_round_trip():
    b = make(5)
    parts = b.split(2)
    assert [len(p) for p in parts] == [2, 2, 1]
    back = Batch.concat(parts)
    assert torch.equal(back["x"], b["x"]) and back["uid"] == b["uid"] and back.meta == {"step": 1}


def test_concat_refuses_different_fields():
    other = Batch(tensors={"y": torch.zeros(1, 2)}, non_tensors={"uid": ["z"]})
    with pytest.raises(BatchError, match="batch 1 has fields"):
        Batch.concat([make(1), other])


def test_pad_to_divisor_and_unpad():
    b = make(5)
    padded, pad = b.pad_to_divisor(4)
    assert pad == 3 and len(padded) == 8
    assert padded["uid"][5:] == ["u0", "u1", "u2"]
    assert padded.unpad(pad)["uid"] == b["uid"]
    assert b.pad_to_divisor(5) == (b, 0)
    with pytest.raises(BatchError, match="pad first"):
        b.chunk(2)
    assert [len(c) for c in padded.chunk(2)] == [4, 4]


def test_reorder_needs_permutation_and_select_copies_meta():
    b = make(3)
    r = b.reorder([2, 0, 1])
    assert r["uid"] == ["u2", "u0", "u1"] and r.meta == b.meta
    with pytest.raises(BatchError, match="permutation"):
        b.reorder([0, 0, 1])


def test_set_checks_length_and_update_merges():
    b = make(3)
    with pytest.raises(BatchError, match="field 'y' has 2 rows but the batch has 3"):
        b.set("y", torch.zeros(2))
    b.update(Batch(tensors={"y": torch.ones(3)}, meta={"t": 2}))
    assert "y" in b and b.meta["t"] == 2
    with pytest.raises(KeyError, match="has no field 'zz'"):
        b["zz"]
