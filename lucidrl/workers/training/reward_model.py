"""The reward-model role: a sequence classifier with one output scores each prompt + response.

Its score is read at the response's last token, found from the masks, not from the pad token id:
HuggingFace's sequence classifiers take the last non-pad token, which is the wrong one when pad and
eos are the same id (a common setup) and the response ended with eos. When the reward model's
tokenizer is the policy's (same vocabulary and chat template), the rollout's token ids go in as they
are; otherwise each chat is rendered again with the reward model's own chat template, the response
appended as the assistant's message (verl's "switch chat template").
"""

from __future__ import annotations

import logging
import warnings

import torch
from transformers import AutoConfig, AutoModelForSequenceClassification
from transformers.utils import logging as hf_logging

from lucidrl.batch import Batch, last_loss_index, response_lengths
from lucidrl.models.loading import DTYPES, ModelLoadError, load_tokenizer

log = logging.getLogger(__name__)


def load_reward_model(path: str, dtype: str = "float32", trust_remote_code: bool = False) -> torch.nn.Module:
    """A trained one-output sequence classifier, in eval mode; ModelLoadError when `path` is not one."""
    key = "reward_model.model.path"
    try:
        config = AutoConfig.from_pretrained(path, local_files_only=True, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"{key}={path!r} cannot be read: {type(e).__name__}: {e}") from e
    classifier = any(
        a.endswith("ForSequenceClassification") for a in getattr(config, "architectures", None) or []
    )
    if classifier and config.num_labels != 1:  # (any other config carries transformers' default of 2)
        raise ModelLoadError(
            f"{key}={path!r} has num_labels={config.num_labels}: a reward model gives one score per sequence "
            "(num_labels=1)"
        )
    config.num_labels = 1
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the missing-head warning is checked below, as an error
            model, info = AutoModelForSequenceClassification.from_pretrained(
                path,
                config=config,
                dtype=DTYPES[dtype],
                local_files_only=True,
                trust_remote_code=trust_remote_code,
                output_loading_info=True,
            )
    except (OSError, ValueError, RuntimeError) as e:  # RuntimeError: a head of another size (num_labels)
        raise ModelLoadError(
            f"{key}={path!r} cannot be loaded as a sequence classifier: {type(e).__name__}: {e}"
        ) from e
    finally:
        hf_logging.set_verbosity(verbosity)
    if info["missing_keys"]:
        raise ModelLoadError(
            f"{key}={path!r} has no trained scoring head (missing: {', '.join(sorted(info['missing_keys']))}); "
            "a reward model is a *ForSequenceClassification checkpoint with num_labels=1, not a causal LM"
        )
    if not isinstance(getattr(model, "score", None), torch.nn.Module):
        raise ModelLoadError(
            f"{key}={path!r} is a {type(model).__name__}, which has no `score` head: lucidrl scores decoder "
            "reward models (LlamaForSequenceClassification, Qwen2ForSequenceClassification, ...)"
        )
    model.eval().requires_grad_(False)
    return model


def same_tokenizer(a, b) -> bool:
    """Whether token ids and chat rendering of `a` mean the same under `b`."""
    return a.get_vocab() == b.get_vocab() and getattr(a, "chat_template", None) == getattr(
        b, "chat_template", None
    )


class RewardModelWorker:
    """Scores a rollout batch: `rm_scores (bs, R)`, the score on each response's last token."""

    def __init__(self, model, tokenizer, policy_tokenizer, *, micro_batch_size: int, max_length: int | None):
        self.model = model
        self.tokenizer = tokenizer
        self.policy_tokenizer = policy_tokenizer
        self.micro_batch_size = micro_batch_size
        # no longer than the model's positions: past them its scores mean nothing
        positions = getattr(model.config, "max_position_embeddings", None)
        limits = [x for x in (max_length, positions) if x is not None]
        self.max_length = min(limits) if limits else None
        self.reuse_ids = same_tokenizer(tokenizer, policy_tokenizer)
        if not self.reuse_ids and not getattr(tokenizer, "chat_template", None):
            raise ModelLoadError(
                "the reward model's tokenizer differs from the policy's and has no chat template to render the "
                "conversations with; give reward_model.model.tokenizer_path a tokenizer with one (or the policy's)"
            )

    @classmethod
    def from_config(cls, rm, policy_tokenizer, device: str) -> RewardModelWorker:
        """rm: config.schema.RewardModelConfig."""
        m = rm.model
        model = load_reward_model(m.path, m.dtype, m.trust_remote_code).to(device)
        tokenizer = load_tokenizer(
            m.tokenizer_path or m.path, pad_token=None, config_key="reward_model.model.tokenizer_path"
        )
        return cls(
            model, tokenizer, policy_tokenizer, micro_batch_size=rm.micro_batch_size, max_length=rm.max_length
        )

    def _sequences(self, batch: Batch) -> list[list[int]]:
        """Each sample's token ids as the reward model reads them (no padding, not yet cut to max_length)."""
        lengths = response_lengths(batch).tolist()  # a multi-turn response's tool tokens too
        out = []
        for i, n in enumerate(lengths):
            if self.reuse_ids:
                prompt = batch["prompts"][i][batch["prompt_mask"][i].bool()].tolist()
                out.append(prompt + batch["responses"][i][: int(n)].tolist())
                continue
            response = self.policy_tokenizer.decode(
                batch["responses"][i][: int(n)].tolist(), skip_special_tokens=True
            )
            if "conversation" in batch:  # a multi-turn sample: the whole chat, tool messages included
                text = self.tokenizer.apply_chat_template(batch["conversation"][i], tokenize=False)
                out.append(self.tokenizer(text, add_special_tokens=False)["input_ids"])
                continue
            if "prompt_is_raw" in batch and batch["prompt_is_raw"][i]:
                # its text carries the policy's own chat markup: wrapped in the reward model's template as a
                # user message it would be scored as another conversation than the one the policy had
                raise ModelLoadError(
                    "the reward model's tokenizer or chat template differs from the policy's, and this prompt "
                    "was fed as raw text with the policy's own chat markup (data.prompt_format): it cannot be "
                    "rendered for the reward model. Give reward_model.model.tokenizer_path the policy's "
                    "tokenizer, or write the prompts as chat messages (data.prompt_format=chat)"
                )
            messages = [dict(m) for m in batch["raw_prompt"][i]]
            if messages and messages[-1]["role"] == "assistant":  # a pre-filled answer, continued
                messages[-1]["content"] = messages[-1]["content"] + response
            else:
                messages.append({"role": "assistant", "content": response})
            text = self.tokenizer.apply_chat_template(messages, tokenize=False)
            out.append(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        return out

    @torch.no_grad()
    def score_sequences(self, sequences: list[list[int]]) -> torch.Tensor:
        """The model's score after the last token of each sequence. (n,) float32."""
        device = next(self.model.parameters()).device
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        scores = []
        for start in range(0, len(sequences), self.micro_batch_size):
            chunk = sequences[start : start + self.micro_batch_size]
            width = max(len(s) for s in chunk)
            ids = torch.full((len(chunk), width), pad, dtype=torch.long)
            mask = torch.zeros((len(chunk), width), dtype=torch.long)
            for j, s in enumerate(chunk):  # right padding: position ids are plain 0..len-1
                ids[j, : len(s)] = torch.tensor(s, dtype=torch.long)
                mask[j, : len(s)] = 1
            hidden = self.model.base_model(
                input_ids=ids.to(device), attention_mask=mask.to(device)
            ).last_hidden_state
            last = torch.tensor([len(s) - 1 for s in chunk], device=device)
            picked = hidden[torch.arange(len(chunk), device=device), last]
            scores.append(self.model.score(picked)[:, 0].float().cpu())
        return torch.cat(scores)

    def compute_rm_score(self, batch: Batch) -> Batch:
        """`rm_scores (bs, R)`: zeros with each sample's score on its last response token; `rm_truncated
        (bs,)`: 1 for a sequence cut to max_length."""
        mask = batch["response_mask"]
        sequences = self._sequences(batch)
        limit = self.max_length
        truncated = torch.tensor([float(limit is not None and len(s) > limit) for s in sequences])
        if limit is not None:  # keep the end, where the score is read
            sequences = [s[-limit:] for s in sequences]
        values = self.score_sequences(sequences)
        bad = (~torch.isfinite(values)).nonzero().flatten().tolist()
        if bad:  # rule rewards are refused the same way (rewards/custom.py); never trained on
            from lucidrl.rewards.custom import RewardOutputError

            raise RewardOutputError(
                f"the reward model ({getattr(self.model.config, '_name_or_path', 'reward_model.model.path')}) scored "
                f"{len(bad)} of {len(values)} samples {values[bad[0]].item()} (non-finite; first: sample {bad[0]}); "
                "check its weights and reward_model.model.dtype (bfloat16 overflow), or score in float32"
            )
        rm = torch.zeros(mask.shape, dtype=torch.float32)
        rm[torch.arange(len(values)), last_loss_index(mask)] = values
        return Batch(tensors={"rm_scores": rm, "rm_truncated": truncated})
