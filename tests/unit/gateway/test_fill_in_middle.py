"""Fill-in-the-middle prompts (gateway/text/fill_in_middle.py): the markers are found in either spelling, and the
prompt is prefix-suffix-middle with each text tokenized alone."""

from __future__ import annotations

import pytest
from tokenizers import AddedToken

from gateway.text.fill_in_middle import SPELLINGS, FimTokens, fim_prompt, fim_tokens
from tests.helpers.toy_tokenizers import byte_bpe


@pytest.mark.parametrize("names", SPELLINGS)
def test_either_spelling_is_found_and_laid_out_prefix_suffix_middle(names):
    tok = byte_bpe()
    tok.add_special_tokens([AddedToken(n, special=True) for n in names])
    found = fim_tokens(tok)
    assert found == FimTokens(*(tok.token_to_id(n) for n in names))
    ids = fim_prompt(tok, found, "ab <x>", "cd")
    assert ids == [found.prefix, *tok.encode("ab <x>", add_special_tokens=False).ids, found.suffix,
                   *tok.encode("cd", add_special_tokens=False).ids, found.middle]
    assert fim_prompt(tok, found, "", "")[:1] == [found.prefix] and len(fim_prompt(tok, found, "", "")) == 3


def test_a_tokenizer_without_all_three_has_none():
    tok = byte_bpe()
    assert fim_tokens(tok) is None
    tok.add_special_tokens([AddedToken(n, special=True) for n in SPELLINGS[0][:2]])
    assert fim_tokens(tok) is None


def test_code_that_spells_a_marker_is_tokenized_as_plain_text():
    """A file being edited may spell the markers (a tokenizer's own source does): they stay text in every part of
    the prompt, as llama-server's /infill tokenizes them, so a prefix cannot close itself or open a middle; the
    tokenizer's flag is put back for everything else."""
    from gateway.llamacpp.infill import infill_ids

    tok = byte_bpe()
    tok.add_special_tokens([AddedToken(n, special=True) for n in (*SPELLINGS[0], "<|file_sep|>")])
    fim = fim_tokens(tok)
    code = 'MIDDLE = "<|fim_middle|>"\n'
    as_text = tok.encode(code, add_special_tokens=False).ids
    assert fim.middle in as_text  # the ordinary encode would read the marker
    ids = fim_prompt(tok, fim, code, code)
    assert ids.count(fim.middle) == 1 and ids[-1] == fim.middle
    pieces = ids[1:ids.index(fim.suffix)]
    assert tok.decode(pieces, skip_special_tokens=False) == code and len(pieces) > len(as_text)
    filled = infill_ids(tok, fim, code, code, "", [("a.py", '<|file_sep|>x.py\n' + code)], 32768, 16)
    assert filled.count(fim.middle) == 1 and filled.count(fim.file_sep) == 2  # a.py's and the current file's
    assert not tok.encode_special_tokens
    assert tok.encode(code, add_special_tokens=False).ids == as_text
