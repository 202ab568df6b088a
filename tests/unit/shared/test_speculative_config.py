"""--speculative-config: vLLM's keys and defaults, and a clear error for everything else."""

from __future__ import annotations

import pytest

from shared.config import EngineConfig
from shared.speculative_config import SpeculativeConfig, parse_speculative_config


def test_ngram_window_defaults_as_vllm():
    assert parse_speculative_config(None) is None
    both = parse_speculative_config('{"method": "ngram", "num_speculative_tokens": 3}')
    assert (both.prompt_lookup_min, both.prompt_lookup_max) == (5, 5)
    only_max = parse_speculative_config('{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}')
    assert (only_max.prompt_lookup_min, only_max.prompt_lookup_max) == (4, 4)
    only_min = parse_speculative_config('{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2}')
    assert (only_min.prompt_lookup_min, only_min.prompt_lookup_max) == (2, 2)
    assert "ngram" in only_min.describe()


@pytest.mark.parametrize(("text", "names"), [
    ("{not json", "not valid JSON"),
    ("[1]", "JSON object"),
    ('{"method": "eagle", "num_speculative_tokens": 2}', "method"),
    ('{"method": "ngram"}', "num_speculative_tokens"),
    ('{"method": "ngram", "num_speculative_tokens": 0}', "num_speculative_tokens"),
    ('{"method": "ngram", "num_speculative_tokens": 17}', "num_speculative_tokens"),
    ('{"method": "ngram", "num_speculative_tokens": true}', "num_speculative_tokens"),
    ('{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 0}', "prompt_lookup_min"),
    ('{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 4, "prompt_lookup_max": 2}',
     "exceeds"),
    ('{"method": "ngram", "num_speculative_tokens": 2, "model": "x"}', "unknown key(s) for method ngram: model"),
    ('{"method": "draft_model", "model": "/nowhere", "num_speculative_tokens": 2}', "config.json"),
    ('{"method": "draft_model", "num_speculative_tokens": 2}', "draft_model needs \"model\""),
])
def test_bad_configs_name_the_problem(text, names):
    with pytest.raises(ValueError, match=None) as e:
        parse_speculative_config(text)
    assert names in str(e.value)


def test_engine_config_round_trips_through_the_workers_json():
    from dataclasses import asdict
    config = EngineConfig(model="m", speculative_config=SpeculativeConfig("ngram", 4, 2, 3))
    assert EngineConfig(**asdict(config)) == config
