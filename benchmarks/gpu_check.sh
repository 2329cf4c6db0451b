#!/usr/bin/env bash
# The GPU checks of issue 5 that one lent GPU can run, as one command (the device tool's `run`):
#
#   bash benchmarks/gpu_check.sh            # on the GPU machine, about 6 minutes; logs in $OUT
#   DEVICE=cpu SMALL=1 bash benchmarks/gpu_check.sh   # the same steps on a CPU, as a smoke test
#
# 1. `lucidrl doctor` (what the machine has);
# 2. three GRPO steps of the tiny Qwen2 (hidden 256, 4 layers) on K&K prompts with trainer.device=cuda,
#    once in float32 and once with model.compute_dtype=bfloat16: every batch goes to the GPU and back,
#    decoding, log-probs and the update run there; prints step time and rollout/logprob_diff_max;
# 3. benchmarks/mixed_precision.py --device cuda (float32 vs bf16 compute: decode, log-prob and update
#    time, GPU peak memory, log-prob agreement);
# 4. benchmarks/gpu_rollout.py (lucidrl's decode loop against transformers' generate); then, in a step
#    of its own with a longer limit, lucidrl's vLLM engine where vllm imports (the lent machines' image
#    has none so far).
#
# Not covered, and why: FSDP2/NCCL across ranks needs two GPUs (the lent machine has one); vLLM is not in
# the machine's image and its wheels exceed what a call may carry (64 MiB).
#
# The lent machine's python3 has torch, transformers, tokenizers, safetensors, pyarrow, pyyaml and rich;
# lucidrl runs from the working tree (PYTHONPATH), nothing is installed.
set -uo pipefail
DEVICE=${DEVICE:-cuda}
OUT=${OUT:-/tmp/gpu_check}
PY=${PY:-python3}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
work=$(mktemp -d)
if [ -n "${SMALL:-}" ]; then size=(--hidden 64 --layers 2); prompts=4; new=16; micro=32; else size=(--hidden 256 --layers 4); prompts=64; new=128; micro=64; fi
status=0

step() {  # name, command...: run it (4 minutes at most), keep its log, note a failure and go on
    local name=$1; shift
    echo "== $name: $*"
    timeout "${STEP_TIMEOUT:-240}" "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    if [ $rc -ne 0 ]; then
        echo "   FAILED (exit $rc); last lines:"; tail -20 "$OUT/$name.log"; status=1; return 1
    fi
    tail -"${TAIL:-12}" "$OUT/$name.log"
}

step doctor "$PY" -m lucidrl doctor --skip compile,distributed,ray
# the training runs' model and prompts (the benchmarks below build their own)
TAIL=1 step model "$PY" -m lucidrl model tiny --out "$work/model" "${size[@]}" &&
    TAIL=1 step data "$PY" -m lucidrl data kk --out "$work/data" --people 2-3 --train $((prompts * 4)) --val 8
ready=$?
cat >"$work/reward.py" <<'EOF'
def compute_score(data_source, solution_str, ground_truth, extra_info):
    text = solution_str[len("<think>"):]
    return {"score": text.count("e") / max(len(text), 1), "acc": float("e" in text)}
EOF
for precision in float32 bfloat16; do
    [ $ready = 0 ] || break
    extra=()
    [ "$precision" = bfloat16 ] && extra=(model.compute_dtype=bfloat16)
    TAIL=3 step "train_$precision" "$PY" -m lucidrl train "model.path=$work/model" "data.train_files=[$work/data/train.parquet]" \
        "data.val_files=[]" "reward.custom_function.path=$work/reward.py" "trainer.run_dir=$work/run_$precision" \
        trainer.device="$DEVICE" data.train_batch_size=$prompts rollout.n=8 data.max_response_length=$new \
        actor.ppo_mini_batch_size=$prompts actor.ppo_micro_batch_size=$micro trainer.total_training_steps=3 \
        trainer.val_before_train=false ${extra[@]+"${extra[@]}"} || continue
    "$PY" - "$work/run_$precision/metrics.jsonl" <<'EOF' || status=1
import json, sys
for r in map(json.loads, open(sys.argv[1])):
    if "timing_s/step" in r:
        print(f"   step {r['step']}: {r['timing_s/step']:.2f} s, logprob_diff_max {r.get('rollout/logprob_diff_max', float('nan')):.2e}, "
              f"grad_norm {r['actor/grad_norm']:.3f}, response length {r['response_length/mean']:.0f}")
EOF
done
TAIL=8 step mixed_precision "$PY" benchmarks/mixed_precision.py --device "$DEVICE" --prompts $((prompts / 4 > 0 ? prompts / 4 : 1))
TAIL=10 step gpu_rollout "$PY" benchmarks/gpu_rollout.py --device "$DEVICE" "${size[@]}" --prompts $prompts --max-new $new --engines hf
# vLLM in a step of its own (its cold start can take minutes; the table above must not wait on it),
# without CUDA graphs, where it imports
if "$PY" -c "import vllm" >/dev/null 2>&1; then
    STEP_TIMEOUT=${VLLM_TIMEOUT:-420} TAIL=12 step gpu_rollout_vllm "$PY" benchmarks/gpu_rollout.py --device "$DEVICE" \
        "${size[@]}" --prompts $prompts --max-new $new --engines vllm --enforce-eager --repeats 2
else
    echo "== gpu_rollout_vllm: skipped (vllm does not import here)"
fi
rm -rf "$work"
echo "== gpu_check: $([ $status = 0 ] && echo all ran || echo 'some failed (logs in '"$OUT"')')"
exit $status
