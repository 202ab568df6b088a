"""The served model's text side: chat template, detokenizer, stop strings, reasoning split, tools and their calls,
grammars, prompt logprobs."""
