"""A vLLM reasoning-parser plugin for the real-engine tier (issue 49): the bundled SmolLM2 does not
think, so this parser calls its first line "reasoning" and the rest its answer. It is loaded the
way a user loads theirs (`--reasoning-parser-plugin THIS_FILE --reasoning-parser first_line`), so
vLLM's own reasoning path streams `reasoning` deltas before the answer, as a thinking model's."""

from collections.abc import Iterable, Sequence

from vllm.entrypoints.generate.base.protocol import DeltaMessage
from vllm.reasoning import ReasoningParser, ReasoningParserManager

ASSISTANT = "<|im_start|>assistant\n"  # SmolLM2's chat template: where the model's own turn begins


@ReasoningParserManager.register_module("first_line")
class FirstLineReasoningParser(ReasoningParser):
    @property
    def reasoning_start_str(self) -> str | None:
        return None

    @property
    def reasoning_end_str(self) -> str | None:
        return "\n"

    def _text(self, ids: Iterable[int]) -> str:
        """The generated part: vLLM also asks about the prompt (whose chat template holds newlines), which
        ends with the assistant's turn marker; only what follows it is the answer."""
        text = self.model_tokenizer.decode(list(ids))
        return text.rsplit(ASSISTANT, 1)[1] if ASSISTANT in text else text

    def is_reasoning_end(self, input_ids: Sequence[int]) -> bool:
        return "\n" in self._text(input_ids)

    def is_reasoning_end_streaming(self, input_ids: Sequence[int], delta_ids: Iterable[int]) -> bool:
        return "\n" in self._text(input_ids)

    def count_reasoning_tokens(self, token_ids: Sequence[int]) -> int:
        """What vLLM's usage reports as `completion_tokens_details.reasoning_tokens`: the tokens before
        the first newline."""
        for k in range(len(token_ids)):
            if "\n" in self._text(token_ids[: k + 1]):
                return k
        return len(token_ids)

    def extract_content_ids(self, input_ids: list[int]) -> list[int]:
        for k in range(len(input_ids)):
            if "\n" in self._text(input_ids[: k + 1]):
                return input_ids[k + 1:]
        return []

    def extract_reasoning_streaming(self, previous_text: str, current_text: str, delta_text: str,
                                    previous_token_ids: Sequence[int], current_token_ids: Sequence[int],
                                    delta_token_ids: Sequence[int]) -> DeltaMessage | None:
        if not delta_text:
            return None
        if "\n" in previous_text:
            return DeltaMessage(content=delta_text)
        head, sep, tail = delta_text.partition("\n")
        if not sep:
            return DeltaMessage(reasoning=delta_text)
        return DeltaMessage(reasoning=head or None, content=tail or None)

    def extract_reasoning(self, model_output: str, request: object) -> tuple[str | None, str | None]:
        head, sep, tail = model_output.partition("\n")
        return (head, tail) if sep else (model_output, None)
