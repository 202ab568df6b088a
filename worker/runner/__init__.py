"""One engine step's execution: the model runner, decode graphs and programs, the sampler, prompt logprobs, grammar
masks, the KV cache tensors."""
