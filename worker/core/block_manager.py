"""Paged KV-cache blocks: reference counts, an O(1) free list and prefix sharing of full blocks.

Plain Python, no torch: the scheduler consults it every step and tests drive it directly.

A full block is identified by a chained digest, blake2b(parent digest + its token ids [+ how many of
them its sequence generated]), so equal digests mean equal whole prefixes computed alike; each cached
block also keeps its token ids and a hit is verified against them. Generated positions are counted
because they are not the same bits as the same tokens computed as a prompt (a generated token's row
attends as a one-token decode, a prompt's as part of a chunk): a new request whose prompt repeats an
earlier request's output (the next turn of a chat) computes those blocks afresh, as it would with an
empty cache, so its output never depends on what the cache held. Blocks nothing references but that
hold a digest stay cached, evicted least recently freed first when fresh blocks run out. Invariant: used + cached-free + free == total (audited while
serving by worker/core/kv_audit.py).
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict, deque

from worker.core.sequence import Sequence


class Block:
    __slots__ = ("block_id", "ref_count", "digest", "token_ids", "last_owner")

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_count = 0
        self.digest: bytes | None = None
        self.token_ids: tuple[int, ...] | None = None
        self.last_owner: str | None = None  # request that last took it fresh (names the culprit of a leak)


def block_digest(parent: bytes, token_ids: list[int] | tuple[int, ...], generated: int = 0) -> bytes:
    """generated: how many of the block's positions its sequence generated (none for a prompt's blocks)."""
    data = parent + array("q", token_ids).tobytes()
    if generated:
        data += b"generated" + generated.to_bytes(4, "little")
    return hashlib.blake2b(data, digest_size=16).digest()


def generated_positions(seq: Sequence, block_index: int, block_size: int) -> int:
    """How many positions of seq's block `block_index` hold tokens it generated (past its prompt)."""
    start, end = block_index * block_size, (block_index + 1) * block_size
    return max(0, end - max(start, seq.num_prompt_tokens))


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need at least one block of at least one token, got {num_blocks} x {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self._free: deque[int] = deque(range(num_blocks))  # hold nothing worth keeping
        self._cached_free: OrderedDict[int, None] = OrderedDict()  # unreferenced, digest kept; LRU first
        self._by_digest: dict[bytes, int] = {}

    # ----- accounting -----
    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation can take: truly free plus evictable cached ones."""
        return len(self._free) + len(self._cached_free)

    @property
    def num_cached_free_blocks(self) -> int:
        return len(self._cached_free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # ----- prefix cache -----
    def match_prefix(self, seq: Sequence) -> list[int]:
        """Cached blocks holding a prefix of seq's tokens. At least one token is always left to compute,
        because the model must run on the last one to produce logits."""
        if not self.enable_prefix_caching:
            return []
        hits: list[int] = []
        parent = b""
        tokens = seq.token_ids
        for i in range((len(tokens) - 1) // self.block_size):
            chunk = tokens[i * self.block_size:(i + 1) * self.block_size]
            digest = block_digest(parent, chunk, generated_positions(seq, i, self.block_size))
            block_id = self._by_digest.get(digest)
            if block_id is None or self.blocks[block_id].token_ids != tuple(chunk):
                break
            hits.append(block_id)
            parent = digest
        return hits

    def register_computed_blocks(self, seq: Sequence) -> None:
        """Give every newly full and computed block of seq its digest so later requests can share it."""
        full = min(seq.num_computed_tokens // self.block_size, len(seq.block_table))
        while len(seq.block_hashes) < full:
            i = len(seq.block_hashes)
            chunk = seq.token_ids[i * self.block_size:(i + 1) * self.block_size]
            parent = seq.block_hashes[-1] if seq.block_hashes else b""
            digest = block_digest(parent, chunk, generated_positions(seq, i, self.block_size))
            seq.block_hashes.append(digest)
            block = self.blocks[seq.block_table[i]]
            if self.enable_prefix_caching and block.digest is None and digest not in self._by_digest:
                block.digest, block.token_ids = digest, tuple(chunk)
                self._by_digest[digest] = block.block_id

    # ----- allocation -----
    def holds(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Whether seq's blocks already have room for num_new_tokens more (allocate would take none)."""
        return seq.num_computed_tokens + num_new_tokens <= len(seq.block_table) * self.block_size

    def can_allocate(self, seq: Sequence, num_new_tokens: int, prefix_hits: list[int] = ()) -> bool:
        """Whether seq can hold num_new_tokens more (after taking prefix_hits, for a sequence without blocks)."""
        have = len(seq.block_table) + len(prefix_hits)
        computed = seq.num_computed_tokens + len(prefix_hits) * self.block_size
        need = self.blocks_for(computed + num_new_tokens) - have
        # A hit on an unreferenced cached block takes it out of the free pool too.
        revived = sum(1 for b in prefix_hits if self.blocks[b].ref_count == 0)
        return need <= self.num_free_blocks - revived

    def allocate(self, seq: Sequence, num_new_tokens: int, prefix_hits: list[int] = ()) -> None:
        if not self.can_allocate(seq, num_new_tokens, prefix_hits):
            raise RuntimeError(f"out of KV blocks for {seq}")  # the scheduler checks first
        if prefix_hits:
            assert not seq.block_table, "prefix hits only apply to a sequence without blocks"
            for block_id in prefix_hits:
                self._take_ref(block_id)
            seq.block_table.extend(prefix_hits)
            seq.block_hashes = [self.blocks[b].digest for b in prefix_hits]
            seq.num_computed_tokens = len(prefix_hits) * self.block_size
        need = self.blocks_for(seq.num_computed_tokens + num_new_tokens) - len(seq.block_table)
        for _ in range(need):
            block_id = self._take_fresh()
            self.blocks[block_id].last_owner = seq.request_id
            seq.block_table.append(block_id)

    def free(self, seq: Sequence) -> None:
        """Drop seq's references. Tail blocks are released first so that, among cached blocks, a shared
        prefix outlives the private continuations hanging off it."""
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            assert block.ref_count >= 0, f"block {block_id} freed more often than taken"
            if block.ref_count == 0:
                if block.digest is not None:
                    self._cached_free[block_id] = None
                else:
                    self._free.append(block_id)
        seq.block_table = []
        seq.block_hashes = []
        seq.num_computed_tokens = 0

    def trim(self, seq: Sequence) -> None:
        """Release seq's blocks past its tokens: the ones only rejected speculative tokens were written to.
        They were taken fresh and, never fully computed, were never given a digest."""
        keep = self.blocks_for(seq.num_tokens)
        while len(seq.block_table) > keep:
            block_id = seq.block_table.pop()
            block = self.blocks[block_id]
            assert block.digest is None or block.ref_count > 1, f"block {block_id} holds a cached prefix"
            block.ref_count -= 1
            if block.ref_count == 0:
                self._free.append(block_id)

    def _take_ref(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.ref_count == 0:
            del self._cached_free[block_id]
        block.ref_count += 1

    def _take_fresh(self) -> int:
        if self._free:
            block_id = self._free.popleft()
        else:
            block_id = self._evict_oldest_cached()
        self.blocks[block_id].ref_count = 1
        return block_id

    def _evict_oldest_cached(self) -> int:
        block_id, _ = self._cached_free.popitem(last=False)
        block = self.blocks[block_id]
        del self._by_digest[block.digest]
        block.digest, block.token_ids = None, None
        return block_id

    def reset_prefix_cache(self) -> None:
        """Forget every unreferenced cached block (e.g. after a weight reload)."""
        while self._cached_free:
            self._free.append(self._evict_oldest_cached())

    def check_invariants(self) -> None:
        used = sum(1 for b in self.blocks if b.ref_count > 0)
        assert used + len(self._cached_free) + len(self._free) == self.num_blocks, (
            used, len(self._cached_free), len(self._free), self.num_blocks)
        assert all(self.blocks[b].ref_count == 0 and self.blocks[b].digest is not None for b in self._cached_free)
        assert all(self.blocks[b].ref_count == 0 and self.blocks[b].digest is None for b in self._free)
        assert all(self.blocks[b].digest == d for d, b in self._by_digest.items())
