"""The embedded default model (SmolLM2-135M-Instruct from its GGUF) through the engine."""

from __future__ import annotations

import pytest
import torch
from tokenizers import Tokenizer

from shared.config import EngineConfig
from shared.default_model import default_model_path
from shared.sampling_params import SamplingParams
from worker.engine import LLMEngine

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    import os

    os.environ.setdefault("MILI_CACHE_DIR", str(tmp_path_factory.mktemp("mili-cache")))
    return default_model_path()


@pytest.fixture(scope="module")
def chat_prompt(model_dir) -> list[int]:
    from transformers import AutoTokenizer

    hf_tokenizer = AutoTokenizer.from_pretrained(model_dir)
    text = hf_tokenizer.apply_chat_template(QUESTION, tokenize=False, add_generation_prompt=True)
    return Tokenizer.from_file(str(model_dir / "tokenizer.json")).encode(text, add_special_tokens=False).ids


# bfloat16 serves the GGUF's blocks (quantization auto, the default). float32 runs unquantized: served
# from the blocks, its first greedy token is a near-tie ("The" 25.33 vs "L" 25.24 in transformers) that
# the int8 activations flip, exactly as transformers with the same int8 rounding emulated does.
@pytest.mark.parametrize(("dtype", "quantization"), [("float32", "none"), ("bfloat16", "auto")])
def test_greedy_capital_of_france_is_paris(model_dir, chat_prompt, dtype, quantization):
    engine = LLMEngine(EngineConfig(model=str(model_dir), dtype=dtype, attention_backend="torch",
                                    max_model_len=1024, num_kv_blocks=128, quantization=quantization))
    result = engine.generate([chat_prompt], SamplingParams(temperature=0.0, max_tokens=24))[0]
    text = Tokenizer.from_file(str(model_dir / "tokenizer.json")).decode(result.token_ids[0])
    print(f"{dtype}: {text!r}")
    assert "Paris" in text


def test_engine_matches_transformers_on_default_model(model_dir, chat_prompt):
    """float32, unquantized: the engine's greedy continuation equals transformers' on the real converted
    weights. (Served from the GGUF's blocks, the int8 activations make it an approximation instead:
    tests/unit/quant/test_quant_model.py and test_quant_default_model.py check that one.)"""
    from transformers import AutoModelForCausalLM

    engine = LLMEngine(EngineConfig(model=str(model_dir), dtype="float32", attention_backend="torch",
                                    max_model_len=1024, num_kv_blocks=128, max_num_batched_tokens=13,
                                    quantization="none"))
    ours = engine.generate([chat_prompt], SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True))[0]
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        ref = hf.generate(torch.tensor([chat_prompt]), max_new_tokens=24, do_sample=False,
                          eos_token_id=None, pad_token_id=0)[0, len(chat_prompt):]
    assert ours.token_ids[0] == ref.tolist()
