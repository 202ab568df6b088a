"""Engine settings, built once from the command line (or by tests) and never mutated afterwards."""

from __future__ import annotations

import re
from dataclasses import dataclass

from shared.speculative_config import SpeculativeConfig

DTYPES = ("auto", "float32", "bfloat16", "float16")
ATTENTION_BACKENDS = ("auto", "mojo", "torch")
# auto: the model's dtype, but float16 where --dtype auto gave float32 (a CPU without bfloat16 arithmetic). int8:
# one scale per token and KV head (kernels/kv_int8.py), about half the bytes of bfloat16, served by the CPU kernels
# and the torch reference. float16: beside a float32 model, half its bytes, read by the same kernels.
KV_CACHE_DTYPES = ("auto", "bfloat16", "float16", "int8")
# auto: a GGUF's own quantized types for a model converted from a GGUF, none for safetensors checkpoints.
QUANTIZATIONS = ("auto", "none", "q8_0", "q4_0")
# How the quantized-weight kernels quantize each activation row per 32-element block (kernels/quant_operands.py),
# once per server, never per batch: int8x2, two int8 parts (about 15 bits; two vpdpbusd per 4 K-steps), or int8,
# one (llama.cpp's Q8_0 activations, about 8 bits; one vpdpbusd, about twice the many-row throughput). auto: int8
# for --task embed and score (prefill only, so throughput bound), int8x2 for generate (decode's accuracy).
# int8-prompt: prompt positions' rows one-part, generated positions' two-part (worker/quant/row_modes.py).
ACTIVATION_QUANTIZATIONS = ("auto", "int8x2", "int8", "int8-prompt")
# auto: cuda where torch sees a CUDA device, else cpu (resolved by the worker, which imports torch).
# "cuda:N" names one GPU of several.
DEVICES = ("auto", "cpu", "cuda")
# fcfs: waiting requests are admitted in arrival order (fair between API keys); priority: by their priority
# first (lower first), and the lowest priority is preempted first (worker/core/scheduler.py).
SCHEDULING_POLICIES = ("fcfs", "priority")
RESOLVED_TASKS = ("generate", "embed", "score")
_DEVICE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")


@dataclass(frozen=True)
class EngineConfig:
    model: str  # HF-format directory
    dtype: str = "auto"
    max_model_len: int | None = None  # None: the model's context length (max_position_embeddings, rope-scaled)
    # config.json keys to replace before the model is read (vLLM's --hf-overrides), e.g. a YaRN rope_scaling.
    hf_overrides: dict | None = None
    max_num_seqs: int = 128
    max_num_batched_tokens: int = 2048
    block_size: int = 16
    num_kv_blocks: int | None = None  # wins over kv_cache_memory when set
    kv_cache_memory: int = 1 << 30  # bytes
    attention_backend: str = "auto"
    kv_cache_dtype: str = "auto"
    quantization: str = "auto"
    activation_quantization: str = "auto"  # one of ACTIVATION_QUANTIZATIONS
    enable_prefix_caching: bool = True
    device: str = "cpu"  # one of DEVICES, or "cuda:N"
    # Decode-only steps of a quantized model run their layers as one kernel program where eligible
    # (worker/runner/decode_program.py); False keeps every step on the module path (tests compare the two).
    decode_program: bool = True
    # On CUDA, decode steps replay CUDA graphs (worker/runner/decode_graphs.py); True runs every step eagerly (vLLM's
    # name for the same switch).
    enforce_eager: bool = False
    # Each run of a layer's elementwise operators (residual add and norm; q/k norms and rotary; SiLU and multiply) as
    # one kernel compiled by torch.compile (worker/model/compiled_ops.py). None: on CUDA unless enforce_eager (vLLM's
    # switch turns compilation off too); where the CPU's fused Mojo layer kernels serve it changes nothing.
    compile_layer_ops: bool | None = None
    scheduling_policy: str = "fcfs"  # one of SCHEDULING_POLICIES
    # What every request computes: generate (tokens), or embed / score (one pooled vector per prompt, prefill only;
    # shared/pooling_config.py). `--task auto` is resolved before the config is built.
    task: str = "generate"
    # Speculative decoding (shared/speculative_config.py); None: off. A dict (the JSON the worker is started
    # with) becomes the checked config.
    speculative_config: SpeculativeConfig | None = None

    def __post_init__(self) -> None:
        if self.task not in RESOLVED_TASKS:
            raise ValueError(f"task must be one of {', '.join(RESOLVED_TASKS)}, got {self.task!r}")
        if isinstance(self.speculative_config, dict):
            object.__setattr__(self, "speculative_config", SpeculativeConfig(**self.speculative_config))
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ValueError(f"attention backend must be one of {', '.join(ATTENTION_BACKENDS)}, "
                             f"got {self.attention_backend!r}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv cache dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got {self.kv_cache_dtype!r}")
        if self.quantization not in QUANTIZATIONS:
            raise ValueError(f"quantization must be one of {', '.join(QUANTIZATIONS)}, got {self.quantization!r}")
        if self.activation_quantization not in ACTIVATION_QUANTIZATIONS:
            raise ValueError(f"activation quantization must be one of {', '.join(ACTIVATION_QUANTIZATIONS)}, "
                             f"got {self.activation_quantization!r}")
        if self.scheduling_policy not in SCHEDULING_POLICIES:
            raise ValueError(f"scheduling policy must be one of {', '.join(SCHEDULING_POLICIES)}, "
                             f"got {self.scheduling_policy!r}")
        if not _DEVICE.match(self.device):
            raise ValueError(f"device must be one of {', '.join(DEVICES)} (or cuda:N), got {self.device!r}")
        if self.device.startswith("cuda"):
            # The quantized-weight kernels are CPU kernels; say so rather than fail later. (Attention has a GPU
            # module: `mojo` on cuda loads it or fails with the reason, worker/attention/selection.py.)
            if self.quantization in ("q8_0", "q4_0"):
                raise ValueError(f"quantization {self.quantization} needs the CPU kernels; on cuda a checkpoint "
                                 "serves in its dtype (auto or none)")
            if self.kv_cache_dtype in ("int8", "float16"):
                raise ValueError(f"kv cache dtype {self.kv_cache_dtype} is served on the CPU; on cuda use auto or "
                                 "bfloat16")
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block size must be a power of two, got {self.block_size}")
        for name in ("max_num_seqs", "max_num_batched_tokens", "kv_cache_memory"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ValueError(f"num_kv_blocks must be positive, got {self.num_kv_blocks}")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ValueError(f"max_model_len must be positive, got {self.max_model_len}")


    @property
    def activation_mode(self) -> str:
        """The activation quantization the quantized kernels run (auto resolved by the task)."""
        if self.activation_quantization != "auto":
            return self.activation_quantization
        return "int8x2" if self.task == "generate" else "int8"


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """'4GiB', '512M', '1.5g', '1000000' -> bytes (binary units: K = 1024)."""
    match = _SIZE.match(text)
    if not match:
        raise ValueError(f"cannot read {text!r} as a size (examples: 512MiB, 4G, 1000000)")
    number, unit = float(match.group(1)), match.group(2).lower()
    return int(number * 1024 ** "_kmgt".index(unit)) if unit else int(number)
