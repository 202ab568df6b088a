"""llama.cpp server's POST /infill: the code at an editor's cursor (llama.vim, llama.vscode and other plugins post
here), as a fill-in-the-middle prompt laid out the way llama-server lays it out, so that a plugin tuned against
llama-server gets the same prompt from MILI:

    [repo]myproject\\n [file_sep]NAME\\n TEXT ... [file_sep]filename\\n [prefix]PREFIX PROMPT [suffix]SUFFIX [middle]

- `input_extra` chunks (other files, each `{"filename", "text"}`) come first, each after the file separator and its
  name, under the repository marker; with no file separator in the vocabulary, each after a `--- snippet ---` line.
- `prompt` (optional) is text after the prefix, where the model continues from.
- The parts are cut to llama-server's budgets: the prefix keeps its last 3/4 of a batch (BATCH tokens, or the
  context where it is shorter), the suffix its first quarter less the prompt and two markers, the extra chunks the
  last tokens that leave a batch and two generations' worth of the context free.
- A tokenizer that puts a BOS before text gets one ahead of the prefix part, as llama-server adds it.
The request then runs as the completion it means (gateway/llamacpp/to_completion.py), with these token ids for its
prompt, and is answered as /completion is.
"""

from __future__ import annotations

from tokenizers import Tokenizer

from gateway.text.fill_in_middle import FimTokens, part_ids

BATCH = 2048  # llama-server's default --batch-size, from which it cuts the prefix's and the suffix's budgets
REPO_NAME = "myproject\n"  # the repository name llama-server writes after the repository marker
CURRENT_FILE = "filename\n"  # and the name it gives the file being edited
SNIPPET = "\n\n--- snippet ---\n\n"  # an extra chunk's separator where the vocabulary has no file separator


def infill_ids(tokenizer: Tokenizer, fim: FimTokens, prefix: str, suffix: str, prompt: str,
               extra: list[tuple[str, str]], context: int, n_predict: int) -> list[int]:
    """The prompt's token ids. extra: (filename, text) per chunk; context: the sequence's context length;
    n_predict: the request's (-1: no limit)."""
    def encode(text: str) -> list[int]:
        return part_ids(tokenizer, text)

    extra_ids: list[int] = []
    if fim.repo is not None:
        extra_ids += [fim.repo, *encode(REPO_NAME)]
    for filename, text in extra:
        extra_ids += [fim.file_sep, *encode(filename + "\n")] if fim.file_sep is not None else encode(SNIPPET)
        extra_ids += encode(text)
    if fim.file_sep is not None:
        extra_ids += [fim.file_sep, *encode(CURRENT_FILE)]
    prefix_ids, suffix_ids, prompt_ids = encode(prefix), encode(suffix), encode(prompt)
    batch = min(BATCH, context)  # llama.cpp caps its batch at the context
    prefix_take = min(len(prefix_ids), 3 * (batch // 4))
    suffix_take = min(len(suffix_ids), max(0, batch // 4 - (2 + len(prompt_ids))))
    extra_take = min(max(0, context - batch - 2 * n_predict), len(extra_ids))
    return [*extra_ids[len(extra_ids) - extra_take:], *fim.leading,
            fim.prefix, *prefix_ids[len(prefix_ids) - prefix_take:], *prompt_ids,
            fim.suffix, *suffix_ids[:suffix_take], fim.middle]

