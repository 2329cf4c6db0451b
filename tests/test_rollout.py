import pytest
import torch

from lucidrl.data.dataset import collate, load_prompts
from lucidrl.models import load_model
from lucidrl.workers.rollout.engine import SamplingParams
from lucidrl.workers.rollout.hf_engine import HFRollout
from lucidrl.workers.rollout.responses import response_mask_from_ids
from lucidrl.workers.training.forward import response_log_probs


def test_response_mask_stops_after_first_eos():
    ids = torch.tensor([[5, 6, 2, 7, 2], [5, 5, 5, 5, 5], [2, 0, 0, 0, 0]])
    assert response_mask_from_ids(ids, [2]).tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]]
    assert response_mask_from_ids(ids, [2, 7]).tolist()[0] == [1, 1, 1, 0, 0]


def _prompts(kk_data, tok, k=3):
    samples, _ = load_prompts([kk_data["train"]], tok, max_prompt_length=2048)
    return collate(samples[:k], tok.pad_token_id)


@pytest.mark.slow
def test_generate_n_samples_with_logprobs_matching_a_training_forward(kk_data, tiny_model, tiny_tokenizer):
    model = load_model(tiny_model["path"])
    batch = _prompts(kk_data, tiny_tokenizer)
    torch.manual_seed(0)
    out = HFRollout(model, tiny_tokenizer).generate(
        batch, SamplingParams(n=4, temperature=0.8, max_new_tokens=24)
    )
    assert len(out) == 12 and out["uid"][:4] == ["p0"] * 4 and out["uid"][4] == "p1"
    assert torch.equal(out["prompts"][0], out["prompts"][3])
    assert out["responses"].shape[1] <= 24
    mask = out["response_mask"]
    # padding after an eos is the pad id and carries no log-prob
    assert torch.all(out["responses"][mask == 0] == tiny_tokenizer.pad_token_id)
    assert torch.all(out["rollout_log_probs"][mask == 0] == 0)
    # sampling log-probs equal a full forward at the same temperature (positions from left padding)
    with torch.no_grad():
        lp, _ = response_log_probs(model.eval(), out, temperature=0.8, with_entropy=False)
    assert (lp - out["rollout_log_probs"])[mask.bool()].abs().max() < 1e-4


@pytest.mark.slow
def test_greedy_generation_is_deterministic_and_has_no_logprobs(kk_data, tiny_model, tiny_tokenizer):
    model = load_model(tiny_model["path"])
    batch = _prompts(kk_data, tiny_tokenizer, k=2)
    params = SamplingParams(n=1, do_sample=False, max_new_tokens=16)
    a = HFRollout(model, tiny_tokenizer).generate(batch, params)
    b = HFRollout(model, tiny_tokenizer).generate(batch, params)
    assert torch.equal(a["responses"], b["responses"]) and "rollout_log_probs" not in a


def test_sampling_respects_top_k_one(kk_data, tiny_model, tiny_tokenizer):
    model = load_model(tiny_model["path"])
    batch = _prompts(kk_data, tiny_tokenizer, k=2)
    greedy = HFRollout(model, tiny_tokenizer).generate(
        batch, SamplingParams(n=1, do_sample=False, max_new_tokens=12)
    )
    topk1 = HFRollout(model, tiny_tokenizer).generate(
        batch, SamplingParams(n=1, do_sample=True, temperature=1.5, top_k=1, max_new_tokens=12)
    )
    assert torch.equal(greedy["responses"], topk1["responses"])


@pytest.mark.slow
def test_lucidrl_decode_loop_matches_transformers_generate_greedy(kk_data, tiny_model, tiny_tokenizer):
    """Shared-prefix prefill, batch compaction and left padding change nothing in what is generated; a
    checkpoint's generation_config (a repetition penalty as Qwen2.5-Instruct ships, here suppressed tokens)
    changes neither loop: the rollout's distribution is the one its log-probs and the actor's forward see."""
    model = load_model(tiny_model["path"])
    model.generation_config.repetition_penalty = 1.5
    model.generation_config.suppress_tokens = [i for i in range(model.config.vocab_size) if i != 7]
    batch = _prompts(kk_data, tiny_tokenizer, k=4)
    params = SamplingParams(n=3, do_sample=False, max_new_tokens=20)
    ours = HFRollout(model, tiny_tokenizer, decode_loop="lucidrl").generate(batch, params)
    theirs = HFRollout(model, tiny_tokenizer, decode_loop="transformers").generate(batch, params)
    assert torch.equal(ours["responses"], theirs["responses"])
    assert torch.equal(ours["response_mask"], theirs["response_mask"])


def test_decode_loop_stops_rows_at_eos_and_compacts(kk_data, tiny_model, tiny_tokenizer):
    from lucidrl.workers.rollout.decode import sample_group

    model = load_model(tiny_model["path"])
    batch = _prompts(kk_data, tiny_tokenizer, k=2)
    torch.manual_seed(0)
    # every token is an eos candidate: list all ids as eos, so every row ends on its first token
    resp, lp = sample_group(
        model,
        batch["prompts"],
        batch["prompt_mask"],
        n=4,
        max_new_tokens=10,
        eos_ids=list(range(model.config.vocab_size)),
        pad_id=0,
    )
    assert resp.shape == (8, 1) and torch.all(lp < 0)


@pytest.mark.slow
@pytest.mark.parametrize("n", [1, 8])
def test_decoding_stops_when_the_last_row_has_ended_not_when_all_end_at_once(
    kk_data, tiny_model, tiny_tokenizer, n
):
    """Before, a row counted as finished only at the step it emitted its eos: unless every row ended at
    the same step (or a quarter of them did), decoding ran on to max_new_tokens."""
    from lucidrl.workers.rollout.decode import MIN_COMMON_PREFIX, common_prefix_length, sample_group

    model = load_model(tiny_model["path"])
    eos = tiny_tokenizer.eos_token_id
    bias = torch.zeros(model.config.vocab_size)
    bias[eos] = 4.5  # eos then comes about once in 8 tokens: rows end at scattered steps
    model.get_output_embeddings().register_forward_hook(lambda m, i, out: out + bias)
    calls = []
    model.register_forward_pre_hook(lambda m, a: calls.append(1))
    batch = _prompts(kk_data, tiny_tokenizer, k=4 if n > 1 else 16)
    torch.manual_seed(0)
    resp, _ = sample_group(
        model, batch["prompts"], batch["prompt_mask"], n=n, max_new_tokens=300, eos_ids=[eos], pad_id=0,
        do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
    )  # fmt: skip
    is_eos = resp == eos
    assert is_eos.any(-1).all()  # every row ended
    first = is_eos.float().argmax(-1)
    assert len(set(first.tolist())) >= 4  # at scattered steps
    # the prefill (two forwards when the prompts share a system prompt: it once, then the rest), then
    # a forward per further token, up to the last row's eos, and no further
    prefill = 2 if common_prefix_length(batch["prompts"], batch["prompt_mask"]) >= MIN_COMMON_PREFIX else 1
    assert resp.shape[1] == int(first.max()) + 1 < 300
    assert len(calls) == resp.shape[1] - 1 + prefill


def test_filter_logits_top_k_and_top_p():
    from lucidrl.workers.rollout.sampling import filter_logits

    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    assert torch.isinf(filter_logits(logits, 2, 1.0)).tolist() == [[False, False, True, True]]
    # top_p=0.8: 0.5 + 0.3 reach 0.8, so the third and fourth tokens go
    assert torch.isinf(filter_logits(logits, -1, 0.8)).tolist() == [[False, False, True, True]]
    assert torch.isinf(filter_logits(logits, -1, 0.81)).tolist() == [[False, False, False, True]]


def test_common_prefix_length_counts_the_shared_leading_real_tokens_and_leaves_each_row_one():
    from lucidrl.workers.rollout.decode import common_prefix_length

    def left_padded(rows, width):
        ids, mask = (
            torch.zeros((len(rows), width), dtype=torch.long),
            torch.zeros((len(rows), width), dtype=torch.long),
        )
        for i, r in enumerate(rows):
            ids[i, width - len(r) :], mask[i, width - len(r) :] = torch.tensor(r), 1
        return ids, mask

    assert common_prefix_length(*left_padded([[5, 6, 7, 8], [5, 6, 9], [5, 6, 7, 1, 2]], 6)) == 2
    # a prompt that is all prefix keeps its last token: the prefill's last logits come from its own forward
    assert common_prefix_length(*left_padded([[5, 6, 7], [5, 6, 7, 8, 9]], 5)) == 2
    assert common_prefix_length(*left_padded([[5, 6, 7], [4, 6, 7]], 4)) == 0
    assert common_prefix_length(*left_padded([[5, 6, 7, 8]], 4)) == 0  # one prompt: nothing to share
    ids, mask = left_padded([[5, 6, 7, 8], [5, 6, 7, 9]], 5)
    mask[0, 2] = 0  # a hole in a row's real tokens: not the left padding this relies on
    assert common_prefix_length(ids, mask) == 0


@pytest.mark.slow
def test_a_shared_system_prompt_is_prefilled_once_with_the_same_samples_and_log_probs(
    kk_data, tiny_model, tiny_tokenizer, monkeypatch
):
    from lucidrl.workers.rollout import decode

    model = load_model(tiny_model["path"])
    batch = _prompts(kk_data, tiny_tokenizer, k=8)
    common = decode.common_prefix_length(batch["prompts"], batch["prompt_mask"])
    assert common >= decode.MIN_COMMON_PREFIX  # Logic-RL's system prompt
    shapes = []
    model.register_forward_pre_hook(
        lambda m, a, kw: shapes.append(tuple(kw["input_ids"].shape)), with_kwargs=True
    )
    args = dict(n=4, max_new_tokens=24, eos_ids=[tiny_tokenizer.eos_token_id], pad_id=0, top_k=-1, top_p=1.0)
    out = {}
    for once in (True, False):
        if not once:
            monkeypatch.setattr(decode, "MIN_COMMON_PREFIX", 10**9)
        for sample in (False, True):
            shapes.clear()
            torch.manual_seed(0)
            out[once, sample] = decode.sample_group(
                model, batch["prompts"], batch["prompt_mask"], do_sample=sample, temperature=1.0, **args
            )
            first = (1, common) if once else tuple(batch["prompts"].shape)
            assert shapes[0] == first
    for sample in (False, True):
        (r1, lp1), (r0, lp0) = out[True, sample], out[False, sample]
        assert torch.equal(r1, r0)
        torch.testing.assert_close(lp1, lp0, atol=1e-5, rtol=0)


@pytest.mark.slow
@pytest.mark.parametrize("shared", [True, False])
def test_a_rows_samples_do_not_depend_on_when_other_rows_end(
    kk_data, tiny_model, tiny_tokenizer, monkeypatch, shared
):
    """Each row draws its own uniform per step (sampling.RowDraws), so dropping finished rows from the
    batch early, late or never changes no row's tokens. With one draw per still-decoding row from the
    process RNG, a row ending at another step shifted every later row's draws."""
    from lucidrl.workers.rollout import decode, sampling

    model = load_model(tiny_model["path"]).eval()
    eos = tiny_tokenizer.eos_token_id
    bias = torch.zeros(model.config.vocab_size)
    bias[eos] = 4.5  # rows end at scattered steps
    model.get_output_embeddings().register_forward_hook(lambda m, i, out: out + bias)
    batch = _prompts(kk_data, tiny_tokenizer, k=4)
    monkeypatch.setattr(sampling, "DRAW_BLOCK", 5)  # the draws run out, and are redrawn, mid-response
    kw = dict(n=4, max_new_tokens=40, eos_ids=[eos], pad_id=0, do_sample=True, temperature=1.0,
              top_k=-1, top_p=1.0)  # fmt: skip
    out = []
    for fraction in (0.01, 0.25, 1.0):  # compact as soon as one row ends, the default, never
        monkeypatch.setattr(decode, "COMPACT_FRACTION", fraction)
        torch.manual_seed(3)
        out.append(decode._decode(model, batch["prompts"], batch["prompt_mask"], shared=shared, **kw))
    responses, logps = out[0]
    ended = (responses == eos).any(-1)
    ends = (responses == eos).float().argmax(-1)[ended]
    assert ended.sum() >= 8 and len(set(ends.tolist())) >= 4  # rows ended, at scattered steps
    for other, other_logps in out[1:]:
        assert torch.equal(other, responses)
        torch.testing.assert_close(other_logps, logps, atol=1e-5, rtol=0)


def test_row_draws_are_fixed_by_row_and_step_whatever_rows_are_asked_for(monkeypatch):
    from lucidrl.workers.rollout import sampling

    monkeypatch.setattr(sampling, "DRAW_BLOCK", 3)
    torch.manual_seed(0)
    full = sampling.RowDraws(5, torch.device("cpu"))
    every = torch.cat([full.at(t, torch.arange(5)) for t in range(8)], dim=1)  # (5 rows, 8 steps)
    torch.manual_seed(0)
    few = sampling.RowDraws(5, torch.device("cpu"))
    picked = [few.at(t, torch.tensor([4, 1] if t < 4 else [1])) for t in range(8)]
    assert torch.equal(torch.cat(picked[:4], dim=1), every[[4, 1], :4])
    assert torch.equal(torch.cat(picked[4:], dim=1), every[[1], 4:])
    assert ((every >= 0) & (every < 1)).all() and len(set(every.flatten().tolist())) == 40


def test_reserved_cache_layer_returns_what_was_written_and_grows_past_capacity():
    from lucidrl.workers.rollout.kv_cache import reserved_cache

    cache = reserved_cache(capacity=3)
    a, b = torch.randn(2, 1, 2, 4), torch.randn(2, 1, 2, 4)
    k, v = cache.update(a, a * 2, 0)
    assert torch.equal(k, a) and torch.equal(v, a * 2) and cache.get_seq_length() == 2
    k, _ = cache.update(b, b, 0)  # 4 positions > capacity 3: grows, stays correct
    assert torch.equal(k, torch.cat([a, b], dim=2))
    cache.batch_select_indices(torch.tensor([1]))
    assert torch.equal(cache.layers[0].keys, torch.cat([a, b], dim=2)[1:])


def test_reserved_cache_in_a_dtype_converts_each_token_once_when_written():
    from lucidrl.workers.rollout.kv_cache import reserved_cache

    cache = reserved_cache(capacity=4, dtype=torch.float32)
    a = torch.randn(2, 1, 2, 4, dtype=torch.bfloat16)
    k, v = cache.update(a, a * 2, 0)
    assert k.dtype == v.dtype == torch.float32
    assert torch.equal(k, a.float()) and torch.equal(v, (a * 2).float())


@pytest.mark.slow
def test_decoding_under_bf16_autocast_hands_shared_prefix_attention_a_float32_own_cache(
    kk_data, tiny_model, tiny_tokenizer, monkeypatch
):
    """Under bf16 autocast the value projections come out bf16; the rows' own cache stores them as
    float32 once, so the attention (which computes in float32) converts nothing per step."""
    from transformers import AttentionInterface

    from lucidrl.workers.rollout import decode, shared_prefix

    seen = []

    def spy(module, query, key, value, *args, **kwargs):
        seen.append((key.dtype, value.dtype))
        return shared_prefix.shared_prefix_attention(module, query, key, value, *args, **kwargs)

    AttentionInterface.register(shared_prefix.SHARED_PREFIX_ATTENTION, spy)
    try:
        model = load_model(tiny_model["path"]).eval()
        batch = _prompts(kk_data, tiny_tokenizer, k=2)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            decode.sample_group(
                model, batch["prompts"], batch["prompt_mask"], n=3, max_new_tokens=6,
                eos_ids=[tiny_tokenizer.eos_token_id], pad_id=0,
            )  # fmt: skip
    finally:
        AttentionInterface.register(
            shared_prefix.SHARED_PREFIX_ATTENTION, shared_prefix.shared_prefix_attention
        )
    assert seen and set(seen) == {(torch.float32, torch.float32)}


def test_sample_tokens_follows_the_probabilities_and_never_draws_a_zero():
    from lucidrl.workers.rollout.sampling import sample_tokens

    torch.manual_seed(0)
    probs = torch.tensor([[0.5, 0.3, 0.2, 0.0], [0.0, 0.0, 0.0, 1.0], [0.0, 0.25, 0.0, 0.75]])
    draws = sample_tokens(probs.repeat(40_000, 1)).view(40_000, 3)
    freq = torch.stack([torch.bincount(draws[:, i], minlength=4).float() / 40_000 for i in range(3)])
    assert (freq - probs).abs().max() < 0.01
    assert (freq[probs == 0] == 0).all()


def _decode_both_ways(model, batch, **kw):
    from lucidrl.workers.rollout.decode import _decode

    out = []
    for shared in (True, False):
        torch.manual_seed(7)
        out.append(_decode(model, batch["prompts"], batch["prompt_mask"], shared=shared, **kw))
    return out


@pytest.mark.slow
def test_shared_prefix_attention_decodes_what_a_copied_prompt_cache_decodes(
    kk_data, tiny_model, tiny_tokenizer
):
    """Left-padded prompts of different lengths, compaction as rows end, GQA: same tokens, same log-probs."""
    model = load_model(tiny_model["path"]).eval()
    assert model.config.num_attention_heads != model.config.num_key_value_heads  # GQA is exercised
    batch = _prompts(kk_data, tiny_tokenizer, k=4)
    assert (batch["prompt_mask"] == 0).any()  # some left padding
    kw = dict(n=5, max_new_tokens=24, eos_ids=[tiny_tokenizer.eos_token_id, 5, 9], pad_id=0,
              do_sample=True, temperature=0.9, top_k=-1, top_p=1.0)  # fmt: skip
    (r_shared, lp_shared), (r_plain, lp_plain) = _decode_both_ways(model, batch, **kw)
    assert torch.equal(r_shared, r_plain)
    assert (r_shared == 0).any()  # some rows ended early (compaction ran)
    assert (lp_shared - lp_plain).abs().max() < 1e-5


@pytest.mark.slow
def test_decoding_falls_back_when_the_attention_ignores_the_shared_prefix(
    kk_data, tiny_model, tiny_tokenizer, monkeypatch
):
    """A model whose attention does not go through transformers' interface decodes the plain way, with a warning."""
    import pytest
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.models.qwen2 import modeling_qwen2

    from lucidrl.workers.common import model_support
    from lucidrl.workers.rollout import decode

    model = load_model(tiny_model["path"]).eval()
    batch = _prompts(kk_data, tiny_tokenizer, k=2)
    kw = dict(n=3, max_new_tokens=12, eos_ids=[tiny_tokenizer.eos_token_id], pad_id=0, do_sample=False)
    expected = HFRollout(model, tiny_tokenizer, decode_loop="transformers").generate(
        batch, SamplingParams(**{k: v for k, v in kw.items() if k in ("n", "max_new_tokens", "do_sample")})
    )
    monkeypatch.setattr(
        modeling_qwen2.ALL_ATTENTION_FUNCTIONS, "get_interface", lambda *a: sdpa_attention_forward
    )
    monkeypatch.setattr(model_support, "_NO_SHARED_PREFIX", set())
    with pytest.warns(UserWarning, match="copy of the prompt cache per sample"):
        resp, _ = decode.sample_group(model, batch["prompts"], batch["prompt_mask"], **kw)
    assert torch.equal(resp, expected["responses"][:, : resp.shape[1]])
    assert type(model) in model_support._NO_SHARED_PREFIX  # decided once per model class


def test_sample_tokens_at_the_top_of_the_cdf_never_lands_on_a_filtered_token(monkeypatch):
    from lucidrl.workers.rollout import sampling

    probs = torch.tensor([[0.2, 0.8, 0.0, 0.0]])  # the last two filtered out (top-k / top-p)
    monkeypatch.setattr(torch, "rand", lambda *a, **k: torch.ones(*a[0], dtype=k.get("dtype")))
    assert sampling.sample_tokens(probs).tolist() == [1]


def test_shared_prefix_scores_stay_float32_under_autocast():
    """Under bf16 autocast (model.compute_dtype) the score matmuls would run in bf16 again (~1e-2 off);
    the attention keeps them float32: within float32 rounding of a float64 softmax attention."""
    import types

    from lucidrl.workers.rollout.shared_prefix import SharedPrefix, shared_prefix_attention

    torch.manual_seed(0)
    bs, n, heads, kv_heads, d, P, t = 2, 3, 4, 2, 16, 7, 5
    keys, values = torch.randn(bs, kv_heads, P, d), torch.randn(bs, kv_heads, P, d)
    mask = torch.ones(bs, P, dtype=torch.bool)
    mask[1, :2] = False  # left padding
    prefix = SharedPrefix(keys.transpose(-1, -2).contiguous(), [], mask, n, torch.arange(bs * n))
    prefix.keys_t, prefix.values = [prefix.keys_t], [values]
    q, k_own, v_own = (
        torch.randn(bs * n, heads, 1, d),
        torch.randn(bs * n, kv_heads, t, d),
        torch.randn(bs * n, kv_heads, t, d),
    )
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, _ = shared_prefix_attention(
            types.SimpleNamespace(layer_idx=0), q, k_own, v_own, None, shared_prefix=prefix
        )
    # reference: each row's softmax over its prompt's real positions and its own tokens, in float64
    g = heads // kv_heads
    rows = torch.arange(bs * n)
    k_all = torch.cat([keys.repeat_interleave(n, 0), k_own], 2).double().repeat_interleave(g, 1)
    v_all = torch.cat([values.repeat_interleave(n, 0), v_own], 2).double().repeat_interleave(g, 1)
    keep = torch.cat([mask.repeat_interleave(n, 0), torch.ones(bs * n, t, dtype=torch.bool)], 1)
    scores = (q.double() @ k_all.transpose(-1, -2)) * d**-0.5
    scores = scores.masked_fill(~keep[rows][:, None, None, :], float("-inf"))
    expected = (scores.softmax(-1) @ v_all)[:, :, 0, :]
    assert out.dtype == torch.float32 and out.shape == (bs * n, 1, heads, d)
    assert (out[:, 0].double() - expected).abs().max() < 1e-5
