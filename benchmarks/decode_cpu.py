"""Generation on the CPU: each of lucidrl's decode-loop changes, measured in one run.

step_vs_trl.py's setting: the tiny Qwen2 (hidden 256, 4 layers, GQA 4/2 heads, built locally), 64
Knights & Knaves prompts with Logic-RL's system prompt (about 240 tokens), 8 samples each at T=1, up
to 128 new tokens. The variants are cumulative, each adds one change to the one above:

    transformers/64    transformers' generate, 64 samples per call (8 prompts x 8)
    lucidrl/64         lucidrl's loop as of the previous release: prompts prefilled once, reserved
                       KV cache, finished rows dropped, torch.multinomial, prompt cache copied per sample
    +one call          all 512 samples in one call (rollout.micro_batch_size=512, now the default)
    +inverse CDF       sampling by one uniform draw per row (decode.sample_tokens)
    +shared prefix     the prompt's cache held and attended to once per prompt, its scores scaled and
                       masked after the matmul (as of the previous release)
    +bias in matmul    the queries scaled before, the padding mask added by the matmul (baddbmm)
    +system prompt once  the tokens every prompt starts with (chat template and system prompt: 159 of
                       206-251 here) prefilled once, not once per prompt (decode._prefill) = lucidrl now

Printed: seconds for the 512 samples, generated tokens/s, the speed-up over lucidrl/64 and the share
of the decode roofline (step_vs_trl's measured fp32 matmul rate over 2 x parameters FLOPs per token, attention
ignored). Each variant first decodes a short warm-up batch; then `--repeats` timed runs (median),
the variants alternating within each repeat.

    .venv/bin/python benchmarks/decode_cpu.py [--prompts 64] [--repeats 1] [--only NAME,...]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

N_SAMPLES, MAX_NEW = 8, 128
VARIANTS = [
    "transformers/64",
    "lucidrl/64",
    "+one call",
    "+inverse CDF",
    "+shared prefix",
    "+bias in matmul",
    "+system prompt once",
]


def multinomial(probs: torch.Tensor) -> torch.Tensor:
    return torch.multinomial(probs, 1).squeeze(-1)


def masked_after_matmul(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """shared_prefix.shared_prefix_attention as of the previous release: the prompt part's scores scaled and
    masked after the matmul (two more passes over a (prompts, kv heads, n x group, P) tensor)."""
    prefix = kwargs["shared_prefix"]
    layer = module.layer_idx
    prefix.layers_called.add(layer)
    k_t, v_p = prefix.keys_t[layer], prefix.values[layer]
    bs, kv_heads, d, _ = k_t.shape
    rows, heads = query.shape[:2]
    g, n = heads // kv_heads, prefix.n
    scale = scaling if scaling is not None else d**-0.5
    q = query[:, :, 0, :].float()
    key, value = key.float(), value.float()
    q_all = q.new_zeros((bs * n, heads, d))
    q_all[prefix.slots] = q
    q_all = q_all.view(bs, n, kv_heads, g, d).transpose(1, 2).reshape(bs, kv_heads, n * g, d)
    s_p = torch.matmul(q_all, k_t) * scale
    s_p = s_p.masked_fill(~prefix.mask[:, None, None, :], float("-inf"))
    m_p = s_p.amax(-1, keepdim=True)
    e_p = torch.exp(s_p - m_p)
    l_p, o_p = e_p.sum(-1, keepdim=True), torch.matmul(e_p, v_p)

    def per_row(x):
        x = x.view(bs, kv_heads, n, g, -1).transpose(1, 2).reshape(bs * n, heads, -1)
        return x[prefix.slots]

    o_p, m_p, l_p = per_row(o_p), per_row(m_p), per_row(l_p)
    s_r = torch.matmul(q.reshape(rows, kv_heads, g, d), key.transpose(-1, -2)) * scale
    m_r = s_r.amax(-1, keepdim=True)
    e_r = torch.exp(s_r - m_r)
    l_r = e_r.sum(-1, keepdim=True).reshape(rows, heads, 1)
    o_r = torch.matmul(e_r, value).reshape(rows, heads, d)
    m_r = m_r.reshape(rows, heads, 1)
    m = torch.maximum(m_p, m_r)
    a_p, a_r = torch.exp(m_p - m), torch.exp(m_r - m)
    out = (o_p * a_p + o_r * a_r) / (l_p * a_p + l_r * a_r)
    return out[:, None].to(query.dtype), None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--only", default=",".join(VARIANTS))
    args = p.parse_args()

    import step_vs_trl
    from step_vs_trl import matmul_gflops, prepare  # the same model, prompts and matmul rate

    from lucidrl.data.dataset import collate, load_prompts
    from lucidrl.models import load_model, load_tokenizer
    from lucidrl.workers.rollout import decode, shared_prefix
    from lucidrl.workers.rollout.engine import SamplingParams
    from lucidrl.workers.rollout.hf_engine import HFRollout

    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        step_vs_trl.N_PROMPTS = args.prompts
        prep = prepare(Path(tmp))
        tok = load_tokenizer(prep["model"])
        model = load_model(prep["model"]).eval()
        samples, _ = load_prompts([prep["train"]], tok, max_prompt_length=4096)
    batch = collate(samples, tok.pad_token_id)
    warm = collate(samples[:2], tok.pad_token_id)
    params = SamplingParams(n=N_SAMPLES, temperature=1.0, max_new_tokens=MAX_NEW)
    rows = args.prompts * N_SAMPLES
    roofline = matmul_gflops() * 1e9 / (2 * prep["params"])
    print(
        f"{args.prompts} prompts x {N_SAMPLES} samples, <= {MAX_NEW} new tokens, tiny Qwen2 "
        f"{prep['params'] / 1e6:.1f}M params, mean prompt {batch['prompt_mask'].sum(1).float().mean():.0f} "
        f"tokens; decode roofline {roofline:.0f} tok/s",
        flush=True,
    )
    from transformers import AttentionInterface

    shared_ok, sample_tokens, min_common = (
        decode._can_share_prefix,
        decode.sample_tokens,
        decode.MIN_COMMON_PREFIX,
    )

    def attention(fn) -> None:
        AttentionInterface.register(shared_prefix.SHARED_PREFIX_ATTENTION, fn)

    names = args.only.split(",")
    for name in names:
        if name not in VARIANTS:
            raise SystemExit(f"--only: unknown variant {name!r}; choose from {', '.join(VARIANTS)}")

    def run(name: str, sampling: SamplingParams, which: dict) -> tuple[float, int]:
        level = VARIANTS.index(name)
        loop = "transformers" if level == 0 else "lucidrl"
        rollout = HFRollout(model, tok, micro_batch_size=64 if level <= 1 else rows, decode_loop=loop)
        decode.sample_tokens = sample_tokens if level >= 3 else multinomial  # type: ignore[assignment]
        decode._can_share_prefix = shared_ok if level >= 4 else (lambda m, span: False)  # type: ignore[assignment]
        attention(shared_prefix.shared_prefix_attention if level >= 5 else masked_after_matmul)
        decode.MIN_COMMON_PREFIX = min_common if level >= 6 else 10**9
        try:
            start = time.perf_counter()
            out = rollout.generate(which, sampling)
            return time.perf_counter() - start, int(out["response_mask"].sum())
        finally:
            decode._can_share_prefix, decode.sample_tokens = shared_ok, sample_tokens
            decode.MIN_COMMON_PREFIX = min_common
            attention(shared_prefix.shared_prefix_attention)

    for name in names:  # warm-up
        run(name, SamplingParams(n=N_SAMPLES, max_new_tokens=8), warm)
    timed: dict[str, list[tuple[float, int]]] = {name: [] for name in names}
    for rep in range(args.repeats):  # alternating, so the machine's drift falls on every variant alike
        for name in names:
            timed[name].append(run(name, params, batch))
            s, t = timed[name][-1]
            print(f"  {name} (repeat {rep}): {s:.2f} s, {t / s:.0f} tok/s", flush=True)
    results: dict[str, tuple[float, float]] = {
        name: (statistics.median(s for s, _ in runs), statistics.median(t / s for s, t in runs))
        for name, runs in timed.items()
    }
    base = results.get("lucidrl/64", next(iter(results.values())))[1]
    print(f"\n{'variant':20s} {f's/{rows}':>8s} {'tok/s':>8s} {'vs lucidrl/64':>14s} {'of roofline':>12s}")
    for name, (s, tps) in results.items():
        print(f"{name:20s} {s:8.2f} {tps:8.0f} {tps / base:14.2f} {tps / roofline:12.2f}")


if __name__ == "__main__":
    main()
