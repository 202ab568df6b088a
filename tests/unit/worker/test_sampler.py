"""Unit tests for the batched sampler (worker/runner/sampler.py).

Tests with random inputs draw a fresh seed per run and print it (`pytest -s`, or the captured output of
a failure); set MILI_TEST_SEED to replay one. Statistical checks allow 5.5 standard errors per bin
(about 50 bins in all), so a correct sampler fails one of them about once in a million runs.
"""

from __future__ import annotations

import math
import os
import secrets

import pytest
import torch

from shared.request_limits import REPETITION_PENALTY
from shared.sampling_params import SamplingParams, SamplingParamsError
from worker.runner.sampler import Sampler, SamplingRow, apply_logit_processors, greedy_tokens, make_generator

SEED = int(os.environ.get("MILI_TEST_SEED", secrets.randbits(32)))
MAX_Z = 5.5

# Distinct probabilities, deliberately out of order, so kept sets are easy to compute by hand.
PROBS8 = torch.tensor([0.08, 0.30, 0.02, 0.15, 0.20, 0.10, 0.03, 0.12], dtype=torch.float64)
LOGITS8 = PROBS8.log().float()


@pytest.fixture(autouse=True, scope="module")
def single_thread():
    """These tensors are tiny: a second intra-op thread only adds sync cost, and on a busy 2-core box
    waiting for it made the file 10x slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def seed() -> int:
    print(f"MILI_TEST_SEED={SEED}")
    return SEED


def make_row(params: SamplingParams | None = None, *, prompt: tuple[int, ...] = (), output: tuple[int, ...] = (),
             seed: int | None = None, device: str = "cpu", **kwargs) -> SamplingRow:
    return SamplingRow(params or SamplingParams(**kwargs), list(prompt), list(output), make_generator(seed, device))


def draw_counts(logits: torch.Tensor, params: SamplingParams, seed: int, rows: int = 250,
                steps: int = 40, device: str = "cpu") -> torch.Tensor:
    """Token counts [vocab] over rows * steps draws from one logits row, each row with its own stream (the
    logits and the generators on `device`)."""
    vocab = logits.shape[-1]
    sampler = Sampler(vocab, [])
    logits = logits.to(device)
    batch = [SamplingRow(params, [], [], make_generator(seed * 1000 + i, device)) for i in range(rows)]
    counts = torch.zeros(vocab, dtype=torch.float64)
    for _ in range(steps):
        tokens = sampler(logits.expand(rows, vocab), batch).token_ids
        counts += torch.bincount(torch.tensor(tokens), minlength=vocab)
    return counts


def assert_matches(counts: torch.Tensor, expected: torch.Tensor) -> None:
    """Empirical counts against expected probabilities: exact zeros stay zero, other bins are within MAX_Z
    standard errors. Bins expecting under 100 draws are pooled into one, where the normal approximation
    behind the z-score still holds."""
    n = counts.sum()
    assert torch.all(counts[expected == 0] == 0), f"drew outside the support: {counts.tolist()}"
    small = (expected > 0) & (expected * n < 100)
    big = expected * n >= 100
    obs = torch.cat([counts[big], counts[small].sum().reshape(1)]) / n
    exp = torch.cat([expected[big], expected[small].sum().reshape(1)])
    obs, exp = obs[exp > 0], exp[exp > 0]
    z = (obs - exp).abs() / (exp * (1 - exp) / n).sqrt()
    assert z.max() < MAX_Z, f"freq {(counts / n).tolist()} vs expected {expected.tolist()} (max z {z.max():.1f})"


# ----- greedy and logits processing -----

def test_greedy_equals_argmax_and_consumes_no_randomness(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(6, 100, generator=g)
    rows = [make_row(temperature=0.0), make_row(top_k=1), make_row(temperature=0.0, top_p=0.5, min_p=0.2),
            make_row(temperature=1.3, top_k=1), make_row(temperature=0.0, seed=3), make_row(temperature=0.0)]
    states = [r.generator.get_state() for r in rows]
    out = Sampler(100, [])(logits, rows)
    assert out.token_ids == logits.argmax(dim=-1).tolist()
    assert all(torch.equal(s, r.generator.get_state()) for s, r in zip(states, rows))
    assert out.logprobs == [None] * 6


def test_greedy_logit_bias_flips_winner() -> None:
    logits = torch.tensor([[0.0, 1.0, 5.0, 2.0]] * 3)
    rows = [make_row(temperature=0.0), make_row(temperature=0.0, logit_bias={1: 4.5}),
            make_row(temperature=0.0, logit_bias={1: 0.5, 2: -3.5})]
    assert Sampler(4, [])(logits, rows).token_ids == [2, 1, 3]


@pytest.mark.parametrize("temperature", [1.401298464324817e-45, 1e-30, 9e-6])
def test_vanishing_temperature_is_greedy_and_stays_in_the_vocabulary(temperature: float) -> None:
    # Found by API fuzzing: logits / 1.4e-45 overflow to +-inf, inf - inf is NaN, and the draw picked
    # token id == vocab size, which crashed the worker's embedding lookup on the next step.
    logits = torch.tensor([[0.0, 1.0, 5.0, 2.0, -3.0]] * 3)
    rows = [make_row(temperature=temperature), make_row(temperature=temperature, logit_bias={0: 28.5, 3: -89.7}),
            make_row(temperature=temperature, top_p=0.5, seed=7)]
    assert Sampler(5, [])(logits, rows).token_ids == [2, 0, 2]


def test_smallest_repetition_penalty_keeps_the_draw_in_the_vocabulary(seed: int) -> None:
    # Found by API fuzzing: repetition_penalty 5e-324 overflowed seen tokens' logits to inf, the draw read
    # NaN probabilities and picked id == vocab size, which crashed the worker's next forward pass.
    with pytest.raises(SamplingParamsError):
        SamplingParams(repetition_penalty=5e-324)
    logits = torch.tensor([[30.0, -30.0, 20.0, 5.0]] * 2)
    rows = [make_row(repetition_penalty=REPETITION_PENALTY.lo, temperature=1e-5 * 1.01, prompt=(0, 1, 2), seed=seed),
            make_row(repetition_penalty=REPETITION_PENALTY.lo, temperature=0.0, prompt=(2, 3))]
    assert Sampler(4, [])(logits, rows).token_ids == [0, 2]


def test_penalties_match_hand_computed_values() -> None:
    base = [2.0, -1.0, 0.5, 3.0, -2.0, 1.0]
    logits = torch.tensor([base + [50.0]] * 5)  # one padded column beyond vocab 6
    before = logits.clone()
    history = {"prompt": (1,), "output": (0, 0, 2)}  # counts: token 0 twice, token 2 once; token 1 prompt only
    rows = [
        make_row(presence_penalty=0.5, **history),
        make_row(frequency_penalty=0.25, **history),
        make_row(repetition_penalty=2.0, **history),
        # bias first (t1: 0.5, t3: 2.0), then repetition on {0, 1, 2}, then frequency and presence on {0, 2}
        make_row(repetition_penalty=2.0, presence_penalty=0.5, frequency_penalty=0.25,
                 logit_bias={3: -1.0, 1: 1.5}, **history),
        make_row(**history),
    ]
    expected = torch.tensor([
        [1.5, -1.0, 0.0, 3.0, -2.0, 1.0],
        [1.5, -1.0, 0.25, 3.0, -2.0, 1.0],
        [1.0, -2.0, 0.25, 3.0, -2.0, 1.0],
        [0.0, 0.25, -0.5, 2.0, -2.0, 1.0],
        base,
    ])
    processed = apply_logit_processors(logits, rows, vocab_size=6)
    assert processed.shape == expected.shape
    assert torch.allclose(processed, expected, rtol=0, atol=1e-6), processed
    assert torch.equal(logits, before)


def test_penalties_flip_greedy_choice() -> None:
    logits = torch.tensor([[3.0, 2.5, 0.0, 0.0]] * 4)
    rows = [make_row(temperature=0.0, output=(0,)),
            make_row(temperature=0.0, output=(0,), frequency_penalty=1.0),
            make_row(temperature=0.0, output=(0,), presence_penalty=1.0),
            make_row(temperature=0.0, prompt=(0,), repetition_penalty=1.5)]
    assert Sampler(4, [])(logits, rows).token_ids == [0, 1, 1, 1]


def test_min_tokens_blocks_eos_and_stop_ids_until_reached() -> None:
    eos, stop = 9, 4
    logits = torch.zeros(10)
    logits[[eos, stop, 2]] = torch.tensor([10.0, 9.0, 5.0])
    sampler = Sampler(10, [eos])
    greedy = [make_row(temperature=0.0, min_tokens=3, stop_token_ids=(stop,), output=(7,) * n) for n in range(5)]
    # ignore_eos makes EOS an ordinary token: only the stop id stays blocked.
    greedy.append(make_row(temperature=0.0, min_tokens=3, stop_token_ids=(stop,), ignore_eos=True))
    assert sampler(logits.expand(6, 10), greedy).token_ids == [2, 2, 2, eos, eos, eos]
    blocked = [make_row(min_tokens=3, stop_token_ids=(stop,), output=(7, 7), seed=i) for i in range(300)]
    assert not {eos, stop} & set(sampler(logits.expand(300, 10), blocked).token_ids)


def test_allowed_token_ids_restrict_greedy_and_random_draws(seed: int) -> None:
    allowed = (0, 3, 6)
    assert Sampler(8, [])(LOGITS8.expand(2, 8), [make_row(temperature=0.0, allowed_token_ids=allowed),
                                                  make_row(temperature=0.0)]).token_ids == [3, 1]
    # A draw from the distribution renormalized over the allowed set; a logit_bias still applies inside it.
    counts = draw_counts(LOGITS8, SamplingParams(allowed_token_ids=allowed, logit_bias={0: 1.0}), seed)
    kept = torch.full((8,), float("-inf"), dtype=torch.float64)
    kept[list(allowed)] = LOGITS8.double()[list(allowed)]
    kept[0] += 1.0
    assert_matches(counts, kept.softmax(-1))


def test_bad_words_ban_a_words_last_token_after_the_rest_of_it() -> None:
    logits = torch.tensor([0.0, 1.0, 2.0, 9.0, 8.0, 3.0])
    words = ((3,), (5, 4))  # a one-token word, banned everywhere; a two-token word, its 4 only after a 5
    rows = [make_row(temperature=0.0, bad_words_token_ids=words, output=output)
            for output in [(), (1,), (5,), (1, 5), (5, 1)]]
    assert Sampler(6, [])(logits.expand(5, 6), rows).token_ids == [4, 4, 5, 5, 4]
    # A word longer than the output so far cannot have begun; a three-token word checks both tokens before.
    rows = [make_row(temperature=0.0, bad_words_token_ids=((1, 2, 3),), output=output)
            for output in [(2,), (1, 2), (0, 2)]]
    assert Sampler(6, [])(logits.expand(3, 6), rows).token_ids == [3, 4, 3]


@pytest.mark.parametrize("kwargs, param", [
    ({"allowed_token_ids": ()}, "allowed_token_ids"),
    ({"allowed_token_ids": (-1,)}, "allowed_token_ids"),
    ({"bad_words_token_ids": ((),)}, "bad_words"),
])
def test_bad_allowed_and_banned_ids_are_refused(kwargs: dict, param: str) -> None:
    with pytest.raises(SamplingParamsError) as e:
        SamplingParams(**kwargs)
    assert e.value.param == param
    with pytest.raises(SamplingParamsError, match="outside the vocabulary") as e:
        SamplingParams(allowed_token_ids=(1, 50), bad_words_token_ids=((2,),)).check_token_ids(10)
    assert e.value.param == "allowed_token_ids"


def test_padded_columns_never_sampled(seed: int) -> None:
    logits = torch.zeros(12)
    logits[10:] = 100.0  # padded embedding rows: huge but not part of the vocab
    params = [SamplingParams(temperature=0.0), SamplingParams(), SamplingParams(top_p=0.5),
              SamplingParams(top_k=3, temperature=2.0), SamplingParams(min_p=0.5, logprobs=5)]
    rows = [make_row(params[i % len(params)], seed=seed + i) for i in range(500)]
    out = Sampler(10, [])(logits.expand(500, 12), rows)
    assert max(out.token_ids) < 10
    assert all(t < 10 for lp in out.logprobs if lp for t, _ in lp.top)


# ----- distributions -----

@pytest.mark.parametrize("temperature", [0.5, 1.0, 1.7])
def test_frequencies_match_softmax_at_temperature(seed: int, temperature: float) -> None:
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -0.5, -1.0, 1.5, -2.0])
    counts = draw_counts(logits, SamplingParams(temperature=temperature), seed, rows=500)
    assert_matches(counts, (logits.double() / temperature).softmax(-1))


@pytest.mark.parametrize("kwargs, kept", [
    ({"top_k": 3}, {1, 4, 3}),
    ({"top_p": 0.7}, {1, 4, 3, 7}),  # mass ahead of token 7 is 0.65 < 0.7; ahead of token 5, 0.77
    ({"min_p": 0.3}, {1, 4, 3, 7, 5}),  # keeps prob >= 0.09
    ({"top_k": 4, "top_p": 0.6}, {1, 4}),  # top_p over the top-4 renormalized: 0.39, 0.26 | 0.19, 0.16
    ({"min_p": 0.45, "top_p": 0.7}, {1, 4}),  # min_p keeps {1, 4, 3}: renormalized 0.46, 0.31 | 0.23
    ({"top_k": 3, "temperature": 2.0}, {1, 4, 3}),
])
def test_truncation_keeps_expected_set(seed: int, kwargs: dict, kept: set[int]) -> None:
    temperature = kwargs.get("temperature", 1.0)
    expected = PROBS8 ** (1.0 / temperature)
    expected[[i for i in range(8) if i not in kept]] = 0.0
    counts = draw_counts(LOGITS8, SamplingParams(**kwargs), seed)
    assert_matches(counts, expected / expected.sum())


def test_wide_top_p_nucleus(seed: int) -> None:
    """A nucleus wider than the sampler's top_p candidate list (the full-sort fallback)."""
    vocab = 1000
    values = torch.linspace(0.0, 1.0, vocab, dtype=torch.float64)
    logits = values[torch.randperm(vocab, generator=torch.Generator().manual_seed(seed))]
    probs, order = logits.softmax(-1).sort(descending=True)
    ahead = probs.cumsum(-1) - probs
    n_keep = int((ahead < 0.9).sum())
    assert 0.9 - ahead[n_keep - 1] > 1e-6 and ahead[n_keep] - 0.9 > 1e-6, "boundary too close to call"
    kept = set(order[:n_keep].tolist())
    counts = draw_counts(logits.float(), SamplingParams(top_p=0.9), seed, rows=100, steps=50)
    drawn = set(counts.nonzero().squeeze(1).tolist())
    assert drawn <= kept
    assert n_keep > 800 and len(drawn) > 700  # far more than the 256 candidates


# ----- seeds -----

def seeded_sequence(params: SamplingParams, row_seed: int, test_seed: int, position: int = 0,
                    others: list[SamplingParams] = (), device: str = "cpu") -> list[int]:
    """20 tokens of one seeded row, placed at `position` among unseeded `others` (sampled on `device`)."""
    vocab = 64
    sampler = Sampler(vocab, [])
    own_logits = torch.Generator().manual_seed(test_seed)  # the same for every placement
    noise = torch.Generator().manual_seed(test_seed + 1)
    target = SamplingRow(params, [], [], make_generator(row_seed, device))
    neighbours = [SamplingRow(p, [], [], make_generator(None, device)) for p in others]
    tokens: list[int] = []
    for _ in range(20):
        rows = neighbours[:position] + [target] + neighbours[position:]
        logits = torch.randn(len(rows), vocab, generator=noise)
        logits[position] = torch.randn(vocab, generator=own_logits)
        token = sampler(logits.to(device), rows).token_ids[position]
        tokens.append(token)
        target.output_token_ids.append(token)
    return tokens


@pytest.mark.parametrize("params", [SamplingParams(),
                                    SamplingParams(temperature=0.9, top_p=0.8, presence_penalty=0.3)])
def test_seeded_row_independent_of_batch(seed: int, params: SamplingParams) -> None:
    alone = seeded_sequence(params, 1234, seed)
    mixed = [SamplingParams(top_p=0.9), SamplingParams(top_k=5), SamplingParams(temperature=1.3),
             SamplingParams(min_p=0.1), SamplingParams(), SamplingParams(top_p=0.5, frequency_penalty=1.0),
             SamplingParams(temperature=0.7, logprobs=3)]
    assert seeded_sequence(params, 1234, seed, position=5, others=mixed) == alone
    greedy_and_plain = [SamplingParams(temperature=0.0)] * 4 + [SamplingParams()] * 3
    assert seeded_sequence(params, 1234, seed, position=0, others=greedy_and_plain) == alone
    assert seeded_sequence(params, 1235, seed) != alone


def test_make_generator() -> None:
    def first(g: torch.Generator) -> list[float]:
        return torch.rand(4, generator=g).tolist()

    assert first(make_generator(7)) == first(make_generator(7)) != first(make_generator(8))
    assert first(make_generator(None)) != first(make_generator(None))
    make_generator(2**70), make_generator(-1)  # any Python int is accepted


# ----- logprobs -----

def test_logprobs_come_from_raw_logits(seed: int) -> None:
    vocab = 50
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(5, vocab + 3, generator=g) * 2  # three padded columns
    before = logits.clone()
    rows = [
        make_row(temperature=0.5, presence_penalty=1.0, logit_bias={3: 5.0}, output=(1, 2, 2), logprobs=5, seed=1),
        make_row(logprobs=0, seed=2),
        make_row(seed=3),
        make_row(temperature=0.0, repetition_penalty=1.5, prompt=(0, 1, 2, 3), logprobs=20),
        make_row(top_k=2, temperature=1.5, logprobs=3, seed=4),
    ]
    out = Sampler(vocab, [0])(logits, rows)
    assert torch.equal(logits, before), "the caller's logits were modified"
    expected = torch.log_softmax(logits[:, :vocab].double(), dim=-1)
    assert out.logprobs[2] is None
    assert out.logprobs[1] is not None and out.logprobs[1].top == []
    for i, k in [(0, 5), (1, 0), (3, 20), (4, 3)]:
        lp = out.logprobs[i]
        token = out.token_ids[i]
        assert lp.token_id == token
        assert lp.logprob == pytest.approx(expected[i, token].item(), abs=1e-5)
        top_values, top_ids = expected[i].topk(k)
        assert [t for t, _ in lp.top] == top_ids.tolist()
        assert [v for _, v in lp.top] == pytest.approx(top_values.tolist(), abs=1e-5)


def test_empty_batch_and_shape_checks() -> None:
    sampler = Sampler(8, [])
    assert sampler(torch.empty(0, 8), []).token_ids == []
    with pytest.raises(ValueError):
        sampler(torch.zeros(2, 7), [make_row(), make_row()])
    with pytest.raises(ValueError):
        sampler(torch.zeros(1, 8), [make_row(), make_row()])
    assert math.isfinite(sampler(torch.zeros(1, 8), [make_row(logprobs=1)]).logprobs[0].logprob)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_greedy_tokens_take_each_rows_first_maximum(test_seed, dtype):
    """NumPy's argmax on float32 CPU rows, torch's max otherwise: the same first-maximum rule as torch.argmax, on
    rows with ties, -inf, a row of all -inf, and a strided view (the vocabulary sliced off padded logits)."""
    g = torch.Generator().manual_seed(test_seed)
    logits = (torch.randn(9, 1000, generator=g) * 3).round().to(dtype)  # rounding makes ties common
    logits[1, ::2] = float("-inf")
    logits[2] = float("-inf")
    top = logits[3].max()
    logits[3, [5, 700]] = top + 1  # a tie between two maxima: the first wins
    padded = torch.cat([logits, torch.full((9, 24), 1e9, dtype=dtype)], dim=1)
    for view in (logits, padded[:, :1000]):
        got = greedy_tokens(view)
        assert got.dtype == torch.int64
        assert torch.equal(got, view.float().argmax(dim=-1))
    assert greedy_tokens(logits)[3] == 5
