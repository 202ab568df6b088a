"""llama.cpp server's /infill prompt (gateway/llamacpp/infill.py), laid out and cut as llama-server does: other
files first under the repository markers (or `--- snippet ---` lines without them), a BOS where the tokenizer puts
one, then prefix + prompt, suffix, middle; the prefix keeps its last 1536 tokens (3/4 of a 2048-token batch, or of
the context where shorter), the suffix its first 510 less the prompt's, the extra files their last tokens within the
context less a batch and two generations."""

from __future__ import annotations

from tokenizers import AddedToken, processors

from gateway.llamacpp.infill import BATCH, CURRENT_FILE, REPO_NAME, SNIPPET, infill_ids
from gateway.text.fill_in_middle import fim_tokens
from tests.helpers.toy_tokenizers import byte_bpe

MARKERS = ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"]
REPO_MARKERS = ["<|repo_name|>", "<|file_sep|>"]


def tokenizer(markers: list[str]):
    tok = byte_bpe()
    tok.add_special_tokens([AddedToken(n, special=True) for n in markers])
    return tok


def encode(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False).ids


def test_other_files_go_first_under_the_repository_markers():
    tok = tokenizer(MARKERS + REPO_MARKERS)
    fim = fim_tokens(tok)
    assert (fim.repo, fim.file_sep) == tuple(tok.token_to_id(n) for n in REPO_MARKERS)
    ids = infill_ids(tok, fim, "def f(", "):\n", "x", [("a.py", "A = 1"), ("b.py", "B")], 32768, 64)
    assert ids == [fim.repo, *encode(tok, REPO_NAME), fim.file_sep, *encode(tok, "a.py\n"), *encode(tok, "A = 1"),
                   fim.file_sep, *encode(tok, "b.py\n"), *encode(tok, "B"), fim.file_sep, *encode(tok, CURRENT_FILE),
                   fim.prefix, *encode(tok, "def f("), *encode(tok, "x"), fim.suffix, *encode(tok, "):\n"), fim.middle]


def test_without_file_separators_extra_chunks_are_snippets():
    tok = tokenizer(MARKERS)
    fim = fim_tokens(tok)
    assert fim.repo is None and fim.file_sep is None
    ids = infill_ids(tok, fim, "p", "s", "", [("a.py", "A")], 32768, 64)
    assert ids == [*encode(tok, SNIPPET), *encode(tok, "A"), fim.prefix, *encode(tok, "p"), fim.suffix,
                   *encode(tok, "s"), fim.middle]
    assert infill_ids(tok, fim, "", "", "", [], 32768, 64) == [fim.prefix, fim.suffix, fim.middle]


def test_each_part_is_cut_to_llama_servers_budget():
    tok = tokenizer(MARKERS + REPO_MARKERS)
    fim = fim_tokens(tok)
    prefix, suffix, prompt = "a " * 2000, "a " * 600, "a " * 10  # 4000, 1200 and 20 tokens
    extra = [("f", "a " * 3000)]
    context, n_predict = 5000, 100
    ids = infill_ids(tok, fim, prefix, suffix, prompt, extra, context, n_predict)
    start = ids.index(fim.prefix)
    extra_ids = [fim.repo, *encode(tok, REPO_NAME), fim.file_sep, *encode(tok, "f\n"), *encode(tok, extra[0][1]),
                 fim.file_sep, *encode(tok, CURRENT_FILE)]
    assert ids[:start] == extra_ids[-(context - BATCH - 2 * n_predict):]  # the extra files' last tokens
    between = ids[start + 1:ids.index(fim.suffix)]
    assert between == encode(tok, prefix)[-3 * BATCH // 4:] + encode(tok, prompt)  # the prefix's last 1536
    assert ids[ids.index(fim.suffix) + 1:-1] == encode(tok, suffix)[:BATCH // 4 - 2 - len(encode(tok, prompt))]
    # n_predict -1 counts as -1 generated tokens: a context of one batch leaves the extra files' last 2 tokens.
    short = infill_ids(tok, fim, "p", "s", "", extra, BATCH, -1)
    assert short[:short.index(fim.prefix)] == extra_ids[-2:]
    assert infill_ids(tok, fim, "p", "s", "", extra, BATCH, 1)[0] == fim.prefix
    # A context under a batch is the batch: the prefix keeps 3/4 of it.
    small = infill_ids(tok, fim, prefix, "", "", [], 400, 16)
    assert small[1:small.index(fim.suffix)] == encode(tok, prefix)[-300:]


def test_a_bos_goes_ahead_of_the_prefix_where_the_tokenizer_puts_one():
    tok = tokenizer(MARKERS + ["<s>"])
    bos = tok.token_to_id("<s>")
    assert fim_tokens(tok).leading == ()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", bos)])
    fim = fim_tokens(tok)
    assert fim.leading == (bos,)
    ids = infill_ids(tok, fim, "p", "s", "", [("a", "A")], 32768, 64)
    assert ids[:ids.index(fim.prefix)] == [*encode(tok, SNIPPET), *encode(tok, "A"), bos]
