"""lucidrl's decode loop and forward passes on other HuggingFace architectures than the tiny Qwen2.

Every check compares against transformers itself, on tiny randomly initialised models built from
their config classes (no hub): greedy decoding (one sample and n samples over a shared prefix) must
give `model.generate`'s tokens, the log-probs recorded while sampling must equal the training
forward's, and the shared-prompt forward (`actor.share_prompt_forward`) must equal the full forward
in value and gradient. The architectures stand for what users bring: Llama's and Qwen3's attention
(q/k norms), Mistral's sliding window (decoded without the shared prefix when it is narrower than the
sequence, over it when wider), Llama 4's chunked attention and GPT-OSS's sinks (decoded plainly), Gemma 2's
sliding layers and soft-capped logits, Phi-3's fused projections, GPT-2's absolute positions and
Conv1D layers, GPT-NeoX's partial rotary and parallel residual, Granite's scaled logits and a
Qwen3 mixture of experts. And `lucidrl train` end to end on a Llama folder with a critic (PPO) and
on a GPT-2 folder with LoRA, the tiny model's tokenizer beside them, exported as HF models.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import transformers as T

from lucidrl.batch import Batch
from lucidrl.cli import main
from lucidrl.workers.common import model_support
from lucidrl.workers.common.model_support import _can_prefill_shared_prompt
from lucidrl.workers.rollout import decode
from lucidrl.workers.rollout.decode import MIN_COMMON_PREFIX, sample_group
from lucidrl.workers.rollout.responses import response_mask_from_ids
from lucidrl.workers.training.forward import response_log_probs

V, PAD, EOS = 256, 0, 1
COMMON = dict(
    vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=256, pad_token_id=PAD, eos_token_id=EOS, bos_token_id=2,
)  # fmt: skip


def _configs():
    yield "llama", T.LlamaConfig(**COMMON), T.LlamaForCausalLM
    yield "qwen3", T.Qwen3Config(**COMMON, head_dim=8), T.Qwen3ForCausalLM
    # a window shorter than prompt + response, so that it matters
    yield "mistral-sliding", T.MistralConfig(**COMMON, sliding_window=4), T.MistralForCausalLM
    yield "gemma2", T.Gemma2Config(**COMMON, head_dim=8, sliding_window=4), T.Gemma2ForCausalLM
    yield "phi3", T.Phi3Config(**COMMON), T.Phi3ForCausalLM
    gpt = dict(vocab_size=V, pad_token_id=PAD, eos_token_id=EOS, bos_token_id=2)
    yield "gpt2", T.GPT2Config(**gpt, n_embd=32, n_layer=2, n_head=4, n_positions=256), T.GPT2LMHeadModel
    yield (
        "gpt_neox",
        T.GPTNeoXConfig(
            **gpt, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4
        ),
        T.GPTNeoXForCausalLM,
    )
    yield "granite", T.GraniteConfig(**COMMON, logits_scaling=4.0), T.GraniteForCausalLM
    # a window wider than prompt + response restricts nothing: decoded over the shared prefix
    yield "mistral-wide", T.MistralConfig(**COMMON, sliding_window=4096), T.MistralForCausalLM
    # sharp attention (initializer_range 0.2), so that a mask or term left out shows: Llama 4's chunked
    # attention (the shared prefix ignored the chunks: log-probs 7 nats off) and GPT-OSS's attention
    # sinks on all-full layers (dropped: 1.2 nats off), both now decoded the plain way
    sharp = dict(COMMON, initializer_range=0.2, head_dim=8, num_local_experts=2, num_experts_per_tok=1)
    yield (
        "llama4-chunked",
        T.Llama4TextConfig(
            **sharp,
            intermediate_size_mlp=64,
            attention_chunk_size=4,
            no_rope_layers=[1, 1],
            attn_temperature_tuning=False,
        ),
        T.Llama4ForCausalLM,
    )
    yield "gpt_oss-sinks", T.GptOssConfig(**sharp, layer_types=["full_attention"] * 2), T.GptOssForCausalLM
    yield (
        "qwen3_moe",
        T.Qwen3MoeConfig(
            **COMMON, head_dim=8, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16
        ),
        T.Qwen3MoeForCausalLM,
    )


CONFIGS = {name: (config, cls) for name, config, cls in _configs()}
N, R = 3, 10


def _model_and_prompts(name: str, common: int = 0):
    """Three left-padded prompts; with `common`, all three start with the same `common` tokens (a
    system prompt: decoding then prefills it once, decode._prefill)."""
    config, cls = CONFIGS[name]
    torch.manual_seed(0)
    model = cls(config).eval()
    shared = torch.randint(3, V, (common,))
    lengths = [common + k for k in (5, 9, 7)]  # left-padded to the longest
    width = max(lengths)
    prompts = torch.full((len(lengths), width), PAD, dtype=torch.long)
    mask = torch.zeros((len(lengths), width), dtype=torch.long)
    for i, length in enumerate(lengths):
        prompts[i, width - length :] = torch.cat([shared, torch.randint(3, V, (length - common,))])
        mask[i, width - length :] = 1
    return model, prompts, mask


# prompts without and with a shared system prompt long enough to be prefilled once
COMMON_PREFIXES = [0, MIN_COMMON_PREFIX + 4]


def _decode(model, prompts, mask, n: int, **kwargs):
    return sample_group(model, prompts, mask, n=n, max_new_tokens=R, eos_ids=[EOS], pad_id=PAD, **kwargs)


@pytest.mark.slow
@pytest.mark.parametrize("common", COMMON_PREFIXES)
@pytest.mark.parametrize("name", list(CONFIGS))
def test_greedy_decoding_gives_transformers_generate_tokens(name, common):
    model, prompts, mask = _model_and_prompts(name, common)
    expected = model.generate(
        input_ids=prompts, attention_mask=mask, max_new_tokens=R, do_sample=False, eos_token_id=EOS,
        pad_token_id=PAD,
    )[:, prompts.shape[1] :]  # fmt: skip
    model_support._NO_SHARED_PREFIX.discard(type(model))  # each case learns GPT-OSS's refusal anew
    # the shared system prompt is prefilled once (a forward of one row) for models whose every layer
    # attends to all earlier tokens; sliding-window and chunked ones prefill every prompt whole
    once = bool(common) and _can_prefill_shared_prompt(model, prompts.shape[1] + R)
    assert once or not common or name in ("mistral-sliding", "gemma2", "llama4-chunked", "gpt_oss-sinks")
    shapes = []
    hook = model.register_forward_pre_hook(
        lambda m, args, kwargs: shapes.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True
    )
    one, _ = _decode(model, prompts, mask, 1, do_sample=False)
    hook.remove()
    assert shapes[0] == ((1, common) if once else tuple(prompts.shape))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        group, _ = _decode(model, prompts, mask, N, do_sample=False)
    assert torch.equal(one, expected[:, : one.shape[1]])
    assert torch.equal(group, expected.repeat_interleave(N, 0)[:, : group.shape[1]])
    # generate's columns past ours are padding after every row's eos: our loop did not stop early
    assert bool((expected[:, one.shape[1] :] == PAD).all()) and bool(
        (one == EOS).any(-1).all() or one.shape[1] == R
    )
    fallback = [str(w.message) for w in caught if "not the shared prefix" in str(w.message)]
    if name == "gpt_oss-sinks":  # its attention passes sinks: refused when met, said once, decoded plainly
        assert fallback and "s_aux" in fallback[0]
    else:  # sliding windows narrower than the sequence and chunked attention are known beforehand: no warning
        assert not fallback


@pytest.mark.parametrize("common", COMMON_PREFIXES)
@pytest.mark.parametrize("name", list(CONFIGS))
def test_sampling_log_probs_and_shared_prompt_forward_match_the_full_forward(name, common):
    model, prompts, mask = _model_and_prompts(name, common)
    torch.manual_seed(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # mistral-sliding's fallback warning: tested above
        responses, sampled = _decode(model, prompts, mask, N, do_sample=True, temperature=0.7)
    response_mask = response_mask_from_ids(responses, [EOS])
    batch = Batch(
        {
            "prompts": prompts.repeat_interleave(N, 0),
            "prompt_mask": mask.repeat_interleave(N, 0),
            "responses": responses,
            "response_mask": response_mask,
        },
        {"uid": [i // N for i in range(len(responses))]},
    )
    full, _ = response_log_probs(model, batch, temperature=0.7, with_entropy=False)
    torch.testing.assert_close(full * response_mask, sampled * response_mask, atol=1e-5, rtol=0)

    params = [p for p in model.parameters() if p.requires_grad]
    grads = []  # in eval mode: GPT-2's dropout would make the two forwards differ
    for share in (False, True):
        model.zero_grad()
        lp, _ = response_log_probs(model, batch, temperature=0.7, with_entropy=False, share_prompt=share)
        (lp * response_mask).sum().backward()
        grads.append([p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in params])
        if share:
            torch.testing.assert_close(lp * response_mask, full * response_mask, atol=1e-5, rtol=0)
    for g_full, g_shared in zip(*grads, strict=True):
        torch.testing.assert_close(g_shared, g_full, atol=1e-4, rtol=1e-4)


def _model_folder(tiny_model, tmp_path, name: str, config) -> str:
    """A HuggingFace folder of `config`'s architecture with the tiny model's tokenizer files."""
    import shutil
    from pathlib import Path

    from transformers import AutoModelForCausalLM

    from lucidrl.models import load_tokenizer

    tok = load_tokenizer(str(tiny_model["path"]))
    config.vocab_size = tiny_model["vocab_size"]
    config.pad_token_id, config.eos_token_id, config.bos_token_id = tok.pad_token_id, tok.eos_token_id, None
    folder = tmp_path / name
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    for f in Path(tiny_model["path"]).iterdir():
        if f.name.startswith("tokenizer") or f.name in ("chat_template.jinja", "special_tokens_map.json"):
            shutil.copy(f, folder / f.name)
    return str(folder)


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, extra",
    [
        ("llama", ["algorithm.adv_estimator=gae", "critic.optim.lr=1e-3"]),  # a critic of its own class
        ("gpt2", ["model.lora_rank=4"]),  # LoRA on Conv1D layers, merged into the exported model
    ],
)
def test_lucidrl_train_runs_other_architectures_end_to_end(name, extra, tmp_path, kk_data, tiny_model):
    from helpers import toy_train_args
    from safetensors.torch import load_file
    from transformers import AutoConfig
    from transformers import AutoModelForCausalLM as Auto

    config = {
        "llama": T.LlamaConfig(**{**COMMON, "max_position_embeddings": 1024}),
        "gpt2": T.GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=1024),
    }[name]
    folder = _model_folder(tiny_model, tmp_path, name, config)
    args = toy_train_args(tmp_path, kk_data, {"path": folder})
    common = ["data.train_batch_size=4", "rollout.n=4", "data.max_response_length=12",
              "actor.ppo_mini_batch_size=2", "actor.ppo_micro_batch_size=4", "trainer.total_training_steps=2"]  # fmt: skip
    assert main([*args, *common, *extra]) == 0
    final = tmp_path / "run" / "final"
    assert AutoConfig.from_pretrained(final).model_type == config.model_type
    exported = Auto.from_pretrained(final)  # a plain HF model (LoRA merged), loadable as such
    start = load_file(f"{folder}/model.safetensors")
    after = {k: v for k, v in exported.state_dict().items() if k in start}
    assert max((after[k] - start[k]).abs().max().item() for k in after) > 0  # training moved weights


def test_a_refused_shared_prefix_leaves_the_sampling_rng_as_the_plain_path_would():
    """The shared attempt samples its first token before a layer can refuse; the plain rerun then drew
    from an advanced RNG, so the first prompt a process decoded differed from the same seeded call later
    (rollout.deterministic broke for e.g. every model whose attention refuses at the first step)."""
    from lucidrl.workers.common import model_support

    _, prompts, mask = _model_and_prompts("llama")
    torch.manual_seed(0)  # soft-capped attention on all-full layers: refused by the attention itself
    config = T.Gemma2Config(
        **COMMON, head_dim=8, layer_types=["full_attention"] * 2, attn_logit_softcapping=5.0
    )
    model = T.Gemma2ForCausalLM(config).eval()
    model_support._NO_SHARED_PREFIX.discard(type(model))
    outs = []
    for _ in range(2):
        torch.manual_seed(3)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            outs.append(_decode(model, prompts, mask, N, do_sample=True)[0])
        assert type(model) in model_support._NO_SHARED_PREFIX  # the first call tried, and fell back
    # the second went the plain way at once: the same samples
    assert torch.equal(outs[0], outs[1])


def test_models_whose_layers_are_not_attention_are_named_with_the_other_loop():
    """Mamba and hybrid models crashed inside transformers (IndexError in the cache) at the first generation."""
    from lucidrl.workers.common.model_support import DecodeLoopUnsupported, check_decode_loop_supported

    torch.manual_seed(0)
    mamba = T.MambaForCausalLM(T.MambaConfig(vocab_size=V, hidden_size=32, num_hidden_layers=2, state_size=4))
    with pytest.raises(DecodeLoopUnsupported, match="set rollout.decode_loop=transformers"):
        check_decode_loop_supported(mamba)
    check_decode_loop_supported(CONFIGS["llama"][1](CONFIGS["llama"][0]))  # attention only: fine


def _state_space_models():
    torch.manual_seed(0)
    yield T.MambaForCausalLM(T.MambaConfig(vocab_size=V, hidden_size=32, num_hidden_layers=2, state_size=4))
    # a hybrid whose config lists no layer types: attention and Mamba in every layer
    falcon = T.FalconH1Config(
        vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, mamba_d_state=4, mamba_n_heads=4, mamba_d_ssm=64, mamba_d_head=16, mamba_n_groups=1,
        mamba_chunk_size=4,
    )  # fmt: skip
    yield T.FalconH1ForCausalLM(falcon)


@pytest.mark.parametrize("model", list(_state_space_models()), ids=lambda m: type(m).__name__)
def test_state_space_models_are_refused_by_the_shared_prompt_forward_naming_the_key(model):
    """The actor's default log-prob pass (one prompt forward into a KV cache per group) crashed inside
    transformers with an IndexError for Mamba and Falcon-H1; the decode loop refused them already,
    and Falcon-H1 (no layer_types in its config) got past that check too."""
    from lucidrl.batch import Batch
    from lucidrl.config.schema import ActorConfig
    from lucidrl.workers.common.model_support import DecodeLoopUnsupported, check_decode_loop_supported
    from lucidrl.workers.training.actor import ActorWorker
    from lucidrl.workers.training.forward import SharedPromptUnsupported

    with pytest.raises(DecodeLoopUnsupported, match="set rollout.decode_loop=transformers"):
        check_decode_loop_supported(model)
    with pytest.raises(SharedPromptUnsupported, match="set actor.share_prompt_forward=false"):
        ActorWorker(model, ActorConfig(), temperature=1.0, samples_per_prompt=2)
    actor = ActorWorker(model, ActorConfig(share_prompt_forward=False), temperature=1.0, samples_per_prompt=2)
    ids = torch.randint(3, V, (4, 10))
    batch = Batch(
        tensors={"prompts": ids[:, :4], "prompt_mask": torch.ones(4, 4, dtype=torch.long), "responses": ids[:, 4:],
                 "response_mask": torch.ones(4, 6, dtype=torch.long)},
        non_tensors={"uid": ["a", "a", "b", "b"]},
    )  # fmt: skip
    out = actor.compute_log_prob(batch)
    assert out["old_log_probs"].shape == (4, 6) and torch.isfinite(out["old_log_probs"]).all()


def _training_batch(prompts: torch.Tensor, mask: torch.Tensor) -> Batch:
    """N random full-length responses per prompt, as the update's forwards get them."""
    torch.manual_seed(1)
    responses = torch.randint(3, V, (len(prompts) * N, R))
    return Batch(
        {
            "prompts": prompts.repeat_interleave(N, 0),
            "prompt_mask": mask.repeat_interleave(N, 0),
            "responses": responses,
            "response_mask": torch.ones_like(responses),
        },
        {"uid": [i // N for i in range(len(responses))]},
    )


def _grads(params: list[torch.Tensor]) -> list[torch.Tensor]:
    """Each parameter's gradient (zeros where it got none)."""
    return [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in params]


@pytest.mark.parametrize("name", list(CONFIGS))
def test_training_forwards_give_the_same_numbers_with_masked_gqa(name, monkeypatch):
    """compute_context turns on masked grouped-query attention on the CPU (precision.masked_gqa): the
    same log-probs and gradients as transformers' repeat_kv path, on every architecture. (The greedy
    decoding test above already runs the prefill with it, against `model.generate` without it.)"""
    from lucidrl.models.precision import FORCE_GQA, compute_context

    model, prompts, mask = _model_and_prompts(name)
    batch = _training_batch(prompts, mask)
    params = [p for p in model.parameters() if p.requires_grad]
    runs = []
    for switch in (None, "0"):  # lucidrl's default, then the user's value 0 (transformers copies the heads)
        if switch is None:
            monkeypatch.delenv(FORCE_GQA, raising=False)
        else:
            monkeypatch.setenv(FORCE_GQA, switch)
        for share in (False, True):
            model.zero_grad()
            with compute_context(model, None):
                lp, _ = response_log_probs(
                    model, batch, temperature=1.0, with_entropy=False, share_prompt=share
                )
            lp.sum().backward()
            runs.append((lp.detach(), _grads(params)))
    for (lp, grads), (lp_copied, grads_copied) in zip(runs[:2], runs[2:], strict=True):
        torch.testing.assert_close(lp, lp_copied, atol=1e-5, rtol=0)
        for g, g_copied in zip(grads, grads_copied, strict=True):
            torch.testing.assert_close(g, g_copied, atol=1e-5, rtol=1e-4)


def _inkling_position_bias():
    """Inkling's attention adds a position bias computed by a Linear layer: bf16 under autocast, and
    handed to the attention function beside the float32 queries (precision.float32_attention)."""
    import transformers as T

    config = T.InklingTextConfig(
        vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=8, intermediate_size=64, n_routed_experts=4, num_local_experts=4,
        moe_intermediate_size=16, num_experts_per_tok=2, pad_token_id=PAD, eos_token_id=EOS,
    )  # fmt: skip
    return config, T.InklingForCausalLM


@pytest.mark.slow
@pytest.mark.parametrize("name", [*CONFIGS, "inkling-position-bias"])
def test_bf16_training_forwards_run_with_attention_in_float32_and_in_bf16(name, monkeypatch):
    """Under bf16 compute on the CPU (precision.float32_attention) every architecture's forward and
    backward run with the attention in float32 and in bfloat16, finite and as close as bf16 compute
    allows (before the position bias was converted too, Inkling's attention raised with it on)."""
    from lucidrl.models.precision import FLOAT32_ATTENTION, compute_context

    if name == "inkling-position-bias":
        monkeypatch.setitem(CONFIGS, name, _inkling_position_bias())
    model, prompts, mask = _model_and_prompts(name)
    model.train()
    batch = _training_batch(prompts, mask)
    params = [p for p in model.parameters() if p.requires_grad]
    runs = []
    for switch in ("1", "0"):
        monkeypatch.setenv(FLOAT32_ATTENTION, switch)
        model.zero_grad()
        with compute_context(model, torch.bfloat16):
            lp, _ = response_log_probs(model, batch, temperature=1.0, with_entropy=False, share_prompt=False)
        lp.sum().backward()
        grads = _grads(params)
        assert torch.isfinite(lp).all() and all(torch.isfinite(g).all() for g in grads), switch
        runs.append((lp.detach(), torch.cat([g.flatten() for g in grads])))
    (lp32, g32), (lp16, g16) = runs
    model.zero_grad()
    with compute_context(model, None):  # float32 compute: what both approximate
        lp_ref, _ = response_log_probs(model, batch, temperature=1.0, with_entropy=False, share_prompt=False)
    lp_ref.sum().backward()
    g_ref = torch.cat([g.flatten() for g in _grads(params)])
    err32, err16 = (lp32 - lp_ref.detach()).abs().mean(), (lp16 - lp_ref.detach()).abs().mean()
    assert err32 < 0.05 and err32 <= 2 * err16 + 1e-3, (err32, err16)
    # gradients about as far from float32 compute's as with the attention in bf16 (GPT-2's are 45%
    # off either way on this batch), with 0.1 to spare: a bf16 rounding can flip a mixture-of-experts
    # router's choice (llama4's: 8% off with the attention in float32, 1.6% in bf16)
    gerr32, gerr16 = (g32 - g_ref).norm() / g_ref.norm(), (g16 - g_ref).norm() / g_ref.norm()
    assert gerr32 <= 2 * gerr16 + 0.1, (gerr32, gerr16)


def _refused_cases():
    """Models where prefilling a shared prompt once would change the tokens, found by a review: each
    must decode as the plain prefill does."""
    hd = 8
    rope = {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0] * (hd // 2),
            "long_factor": [4.0] * (hd // 2), "original_max_position_embeddings": 24}  # fmt: skip
    sharp = dict(COMMON, initializer_range=0.2)
    # Phi-3 long-RoPE: the factors switch once the forward's longest position passes 24 (4.4 in the
    # last logits when the shared 20 tokens ran alone)
    yield (
        "phi3-longrope",
        lambda: T.Phi3ForCausalLM(
            T.Phi3Config(**sharp, original_max_position_embeddings=24, rope_parameters=rope)
        ),
    )
    # Gemma 3 as its multimodal checkpoints load: the sliding windows sit in text_config
    text = dict(sharp, head_dim=8, sliding_window=4, layer_types=["sliding_attention", "full_attention"])
    vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                  image_size=28, patch_size=14)  # fmt: skip
    yield (
        "gemma3-multimodal",
        lambda: T.Gemma3ForConditionalGeneration(
            T.Gemma3Config(
                text_config=text, vision_config=vision, mm_tokens_per_image=4, image_token_index=255
            )
        ),
    )

    # LoRA on a model with its own attention code (GPT-Neo's local attention counts columns): the
    # peft wrapper's class said nothing of it
    def neo_lora():
        from peft import LoraConfig, get_peft_model

        neo = T.GPTNeoConfig(
            vocab_size=V, hidden_size=32, num_layers=2, num_heads=4, attention_types=[[["global", "local"], 1]],
            window_size=12, max_position_embeddings=256, initializer_range=0.2, pad_token_id=PAD,
            eos_token_id=EOS, bos_token_id=2,
        )  # fmt: skip
        return get_peft_model(T.GPTNeoForCausalLM(neo), LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))

    yield "gpt_neo-lora", neo_lora


REFUSED = dict(_refused_cases())


@pytest.mark.parametrize("name", list(REFUSED))
def test_the_shared_prompt_is_prefilled_whole_where_splitting_it_would_change_the_tokens(name, monkeypatch):
    torch.manual_seed(0)
    model = REFUSED[name]().eval()
    _, prompts, mask = _model_and_prompts("llama", common=20)
    assert decode.common_prefix_length(prompts, mask) == 20
    assert not model_support._can_prefill_shared_prompt(model, prompts.shape[1] + R)
    shapes = []
    model.register_forward_pre_hook(
        lambda m, a, kw: shapes.append(tuple(kw["input_ids"].shape)), with_kwargs=True
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got, _ = _decode(model, prompts, mask, 1, do_sample=False)
        expected = model.generate(
            input_ids=prompts, attention_mask=mask, max_new_tokens=R, do_sample=False, eos_token_id=EOS,
            pad_token_id=PAD,
        )[:, prompts.shape[1] :]  # fmt: skip
    assert shapes[0] == tuple(prompts.shape)
    assert torch.equal(got, expected[:, : got.shape[1]])
