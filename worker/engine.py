"""The engine: requests in, tokens out, one `step()` at a time (schedule -> execute -> sample -> update).

The worker process drives it: `add_request`, `abort_request`, `abort_choice` and `step` from one thread.
Everything here speaks token ids; text belongs to the gateway.

`max_tokens=0` scores a prompt without generating: the request finishes with "length" once its prompt
is computed (at once when it asked for no prompt logprobs).

Under --task embed|score every request is such a prefill-only sequence, and finishes ("stop") with its pooled
vector (worker/runner/pooler.py) once its prompt is computed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from itertools import chain
from pathlib import Path

import torch

from kernels.builder.gpu_modules import GpuShape
from shared.config import EngineConfig
from shared.gguf_import.records import SOURCE_RECORD
from shared.pooling_config import read_pooling_config
from shared.request_limits import OutOfBounds, check_prompt_fits
from shared.sampling_params import SamplingParams, SamplingParamsError
from shared.wire import WorkerStats
from worker.attention.selection import get_attention_backend
from worker.checkpoint.model_config import ModelConfig
from worker.core.block_manager import BlockManager
from worker.core.deadlines import DeadlineQueue
from worker.core.kv_audit import KV_AUDIT_EVERY_STEPS, KvAuditor, inject_fault
from worker.core.scheduler import ScheduledBatch, Scheduler
from worker.core.sequence import Sequence
from worker.model.devices import resolve_device
from worker.model.dtype import resolve_dtype
from worker.model.ops_selection import get_layer_ops
from worker.model.packed_linear import packing_supported
from worker.model.weight_loader import load_model
from worker.outputs import Completion, RequestRejected, SequenceOutput
from worker.quant.linear import kernel_module
from worker.quant.row_modes import prompt_rows_apart
from worker.quant.sources import plan_quantization
from worker.runner.kv_cache import allocate_kv_caches, num_blocks_for_memory, resolve_kv_dtype
from worker.runner.model_runner import ModelRunner
from worker.runner.pooler import Pooler
from worker.runner.sampler import Sampler, make_generator
from worker.runner.structured_output import GrammarCompiler, GrammarError
from worker.spec.speculator import Speculator, make_proposer
from worker.spec.verify import sample_and_verify

log = logging.getLogger(__name__)


class LLMEngine:
    def __init__(self, config: EngineConfig):
        self.config = config
        self.model_config = mc = ModelConfig.from_dir(config.model, config.hf_overrides)
        # Everything the engine allocates goes to this device; config.device may say "auto".
        self.device = resolve_device(config.device)
        self.dtype = resolve_dtype(config.dtype, self.device.type)
        if mc.num_labels and config.task == "generate":
            raise ValueError(f"{mc.architecture.replace('ForCausalLM', 'ForSequenceClassification')} has no LM head to "
                             "generate with; serve it with --task score")
        self.kv_dtype = resolve_kv_dtype(config.kv_cache_dtype, self.dtype, config.dtype)
        if self.kv_dtype != self.dtype and self.device.type != "cpu":
            raise ValueError(f"a kv cache of {self.kv_dtype} beside a {self.dtype} model is served on the CPU, "
                             f"not on {self.device}")
        self.max_model_len = config.max_model_len or mc.context_length
        if self.max_model_len > mc.context_length:
            raise ValueError(f"max_model_len {self.max_model_len} exceeds the model's context length "
                             f"{mc.context_length} ({mc.context_length_source})")
        self.attention_backend = get_attention_backend(
            config.attention_backend, self.device, GpuShape(mc.num_heads, mc.num_kv_heads, mc.head_dim), self.dtype,
            config.block_size, self.kv_dtype)
        self.layer_ops = get_layer_ops(self.attention_backend, mc, self.device, self._compile_layer_ops())
        quant = self._quant_plan()
        if quant is not None:
            quant.activations = config.activation_mode
        self.quantization = "none" if quant is None else quant.summary()
        # What /health reports beside it: "none" where no weight is quantized (the flag then changes nothing).
        self.activation_quantization = "none" if quant is None else quant.activations
        model = load_model(config.model, mc, self.attention_backend, self.dtype, self.max_model_len,
                           device=self.device, ops=self.layer_ops, quant=quant)
        if packing_supported(self.dtype, self.device):
            # An embedding model never computes logits: no packed head (vocab x hidden, 300 MB for Qwen3-0.6B).
            model.pack_linear_weights(batch_hint=config.max_num_seqs, head=config.task != "embed")
        self.pooler = None if config.task == "generate" else Pooler(read_pooling_config(config.model, config.task),
                                                                      model)
        num_blocks = config.num_kv_blocks or num_blocks_for_memory(mc, config.block_size, self.kv_dtype,
                                                                    config.kv_cache_memory)
        self.max_model_len = self._fit_context_to_cache(num_blocks * config.block_size)
        self.block_manager = BlockManager(num_blocks, config.block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(self.block_manager, config.max_num_seqs, config.max_num_batched_tokens,
                                   config.scheduling_policy)
        graphs_off = self._graphs_off_reason()
        # With decode graphs, one block more than the block manager hands out: the scratch block, where the
        # padded rows of a graph step write (worker/runner/decode_graphs.py).
        spare = 1 if graphs_off is None else 0
        kv_caches = allocate_kv_caches(mc, num_blocks + spare, config.block_size, self.kv_dtype, self.device)
        # Pooling runs prefill only: no decode step ever comes for the decode program or graphs to serve.
        self.runner = ModelRunner(model, kv_caches, config.block_size, self.device,
                                  decode_program=config.decode_program and self.pooler is None,
                                  max_num_seqs=config.max_num_seqs, max_model_len=self.max_model_len,
                                  reads_every_row=self.pooler is not None,
                                  prompt_rows_apart=quant is not None and prompt_rows_apart(quant.activations))
        if graphs_off is None:
            self.runner.use_decode_graphs(scratch_block=num_blocks, max_rows=config.max_num_seqs,
                                          max_model_len=self.max_model_len, capture=self.device.type == "cuda")
        else:
            self.runner.decode_graphs_off(graphs_off)
        self.eos_token_ids = frozenset(mc.eos_token_ids)
        self.sampler = Sampler(mc.vocab_size, self.eos_token_ids)
        self.grammars = GrammarCompiler(config.model, mc.vocab_size, self.eos_token_ids)
        self._requests: dict[str, list[Sequence]] = {}
        # Choices 1..n-1 of a request wait until choice 0 (the leader) has prefilled the prompt, then
        # share its blocks. Any scheduled sequence of a request that still has forks here is its leader.
        self._forks: dict[str, list[Sequence]] = {}
        self._pending: list[SequenceOutput] = []  # aborts to report on the next step
        self.kv_audit = KvAuditor(self.block_manager, KV_AUDIT_EVERY_STEPS)
        self._deadlines = DeadlineQueue()
        spec = config.speculative_config
        self.speculator = None if spec is None else Speculator(spec, self.max_model_len, make_proposer(
            spec, target_vocab_size=mc.vocab_size, max_model_len=self.max_model_len, device=self.device,
            dtype=self.dtype, attention_backend=self.attention_backend, block_size=config.block_size,
            num_blocks=num_blocks))
        self.speculative = "off" if spec is None else spec.describe()
        log.info("engine ready: %s on %s, dtype %s, attention %s, layer ops %s, quantization %s, %d KV blocks of %d "
                 "tokens in %s, max_model_len %d, decode steps as one kernel program: %s, as CUDA graphs: %s, "
                 "speculative decoding: %s", mc.architecture, self.device, self.dtype, self.attention_backend.describe(),
                 self.layer_ops.name, "none" if quant is None else quant.describe(),
                 num_blocks, config.block_size, self.kv_dtype, self.max_model_len, self.runner.decode_program_status,
                 self.runner.decode_graphs_status, self.speculative)

    def _compile_layer_ops(self) -> bool:
        if self.config.compile_layer_ops is not None:
            return self.config.compile_layer_ops
        return self.device.type == "cuda" and not self.config.enforce_eager

    def _graphs_off_reason(self) -> str | None:
        """Why decode steps do not replay CUDA graphs here, or None when they do."""
        if self.device.type != "cuda":
            return "not on a CUDA device"
        if self.pooler is not None:
            return f"--task {self.config.task} runs prefill only"
        return "enforce_eager is set" if self.config.enforce_eager else None

    def _quant_plan(self):
        """What `quantization` asks for, where the kernels can serve it: auto falls back to none (with a
        warning) where they cannot; an explicit q8_0/q4_0 is an error there."""
        mode = self.config.quantization
        if mode == "none":
            return None
        if self.device.type != "cpu":
            if mode != "auto":  # EngineConfig refuses this for "cuda"; "auto" may have resolved to it
                raise ValueError(f"quantization {mode} needs the CPU kernels; on {self.device} use auto or none")
            if (Path(self.config.model) / SOURCE_RECORD).is_file():
                log.warning("the quantized-weight kernels are CPU kernels: on %s the GGUF's weights serve "
                            "dequantized to %s (as --quantization none)", self.device, self.dtype)
            return None
        usable = self.dtype in (torch.float32, torch.bfloat16) \
            and kernel_module() is not None
        if not usable:
            if mode != "auto":
                raise ValueError(f"quantization {mode} needs the Mojo quantized-weight kernels, which cannot run "
                                 "here (the log says why)")
            log.warning("quantized weights cannot be served here; the model runs in %s", self.dtype)
            return None
        return plan_quantization(self.config.model, self.model_config, mode)

    def _fit_context_to_cache(self, cache_tokens: int) -> int:
        """A request up to max_model_len must fit the whole cache alone, or it could never finish."""
        if cache_tokens >= self.max_model_len:
            return self.max_model_len
        if self.config.max_model_len is not None:
            raise ValueError(f"max_model_len {self.max_model_len} does not fit the KV cache ({cache_tokens} tokens); "
                             "raise --num-kv-blocks or --kv-cache-memory, or lower --max-model-len")
        log.warning("max_model_len lowered from %d to %d tokens, all the KV cache holds",
                    self.max_model_len, cache_tokens)
        return cache_tokens

    # ----- requests -----
    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                    deadline: float | None = None, tenant: str = "", tenant_weight: float = 1.0) -> None:
        """Queue a request, or raise RequestRejected if it can never be served. Past `deadline` (a
        time.monotonic() value) the request ends with finish reason "deadline", queued or running.
        `tenant` (an API key's name) and its weight (> 0) decide its share when several tenants wait."""
        prompt = [int(t) for t in prompt_token_ids]
        max_tokens = self._validate(request_id, prompt, params)
        if not tenant_weight > 0 or tenant_weight == float("inf"):
            raise RequestRejected(f"tenant weight must be a positive number, got {tenant_weight}")
        seqs = [Sequence(request_id, i, prompt, params, max_tokens,
                         make_generator(None if params.seed is None else params.seed + i, self.device), tenant,
                         tenant_weight)
                for i in range(params.n)]
        if params.grammar is not None:
            try:
                seqs[0].grammar = self.grammars.sequence_grammar(params.grammar)
            except GrammarError as e:
                raise RequestRejected(f"the grammar does not compile: {e}", "response_format") from e
            for seq in seqs[1:]:  # compiled once; each choice follows its own copy
                seq.grammar = seqs[0].grammar.copy()
        if deadline is not None:
            for seq in seqs:
                seq.deadline = deadline
            self._deadlines.add(request_id, deadline)
        self._requests[request_id] = seqs
        if self.pooler is not None:
            self.pooler.prepare(seqs[0])
        elif max_tokens == 0 and params.prompt_logprobs is None:
            for seq in seqs:  # nothing to compute
                self.scheduler.finish(seq, "length")
                self._pending.append(self._output(seq, [], None))
            del self._requests[request_id]
            return
        self.scheduler.add(seqs[0])
        if len(seqs) > 1:
            self._forks[request_id] = seqs[1:]

    def _validate(self, request_id: str, prompt: list[int], params: SamplingParams) -> int:
        if request_id in self._requests:
            raise RequestRejected(f"request id {request_id!r} is already in use")
        if not prompt:
            raise RequestRejected("the prompt is empty", "prompt")
        if self.pooler is not None and (params.max_tokens != 0 or params.n != 1 or params.prompt_logprobs is not None):
            raise RequestRejected(f"this worker runs --task {self.config.task}: a request computes its prompt only "
                                  "(max_tokens 0, n 1, no prompt logprobs)")
        vocab = self.model_config.vocab_size
        try:
            params.check_token_ids(vocab)
            check_prompt_fits(prompt, params.max_tokens, vocab, self.max_model_len)
        except (OutOfBounds, SamplingParamsError) as e:
            raise RequestRejected(str(e), e.param) from e
        max_tokens = params.max_tokens if params.max_tokens is not None else self.max_model_len - len(prompt)
        # No check against the cache size is needed: __init__ made sure one max_model_len sequence fits.
        return max_tokens

    def abort_request(self, request_id: str) -> None:
        """Stop a request in any state; its blocks are free when this returns. Unknown ids are ignored
        (the request may just have finished)."""
        seqs = self._requests.pop(request_id, None)
        self._forks.pop(request_id, None)
        for seq in seqs or ():
            if not seq.is_finished:
                self.scheduler.finish(seq, "abort")
                self._pending.append(self._output(seq, [], None))

    def _expire_deadlines(self) -> None:
        """Stop every request whose deadline passed, queued ones before they cost any compute; like an
        abort, their blocks are free at once."""
        for request_id, deadline in self._deadlines.expired(time.monotonic()):
            seqs = self._requests.get(request_id)
            if not seqs or seqs[0].deadline != deadline:
                continue  # finished already (or an id reused since)
            del self._requests[request_id]
            self._forks.pop(request_id, None)
            for seq in seqs:
                if not seq.is_finished:
                    self.scheduler.finish(seq, "deadline")
                    self._pending.append(self._output(seq, [], None))

    def abort_choice(self, request_id: str, index: int) -> None:
        """Stop one choice of a request (it ended on a stop string in the gateway) while the others run on;
        its blocks are free when this returns. Unknown or finished choices are ignored."""
        seqs = self._requests.get(request_id)
        if seqs is None or not 0 <= index < len(seqs) or seqs[index].is_finished:
            return
        seq = seqs[index]
        forks = self._forks.get(request_id)
        if forks and seq in forks:
            forks.remove(seq)  # parked: it never ran
        elif forks:
            # The leader goes before it prefilled the prompt: the first parked choice takes its place.
            leader = forks.pop(0)
            if seq.prompt_logprobs is not None:
                leader.prompt_logprobs = []
            self.scheduler.add_front([leader])
        if forks == []:
            del self._forks[request_id]
        self.scheduler.finish(seq, "abort")
        self._pending.append(self._output(seq, [], None))
        self._forget_if_done(request_id)

    def has_unfinished_requests(self) -> bool:
        return bool(self._requests) or bool(self._pending)

    # ----- the loop -----
    def step(self) -> list[SequenceOutput]:
        self._expire_deadlines()
        outputs, self._pending = self._pending, []
        batch = self.scheduler.schedule()
        if not batch.seqs:
            return outputs
        inputs = self.runner.prepare(batch)
        result = self.runner.execute(inputs)
        groups = _row_groups(inputs.sampling_rows)
        picks = sample_and_verify(self.sampler, result.logits, [(batch.seqs[i], n) for i, _, n in groups],
                                  self.speculator)
        for i, entries in result.prompt_logprobs.items():
            batch.seqs[i].prompt_logprobs.extend(entries)
        if self.pooler is not None:
            self.pooler.collect(batch, result.hidden)
        finished, emitting, verified = [], [], []
        for (i, _, count), (tokens, logprobs) in zip(groups, picks):
            seq = batch.seqs[i]
            # Tokens go in before _advance: the prefix-cache digests it adds cover accepted drafts.
            reason, num_out = self._append_tokens(seq, tokens)
            if count > 1:
                # The KV of the last token and of the accepted drafts stays; the rejected drafts' slots are
                # rolled back (overwritten by later steps) and their blocks released below.
                batch.num_new_tokens[i] = num_out
                verified.append(seq)
            if reason is not None:
                finished.append((seq, reason))
            emitting.append((seq, tokens[:num_out], None if logprobs[0] is None else logprobs[:num_out]))
        self._advance(batch)
        for seq in verified:
            self.block_manager.trim(seq)
        for seq, reason in finished:
            self.scheduler.finish(seq, reason)
        for seq, tokens, logprobs in emitting:
            outputs.append(self._output(seq, tokens, logprobs))
            if seq.is_finished:
                self._forget_if_done(seq.request_id)
        if self.speculator is not None:
            self.speculator.draft([seq for seq, _, _ in emitting if not seq.is_finished])
        outputs.extend(self._finish_scored_prompts(batch))
        self.kv_audit.after_step(self._live_sequences())
        return outputs

    def _finish_scored_prompts(self, batch: ScheduledBatch) -> list[SequenceOutput]:
        """max_tokens 0: a request is done once its prompt is computed; its other choices (parked or just
        released) end with it, without running."""
        outputs = []
        for seq in batch.seqs:
            if seq.max_tokens == 0 and not seq.is_finished and seq.num_computed_tokens >= seq.num_prompt_tokens:
                for s in self._requests[seq.request_id]:
                    if not s.is_finished:
                        self.scheduler.finish(s, "length" if self.pooler is None else "stop")
                        outputs.append(self._output(s, [], None))
                self._forks.pop(seq.request_id, None)
                del self._requests[seq.request_id]
        return outputs

    def _advance(self, batch: ScheduledBatch) -> None:
        for seq, n in zip(batch.seqs, batch.num_new_tokens):
            seq.num_computed_tokens += n
            self.block_manager.register_computed_blocks(seq)
            if seq.num_computed_tokens >= seq.num_prompt_tokens:
                forks = self._forks.pop(seq.request_id, None)
                if forks:
                    self.scheduler.add_front(forks)

    def _append_tokens(self, seq: Sequence, tokens: list[int]) -> tuple[str | None, int]:
        """Append tokens up to the first that finishes seq: (finish reason or None, tokens appended)."""
        for n, token in enumerate(tokens, 1):
            seq.token_ids.append(token)
            grammar_done = seq.grammar is not None and self._advance_grammar(seq, token)
            reason = self._finish_reason(seq, token)
            if grammar_done and reason in (None, "length"):
                reason = "stop"
            if reason is not None:
                return reason, n
        return None, len(tokens)

    def _finish_reason(self, seq: Sequence, token: int) -> str | None:
        params = seq.params
        if token in params.stop_token_ids or (token in self.eos_token_ids and not params.ignore_eos):
            seq.stop_token_id = token
            return "stop"
        if seq.num_output_tokens >= seq.max_tokens or seq.num_tokens >= self.max_model_len:
            return "length"
        return None

    @staticmethod
    def _advance_grammar(seq: Sequence, token: int) -> bool:
        """True when the grammar is complete: only the end could follow, so the sequence stops."""
        try:
            return seq.grammar.advance(token)
        except GrammarError:
            # The sampler only draws allowed tokens, so this is a bug; end the choice rather than the engine.
            log.exception("request %s: the grammar refused a sampled token", seq.request_id)
            return True

    def _forget_if_done(self, request_id: str) -> None:
        seqs = self._requests.get(request_id)
        if seqs is not None and all(s.is_finished for s in seqs):
            del self._requests[request_id]

    @staticmethod
    def _output(seq: Sequence, tokens: list[int], logprobs) -> SequenceOutput:
        prompt_logprobs = None
        if seq.prompt_logprobs_complete and seq.finish_reason != "abort":
            prompt_logprobs, seq.prompt_logprobs = seq.prompt_logprobs, None  # sent once
        return SequenceOutput(
            request_id=seq.request_id, index=seq.index, new_token_ids=tokens, logprobs=logprobs,
            finish_reason=seq.finish_reason, num_prompt_tokens=seq.num_prompt_tokens,
            num_cached_tokens=seq.num_cached_prompt_tokens or 0, stop_token_id=seq.stop_token_id,
            queue_time=seq.queue_time, prompt_logprobs=prompt_logprobs, pooled=seq.pooled)

    # ----- observability -----
    def _live_sequences(self) -> Iterable[Sequence]:
        return chain.from_iterable(self._requests.values())

    def check_kv(self) -> None:
        """Audit (and repair) the KV block accounting now, outside the every-N-steps rhythm."""
        self.kv_audit.check(self._live_sequences())

    def kv_ledger(self) -> dict:
        """Per-request block tables and the cache's totals (GET /debug/kv)."""
        return self.kv_audit.ledger(self._requests)

    def inject_kv_fault(self, kind: str) -> str:
        """Break the block accounting on purpose (--enable-debug-faults only): the audit must repair it."""
        return inject_fault(self.block_manager, kind, self._live_sequences())

    def stats(self) -> WorkerStats:
        bm, sch = self.block_manager, self.scheduler
        return WorkerStats(
            num_running=len(sch.running), num_waiting=len(sch.waiting) + sum(map(len, self._forks.values())),
            kv_blocks_total=bm.num_blocks, kv_blocks_used=bm.num_used_blocks,
            prefix_cache_query_tokens=sch.prefix_query_tokens, prefix_cache_hit_tokens=sch.prefix_hit_tokens,
            num_preemptions=sch.num_preemptions, kv_invariant_violations=self.kv_audit.num_violations,
            **({} if self.speculator is None else self.speculator.counters.wire_fields()))

    # ----- offline use -----
    def generate(self, prompts: list[list[int]], params: SamplingParams | Iterable[SamplingParams]) -> list[Completion]:
        """Run prompts to completion; results in prompt order."""
        params_list = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
        results: dict[str, Completion] = {}
        for i, (prompt, p) in enumerate(zip(prompts, params_list, strict=True)):
            rid = f"generate-{id(results)}-{i}"
            self.add_request(rid, prompt, p)
            results[rid] = Completion(rid, len(prompt), [[] for _ in range(p.n)], [[] for _ in range(p.n)],
                                      [None] * p.n)
        while any(r.finish_reasons.count(None) for r in results.values()):
            for out in self.step():
                result = results[out.request_id]
                result.token_ids[out.index].extend(out.new_token_ids)
                result.logprobs[out.index].extend(out.logprobs or ())
                result.num_cached_tokens = out.num_cached_tokens
                if out.finish_reason is not None:
                    result.finish_reasons[out.index] = out.finish_reason
                if out.prompt_logprobs is not None:
                    result.prompt_logprobs = out.prompt_logprobs
        return list(results.values())



def _row_groups(sampling_rows: list[int]) -> list[tuple[int, int, int]]:
    """(batch index, first logits row, rows) per sampling sequence: one row, or k + 1 for a verification."""
    groups: list[tuple[int, int, int]] = []
    for row, i in enumerate(sampling_rows):
        if groups and groups[-1][0] == i:
            groups[-1] = (i, groups[-1][1], groups[-1][2] + 1)
        else:
            groups.append((i, row, 1))
    return groups
