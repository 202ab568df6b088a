"""The draft_model method: a smaller model sharing the target's tokenizer guesses the next k tokens,
greedily, in the same worker, with its own paged KV cache.

Each speculating sequence has a shadow Sequence here, holding the draft's blocks (in the draft's own
BlockManager, no prefix caching). Before drafting, the shadow takes the target's tokens; its KV stays
valid for the longest prefix it computed that the target kept (the rejected drafts' slots are simply
overwritten), and the rest (the newly accepted tokens, or the whole prompt the first time) is fed as one
chunk. Then the draft decodes k - 1 more single tokens, every speculating sequence batched in one step.
Its greedy (argmax) guesses make the draft distribution one-hot, so the target's verification
(worker/spec/verify.py) is exact whatever the draft computes. Shadows of finished sequences are freed
at the next drafting.
"""

from __future__ import annotations

import torch

from shared.sampling_params import SamplingParams
from worker.checkpoint.model_config import ModelConfig
from worker.core.block_manager import BlockManager
from worker.core.scheduler import ScheduledBatch
from worker.core.sequence import Sequence, SequenceStatus
from worker.model.ops_selection import get_layer_ops
from worker.model.weight_loader import load_model
from worker.runner.kv_cache import allocate_kv_caches
from worker.runner.model_runner import ModelRunner
from worker.runner.sampler import greedy_tokens


class DraftModelProposer:
    def __init__(self, model_dir: str, target_vocab_size: int, max_model_len: int, device: torch.device,
                 dtype: torch.dtype, attention_backend, block_size: int, num_blocks: int):
        mc = ModelConfig.from_dir(model_dir)
        if mc.vocab_size != target_vocab_size:
            raise ValueError(f"the draft model's vocabulary ({mc.vocab_size}) is not the target's "
                             f"({target_vocab_size}): they must share the tokenizer")
        if mc.context_length < max_model_len:
            raise ValueError(f"the draft model's context length {mc.context_length} ({mc.context_length_source}) "
                             f"is below max_model_len {max_model_len}")
        self.vocab_size = mc.vocab_size
        model = load_model(model_dir, mc, attention_backend, dtype, max_model_len, device=device,
                           ops=get_layer_ops(attention_backend, mc, device))
        self.blocks = BlockManager(num_blocks, block_size, enable_prefix_caching=False)
        self.runner = ModelRunner(model, allocate_kv_caches(mc, num_blocks, block_size, dtype, device), block_size,
                                  device)
        self._shadows: dict[tuple[str, int], tuple[Sequence, Sequence]] = {}  # (request, choice) -> (target, shadow)
        self._params = SamplingParams(temperature=0.0)

    def propose_many(self, wanted: list[tuple[Sequence, int]], crowded: bool = False) -> list[list[int]]:
        """Up to k greedy draft tokens for each (sequence, k). crowded is not used: the acceptance rule
        (worker/spec/acceptance.py) alone keeps a crowded batch's drafts short."""
        self._free_finished()
        shadows = [self._sync(seq) for seq, _ in wanted]
        drafts: list[list[int]] = [[] for _ in wanted]
        active = list(range(len(wanted)))
        for _ in range(max((k for _, k in wanted), default=0)):
            batch = ScheduledBatch()
            for i in active:
                shadow = shadows[i]
                n = shadow.num_tokens - shadow.num_computed_tokens
                if not self.blocks.holds(shadow, n):
                    if not self.blocks.can_allocate(shadow, n):
                        continue  # the draft's cache is full: this sequence drafts no further
                    self.blocks.allocate(shadow, n)
                batch.seqs.append(shadow)
                batch.num_new_tokens.append(n)
            if not batch.seqs:
                break
            inputs = self.runner.prepare(batch)
            logits = self.runner.execute(inputs).logits  # [len(batch), vocab]: each shadow samples once
            tokens = greedy_tokens(logits[:, :self.vocab_size]).tolist()
            next_active = []
            by_shadow = {id(s): t for s, t in zip(batch.seqs, tokens)}
            for i in active:
                shadow = shadows[i]
                token = by_shadow.get(id(shadow))
                if token is None:
                    continue
                shadow.num_computed_tokens = shadow.num_tokens
                shadow.token_ids.append(token)
                drafts[i].append(token)
                if len(drafts[i]) < wanted[i][1]:
                    next_active.append(i)
            active = next_active
        return drafts

    def _sync(self, seq: Sequence) -> Sequence:
        key = (seq.request_id, seq.index)
        entry = self._shadows.get(key)
        if entry is None or entry[0] is not seq:
            if entry is not None:
                self.blocks.free(entry[1])
            shadow = Sequence(seq.request_id, seq.index, seq.token_ids, self._params, 1 << 62, seq.generator)
            shadow.status = SequenceStatus.RUNNING
            shadow.synced = seq.num_tokens
            self._shadows[key] = (seq, shadow)
            return shadow
        shadow = entry[1]
        # Up to its length at the last sync the shadow holds the target's own tokens; past it, drafts.
        common = min(shadow.synced, shadow.num_computed_tokens)
        while common < min(shadow.num_computed_tokens, seq.num_tokens) \
                and shadow.token_ids[common] == seq.token_ids[common]:
            common += 1
        # At least the target's last token is fed: its logits give the first draft.
        shadow.num_computed_tokens = min(common, seq.num_tokens - 1)
        shadow.token_ids = list(seq.token_ids)
        shadow.synced = seq.num_tokens
        return shadow

    def _free_finished(self) -> None:
        for key, (seq, shadow) in list(self._shadows.items()):
            if seq.is_finished:
                self.blocks.free(shadow)
                del self._shadows[key]
