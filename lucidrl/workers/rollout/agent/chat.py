"""How a tokenizer's chat template lays out a multi-turn conversation, found by probing it once.

A trajectory is built turn by turn: the prompt's tokens, then the model's tokens, then the tokens of
the tool or environment messages that answer it, which end with the next generation prompt. Those
last ones are the text the template writes after the model's turn when the messages are added,
cut off where the model's own tokens stop (its end-of-turn token). For ChatML that is:

    ...<|im_start|>assistant\\n{model's text}<|im_end|>   <- the model's tokens, its eos included
    \\n<|im_start|>tool\\n{result}<|im_end|>\\n<|im_start|>assistant\\n   <- `continuation`

so the whole sequence is what the template renders for the conversation (up to the final
end-of-turn's trailing newline), as long as the template renders earlier turns as the model wrote
them. Templates that rewrite history (dropping <think> blocks, trimming) and a model that ends its turn
with another token than the template's are counted (`off_template`): the sequence trained on is
then what the model saw turn by turn, which is what its log-probs were computed on.
"""

from __future__ import annotations

import json
from typing import Any

from lucidrl.workers.rollout.agent.parsers import ToolCallFormat
from lucidrl.workers.rollout.agent.tools import MultiTurnError

_SENTINEL = "LUCIDRL-PROBE-7f3a"
_PROBE_TOOL = {
    "type": "function",
    "function": {
        "name": "probe_tool",
        "description": "p",
        "parameters": {"type": "object", "properties": {}},
    },
}


class ChatFormat:
    """Renders a conversation with the tokenizer's template, and the text between turns."""

    def __init__(self, tokenizer: Any, fmt: ToolCallFormat, with_tools: bool, where: str = "model.path"):
        if not getattr(tokenizer, "chat_template", None):
            raise MultiTurnError(
                f"the tokenizer of {where} has no chat template; multi-turn rollouts render conversations with "
                "it: use a chat model, or set a template in its tokenizer_config.json"
            )
        self.tokenizer = tokenizer
        self.fmt = fmt
        self.renders_tools = self._probe_tools() if with_tools else True
        if with_tools and not self.renders_tools and fmt.instructions is None:
            raise MultiTurnError(
                f"the chat template of {where} does not render `tools`, and rollout.multi_turn.format="
                f"{fmt.name!r} has no instructions to describe them in a system prompt instead; give the parser "
                "an `instructions(schemas) -> str` attribute, or use format=hermes"
            )
        self.tool_role = self._probe_tool_role()
        self.end_of_turn = self._probe_end_of_turn(where)

    def _apply(self, messages: list[dict[str, Any]], **kwargs: Any) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)

    def _probe_tools(self) -> bool:
        plain = self._apply([{"role": "user", "content": "q"}], add_generation_prompt=True)
        try:
            with_tools = self._apply(
                [{"role": "user", "content": "q"}], tools=[_PROBE_TOOL], add_generation_prompt=True
            )
        except Exception:  # noqa: BLE001 - a template that raises on tools does not render them
            return False
        return with_tools != plain and "probe_tool" in with_tools

    def _probe_tool_role(self) -> str:
        chat = [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "a"},
            {"role": "tool", "name": "probe_tool", "content": _SENTINEL},
        ]
        try:
            text = self._apply(chat, add_generation_prompt=True)
        except Exception:  # noqa: BLE001 - e.g. "roles must alternate user/assistant"
            return "user"
        return "tool" if _SENTINEL in text else "user"

    def _probe_end_of_turn(self, where: str) -> str:
        chat = [{"role": "user", "content": "q"}, {"role": "assistant", "content": _SENTINEL}]
        text = self._apply(chat)
        if _SENTINEL not in text:
            raise MultiTurnError(
                f"the chat template of {where} does not render an assistant message's content"
            )
        return text.split(_SENTINEL, 1)[1]

    def opening(self, messages: list[dict[str, Any]], schemas: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The conversation to start from: `messages`, with the tools described in the system message
        when the template does not render `tools` itself."""
        messages = [dict(m) for m in messages]
        if not schemas or self.renders_tools:
            return messages
        text = self.fmt.instructions(schemas)  # type: ignore[misc]  # checked in __init__
        if messages and messages[0].get("role") == "system":
            messages[0]["content"] = f"{messages[0].get('content') or ''}\n\n{text}".strip()
        else:
            messages.insert(0, {"role": "system", "content": text})
        return messages

    def render(
        self, messages: list[dict[str, Any]], schemas: list[dict[str, Any]], *, generation: bool
    ) -> str:
        """The template's text; with `generation` it ends where the model writes next (the generation
        prompt, or inside a pre-filled assistant message)."""
        kwargs: dict[str, Any] = {}
        if schemas and self.renders_tools:
            kwargs["tools"] = schemas
        if generation:
            if messages and messages[-1].get("role") == "assistant":
                kwargs["continue_final_message"] = True
            else:
                kwargs["add_generation_prompt"] = True
        return self._apply(messages, **kwargs)

    def tool_message(self, name: str, content: str) -> dict[str, Any]:
        """A tool's answer as the template takes it (role "tool", or a user message for templates without)."""
        if self.tool_role == "tool":
            return {"role": "tool", "name": name, "content": content}
        return {"role": "user", "content": f"<tool_response>\n{content}\n</tool_response>"}

    def _glue(self, eos_text: str) -> str:
        """What the template writes after an assistant message's content that the model did not write:
        its end-of-turn marker less the end-of-turn token the model generated (`eos_text`)."""
        if eos_text and self.end_of_turn.startswith(eos_text):
            return self.end_of_turn[len(eos_text) :]
        return self.end_of_turn

    def continuation(
        self,
        history: list[dict[str, Any]],
        assistant: dict[str, Any],
        new: list[dict[str, Any]],
        schemas: list[dict[str, Any]],
        eos_text: str,
        seen: str,
    ) -> tuple[str, bool]:
        """(the text after the model's last token up to the next generation prompt, once `new` messages
        answer its turn; whether the template renders the conversation so far as `seen`, the text the
        model saw and wrote). `eos_text`: the end-of-turn token the model generated, or ""."""
        before = self.render([*history, assistant], schemas, generation=False)
        after = self.render([*history, assistant, *new], schemas, generation=True)
        if not after.startswith(before):
            raise MultiTurnError(
                "the chat template renders a conversation so that adding a message changes the text of earlier "
                f"ones (after {json.dumps(before[-80:])}, it wrote {json.dumps(after[len(before) - 80 : len(before)])}); "
                "turn-by-turn token sequences need an append-only template"
            )
        glue = self._glue(eos_text)
        return glue + after[len(before) :], before == seen + glue

    def as_seen(
        self,
        history: list[dict[str, Any]],
        assistant: dict[str, Any],
        schemas: list[dict[str, Any]],
        eos_text: str,
        seen: str,
    ) -> bool:
        """Whether the template renders the conversation ending with `assistant` as `seen` (the model's
        text, its end-of-turn token `eos_text` included) plus the rest of its end-of-turn marker."""
        return self.render([*history, assistant], schemas, generation=False) == seen + self._glue(eos_text)
