"""llama.cpp GGUF files: the reader (reader.py), the conversion of a GGUF's config, tokenizer and weights into
an HF-format directory (convert.py, with tokenizer.py and rope.py), and the GGUF's quantized tensors as the
engine serves them (worker/quant/ turns them into kernel layouts)."""
