"""Every bound a request's fields must keep, defined once.

The gateway's request models (gateway/openai/schema.py, gateway/responses_api/schema.py, and through them
the OpenAPI document), the server's flags and SamplingParams' own checks (shared/sampling_params.py, run
by the gateway that builds the parameters and again by the worker that receives them) all take their
bounds from here, so what the document says, what the gateway refuses and what the worker refuses cannot
drift apart. Bounds that depend on the served model or the server's flags (vocabulary size, context
length, --max-n, stop strings) are checked where those are known; their static outer bounds and the flags'
defaults are here too.

Integral bounds are written as ints (0, not 0.0): the OpenAPI document shows them as written.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

Number = int | float


@dataclass(frozen=True)
class Range:
    """The values lo..hi; None leaves a side unbounded, and an open side excludes its edge."""

    lo: Number | None = None
    hi: Number | None = None
    lo_open: bool = False
    hi_open: bool = False

    def contains(self, value: Number) -> bool:
        """Whether `value` is in the range (NaN never is: every comparison with it is false)."""
        above = self.lo is None or (value > self.lo if self.lo_open else value >= self.lo)
        below = self.hi is None or (value < self.hi if self.hi_open else value <= self.hi)
        return above and below

    def field_kwargs(self) -> dict[str, Number]:
        """pydantic's Field constraints for the range (ge/gt/le/lt, which JSON Schema writes as minimum,
        exclusiveMinimum, maximum, exclusiveMaximum)."""
        kwargs: dict[str, Number] = {}
        if self.lo is not None:
            kwargs["gt" if self.lo_open else "ge"] = self.lo
        if self.hi is not None:
            kwargs["lt" if self.hi_open else "le"] = self.hi
        return kwargs


# Counts and ids that cross the worker link are bounded, so every accepted value also fits msgpack's integers.
COUNT_MAX = 2**31 - 1
INT64 = Range(-(2**63), 2**63 - 1)

# ----- sampling -----
TEMPERATURE = Range(0, 2)  # 0 means greedy
TOP_P = Range(0, 1, lo_open=True)
TOP_K = Range(-1, COUNT_MAX)  # 0 or -1: off
MIN_P = Range(0, 1)
PRESENCE_PENALTY = Range(-2, 2)
FREQUENCY_PENALTY = Range(-2, 2)
# repetition_penalty divides the positive logits of seen tokens: a divisor near 0 (5e-324 is a valid float)
# overflows them to inf, and the draw then reads NaN probabilities. 0.01 keeps every logit finite.
REPETITION_PENALTY = Range(0.01, 10)
LOGIT_BIAS = Range(-100, 100)  # each value of logit_bias
SEED = INT64
# vLLM's request priority under --scheduling-policy priority: lower runs first, 0 by default.
PRIORITY = Range(-COUNT_MAX - 1, COUNT_MAX)

# ----- token ids -----
# A token id given by the client (prompt, logit_bias key, stop_token_ids, /detokenize); below the served
# model's vocabulary size too, which is checked where it is known.
TOKEN_ID = Range(0, COUNT_MAX)

# ----- lengths and counts -----
# max_tokens: 0 scores the prompt without generating (completions allow it only with echo, as vLLM does);
# the context length bounds it from above, where it is known.
MAX_TOKENS = Range(0)
# Chat's max_completion_tokens (and max_tokens) and the Responses API's max_output_tokens: no echo to score.
MAX_COMPLETION_TOKENS = Range(1)
THINKING_BUDGET_TOKENS = Range(1, COUNT_MAX)  # Anthropic's thinking.budget_tokens (their floor of 1024 not kept)
COMPLETION_MAX_TOKENS_DEFAULT = 16  # OpenAI's default for /v1/completions
MIN_TOKENS = Range(0, COUNT_MAX)  # and at most max_tokens
# logprobs (completions), top_logprobs (chat, responses) and prompt_logprobs: alternatives per token.
LOGPROBS = Range(0, 20)
# Choices per request: --max-n (default DEFAULT_MAX_N) narrows it per server.
N = Range(1, 128)
DEFAULT_MAX_N = 16
# Stop strings per request and characters per stop string: the defaults of --max-stop-strings and
# --max-stop-length.
DEFAULT_MAX_STOP = 16
DEFAULT_MAX_STOP_LENGTH = 512

# ----- tools and structured output -----
MAX_TOOLS = 128  # function tools per request
NAME_MAX_LENGTH = 64  # a function's or a JSON schema's name
NAME_PATTERN = rf"^[a-zA-Z0-9_-]{{1,{NAME_MAX_LENGTH}}}$"
NAME_RULE = f"1-{NAME_MAX_LENGTH} letters, digits, _ or -"  # NAME_PATTERN in words, for error messages
MAX_SCHEMA_CHARS = 128 * 1024  # one JSON schema from a request, serialized
MAX_SCHEMA_DEPTH = 64  # nested objects/arrays in the schema document itself
# Object properties in one schema. Optional properties cost the grammar most: 1000 of them compile in about
# 0.1 s and 4000 in over a second, with masks to match.
MAX_SCHEMA_PROPERTIES = 1000
# A compile (in the gateway's check) slower than this is refused: the worker would pay it again.
MAX_COMPILE_SECONDS = 1.0
# An llguidance grammar (a JSON schema or Lark text compiled by the gateway) bigger than this is refused.
MAX_GRAMMAR_CHARS = 1 << 20
# vLLM's bad_words: how many words a request may ban, and how long each may be. Each is checked against the
# output's tail on every step, so both bound per-step work.
MAX_BAD_WORDS = 64
MAX_BAD_WORD_CHARS = 128
MAX_BAD_WORD_TOKENS = 4 * MAX_BAD_WORD_CHARS  # a byte-level tokenizer may spend a token per UTF-8 byte


def is_decimal(text: str) -> bool:
    """Whether `text` is a decimal number in ASCII digits: str.isdigit alone is true for '²' (which int() refuses)
    and for '٣' (which int() reads as 3)."""
    return text.isascii() and text.isdigit()


def decimal_below(n: int) -> str:
    """A regular expression for the decimal numbers 0 .. n-1 (no leading zeros): token ids as JSON object keys."""
    top = str(n - 1)
    k = len(top)
    alternatives = ["0", f"[1-9][0-9]{{0,{k - 2}}}"] if k > 1 else []
    for i, digit in enumerate(top):
        low = 1 if i == 0 and k > 1 else 0  # no leading zero (a lone 0 is among the shorter numbers)
        if int(digit) > low:
            rest = f"[0-9]{{{k - i - 1}}}" if k - i - 1 else ""
            alternatives.append(f"{top[:i]}[{low}-{int(digit) - 1}]{rest}")
    alternatives.append(top)
    return f"^({'|'.join(alternatives)})$"


# JSON object keys are strings: logit_bias maps a token id written in decimal to a bias.
TOKEN_ID_KEY_PATTERN = decimal_below(TOKEN_ID.hi + 1)


# ----- pooling: embeddings, rerank, score -----
MAX_EMBEDDING_INPUTS = 2048  # items of an embeddings request's input (OpenAI's bound)
MAX_SCORE_DOCUMENTS = 1000  # documents of one rerank or score request (Cohere's recommended ceiling)
DIMENSIONS = Range(1, COUNT_MAX)  # Matryoshka: at most the model's embedding size, checked against it
TOP_N = Range(0, COUNT_MAX)  # 0: every document (vLLM)
COHERE_TOP_N = Range(1, COUNT_MAX)  # Cohere's top_n: absent for every document
MAX_TOKENS_PER_DOC = Range(1, COUNT_MAX)  # Cohere's: each document cut to its first N tokens
TRUNCATE_PROMPT_TOKENS = Range(-1, COUNT_MAX)  # vLLM's: keep the last N tokens; -1: the context length


# ----- bounds that depend on the served model -----
class OutOfBounds(ValueError):
    """A request outside a bound of the served model; `param` names the field to blame."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


class ContextOverflow(OutOfBounds):
    """A prompt, or a prompt with its max_tokens (None: the prompt alone leaves no room), longer than the context.
    Worded as OpenAI and vLLM word it, which client libraries match to tell an overflow from other 400s: LiteLLM's
    ContextWindowExceededError ("maximum context length is"), LangChain's ContextOverflowError ("Input tokens exceed
    the configured limit", OpenAI's newer wording; LangChain reads the message alone), for trimming or falling back
    to a model with a longer context. Where max_tokens alone fills the context, no input fits, and the message says
    only how much was asked."""

    def __init__(self, prompt_tokens: int, max_tokens: int | None, context_len: int):
        self.prompt_tokens, self.max_tokens, self.context_len = prompt_tokens, max_tokens, context_len
        # The most prompt tokens that would have fitted: the output needs one token at least when max_tokens is None.
        self.input_limit = context_len - (1 if max_tokens is None else max_tokens)
        if max_tokens is None:
            asked, reduce = f"your prompt has {prompt_tokens} tokens, which leaves no room for output", "the prompt"
        else:
            asked = (f"you requested {prompt_tokens + max_tokens} tokens ({prompt_tokens} in the prompt, {max_tokens} "
                     "in max_tokens)")
            reduce = "the prompt or max_tokens"
        over = (f"Input tokens exceed the configured limit of {self.input_limit} tokens:" if self.input_limit > 0
                else "However,")
        super().__init__(f"{context_length_sentence(context_len)} {over} {asked}. Please reduce the length of "
                         f"{reduce}.", "max_tokens" if max_tokens else "prompt")


def context_length_sentence(context_len: int) -> str:
    """The opening of every context-overflow message, generation's and pooling's: the words clients match."""
    return f"This model's maximum context length is {context_len} tokens."


def check_prompt_fits(prompt: Sequence[int], max_tokens: int | None, vocab_size: int, context_len: int) -> None:
    """A non-empty prompt's ids are in the vocabulary, and it leaves the context room for max_tokens (None: for
    at least one token). max_tokens 0 (scoring alone) may fill the whole context. The gateway checks this before
    a request is sent, the engine again when it is added."""
    bad = next((t for t in prompt if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise OutOfBounds(f"prompt token id {bad} is outside the vocabulary (size {vocab_size})", "prompt")
    if len(prompt) > context_len or (len(prompt) == context_len and max_tokens != 0):
        # Scoring alone (max_tokens 0) may fill the context; anything else needs room for one token.
        raise ContextOverflow(len(prompt), 0 if max_tokens == 0 else None, context_len)
    if max_tokens is not None and len(prompt) + max_tokens > context_len:
        raise ContextOverflow(len(prompt), max_tokens, context_len)
