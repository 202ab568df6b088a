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
