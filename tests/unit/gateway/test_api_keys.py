"""API keys: the keys file's syntax and its errors, key lookup, and per-key concurrency limits."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from gateway.cli import main as cli_main
from gateway.server.auth import ANONYMOUS, ApiKey, KeyRing, KeysFileError, load_keys, parse_keys
from gateway.server.errors import ApiError
from gateway.server.key_limits import KeyLimits

GOOD = """
# team keys
sk-team-a-0123456789   name=team-a  weight=3  max_concurrent=16
  sk-team-b            name=team-b            # only a name
sk-batch  weight=0.5
sk-with=equals#hash max_concurrent=1
"""


def test_a_keys_file_parses_with_defaults_and_comments():
    keys = parse_keys(GOOD, "keys.txt")
    assert keys["sk-team-a-0123456789"] == ApiKey("team-a", 3.0, 16)
    assert keys["sk-team-b"] == ApiKey("team-b", 1.0, None)
    assert keys["sk-batch"].weight == 0.5 and keys["sk-batch"].max_concurrent is None
    assert keys["sk-batch"].name.startswith("key-") and "batch" not in keys["sk-batch"].name  # no secret in it
    assert keys["sk-with=equals#hash"].max_concurrent == 1  # the key is the first field, whatever it holds
    assert len(keys) == 4


@pytest.mark.parametrize("line, problem", [
    ("sk-a weight=0", "weight must be a number > 0"),
    ("sk-a weight=-1", "weight must be a number > 0"),
    ("sk-a weight=nan", "weight must be a number > 0"),
    ("sk-a weight=inf", "weight must be a number > 0"),
    ("sk-a weight=1001", "weight must be a number > 0 and <= 1000"),
    ("sk-a weight=heavy", "weight must be a number"),
    ("sk-a max_concurrent=0", "max_concurrent must be an integer >= 1"),
    ("sk-a max_concurrent=2.5", "max_concurrent must be an integer >= 1"),
    ("sk-a max_concurrent=", "max_concurrent must be an integer >= 1"),
    ("sk-a max_concurrent=²", "max_concurrent must be an integer >= 1"),  # a digit to str.isdigit, not to int()
    ("sk-a name=", "name must be 1-64"),
    ("sk-a name=tëam", "name must be 1-64"),
    ("sk-a name=" + "x" * 65, "name must be 1-64"),
    ("sk-a priority=9", "unknown option 'priority'"),
    ("sk-a weight", "expected OPTION=VALUE"),
    ("sk-a weight=1 weight=2", "weight given twice"),
    ("sk-ä", "printable ASCII"),
])
def test_a_bad_line_is_an_error_naming_it(line, problem):
    with pytest.raises(KeysFileError, match=problem) as info:
        parse_keys(f"# header\nsk-ok name=ok\n{line}\n", "keys.txt")
    assert str(info.value).startswith("keys.txt line 3: ")


def test_duplicate_keys_and_names_are_errors():
    with pytest.raises(KeysFileError, match="line 2: this key is already listed"):
        parse_keys("sk-a\nsk-a name=other\n", "k")
    with pytest.raises(KeysFileError, match="line 2: the name 'x' is already used on line 1"):
        parse_keys("sk-a name=x\nsk-b name=x\n", "k")


def test_api_key_and_keys_file_combine(tmp_path):
    path = tmp_path / "keys.txt"
    path.write_text("sk-a name=a weight=2\n")
    keys = load_keys("sk-single", str(path))
    assert keys == {"sk-a": ApiKey("a", 2.0), "sk-single": ApiKey("default")}
    assert load_keys("sk-single", None) == {"sk-single": ApiKey("default")}
    assert load_keys(None, None) == {}
    with pytest.raises(KeysFileError, match="also listed"):
        load_keys("sk-a", str(path))
    path.write_text("# nothing\n\n")
    with pytest.raises(KeysFileError, match="no keys"):
        load_keys(None, str(path))
    with pytest.raises(KeysFileError, match="cannot read"):
        load_keys(None, str(tmp_path / "missing.txt"))


def test_lookup_takes_only_a_bearer_with_a_listed_key():
    ring = KeyRing(parse_keys(GOOD, "k"))
    assert ring.required and ring.lookup(b"Bearer sk-team-b") == ApiKey("team-b")
    for header in (b"", b"sk-team-b", b"Bearer", b"Bearer ", b"bearer sk-team-b", b"Bearer sk-team-", b"Bearer sk-team-bb",
                   b"Bearer  sk-team-b", b"Basic sk-team-b"):
        assert ring.lookup(header) is None, header
    assert not KeyRing({}).required


def test_a_key_over_its_limit_gets_429_with_retry_after():
    limits = KeyLimits([ApiKey("a", max_concurrent=2), ApiKey("b")], CollectorRegistry(), "m")
    a, b = ApiKey("a", max_concurrent=2), ApiKey("b")
    first = limits.acquire(a, arrival=0.0)  # arrived long ago (monotonic 0): its age makes the estimate
    second = limits.acquire(a)
    with pytest.raises(ApiError) as info:
        limits.acquire(a)
    error = info.value
    assert error.status == 429 and error.body()["error"]["code"] == "rate_limit_exceeded"
    assert int(error.headers["Retry-After"]) >= 1
    leases = [limits.acquire(b) for _ in range(50)]  # no limit, and another key's count is its own
    assert limits.num_in_flight(a) == 2 and limits.num_in_flight(b) == 50
    first.release()
    first.release()  # idempotent
    assert limits.num_in_flight(a) == 1
    third = limits.acquire(a)  # a place came back
    for lease in (second, third, *leases):
        lease.release()
    assert limits.num_in_flight(a) == 0 and limits.num_in_flight(ANONYMOUS) == 0


def test_retry_after_follows_the_keys_recent_durations(monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr("gateway.server.key_limits.time.monotonic", lambda: clock[0])
    key = ApiKey("a", max_concurrent=4)
    limits = KeyLimits([key], CollectorRegistry(), "m")
    for _ in range(8):  # requests of the key took 20 s each
        lease = limits.acquire(key)
        clock[0] += 20.0
        lease.release()
    held = [limits.acquire(key) for _ in range(4)]
    with pytest.raises(ApiError) as info:
        limits.acquire(key)
    assert info.value.headers["Retry-After"] == "5"  # 4 in flight, 20 s each: one ends every 5 s
    for lease in held:
        lease.release()


def test_a_bad_keys_file_stops_mili_serve_before_loading_the_model(tmp_path, capsys):
    path = tmp_path / "keys.txt"
    path.write_text("sk-good name=good\nsk-bad weight=zero\n")
    # The model does not exist: the keys file is read (and refused) first.
    assert cli_main(["serve", "--model", str(tmp_path / "no-model"), "--api-keys-file", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"mili serve: {path} line 2: weight must be a number" in err
    assert "Traceback" not in err
