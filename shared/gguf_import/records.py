"""What a converted directory's cache key and source record are made of: read by the gateway on every start
(resolving a cached conversion) and kept free of torch, which only a conversion itself needs."""

# Bump whenever the output for the same GGUF changes, so caches keyed on it are rebuilt.
CONVERTER_VERSION = 2
# Written beside the converted files: which GGUF they came from, so the engine can serve that file's
# quantized tensors as they are (worker/quant/sources.py).
SOURCE_RECORD = "gguf_source.json"
