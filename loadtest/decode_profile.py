"""Where one decode step's time goes: torch's profiler over steady decode steps of an engine, the step's wall time
against the time its device is busy (the difference is launch gaps and host work: scheduling, input building,
Python), and the busy time split into matmuls, attention, sampler and the rest.

Each piece of device work (a CUDA kernel or copy; on a CPU, the self time of an operator) is classified by
`classify` from its name and the profiler ranges it was launched in: the attention backend's calls (plan, KV write,
attend) and the sampler run inside ranges this module opens around them (`labelled_ranges`), so the torch
reference's gathers and SDPA count as attention, and the sampler's softmax as sampler. Kernels the profiler cannot
tie to a launching operator (a CUDA graph's replay, say) are classified by name alone: gemm/gemv kernels as matmuls,
flash/fmha/mha kernels (MILI's GPU module's too) as attention.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

RANGE_PREFIX = "mili::"
ATTENTION_RANGE = RANGE_PREFIX + "attention"
SAMPLER_RANGE = RANGE_PREFIX + "sampler"
CATEGORIES = ("matmul", "attention", "sampler", "other")
# Lower-case name fragments. Attention first: "fmha_cutlassF..." is attention, not a matmul.
ATTENTION_NAMES = ("attention", "attn", "flash", "fmha", "mha", "sdpa", "write_kv", "paged")
# cuBLAS(Lt) kernels are gemm/gemv/nvjet/xmma kernels (splitKreduce finishes a split gemm); CPU operators are
# aten::mm, addmm, bmm, matmul, linear (mkldnn::_linear_pointwise for packed bf16 weights).
MATMUL_NAMES = ("gemm", "gemv", "nvjet", "xmma", "cutlass", "cublas", "splitkreduce", "matmul", "aten::mm",
                "aten::addmm", "bmm", "linear")


def classify(name: str, ranges: Iterable[str] = ()) -> str:
    """One of CATEGORIES for a kernel (or CPU operator) `name` launched inside the profiler ranges `ranges`."""
    ranges = set(ranges)
    if ATTENTION_RANGE in ranges:
        return "attention"
    if SAMPLER_RANGE in ranges:
        return "sampler"
    low = name.lower()
    if any(p in low for p in ATTENTION_NAMES):
        return "attention"
    if any(p in low for p in MATMUL_NAMES):
        return "matmul"
    return "other"


@dataclass(frozen=True)
class Activity:
    name: str
    us: float
    ranges: tuple[str, ...]  # the launching operator and its enclosing operators and ranges, innermost first


def _enclosing(event) -> tuple[str, ...]:
    names = []
    while event is not None:
        names.append(event.name)
        event = event.cpu_parent
    return tuple(names)


def activities(events, on_cuda: bool) -> list[Activity]:
    """The profiled device work. On CUDA: every kernel, copy and memset (the ranges the profiler draws on the GPU's
    timeline are not work), tied to its launching operator where the profiler links them. On a CPU: every
    operator's self time."""
    cpu = [e for e in events if e.device_type == DeviceType.CPU and not e.is_async]
    if not on_cuda:
        return [Activity(e.name, e.self_cpu_time_total, _enclosing(e)) for e in cpu]
    annotations = {e.name for e in cpu if getattr(e, "is_user_annotation", False) or e.name.startswith(RANGE_PREFIX)}
    device_us: dict[str, float] = defaultdict(float)
    for e in events:
        if e.device_type == DeviceType.CUDA and e.name not in annotations \
                and not getattr(e, "is_user_annotation", False):
            device_us[e.name] += e.time_range.elapsed_us()
    linked, linked_us = [], defaultdict(float)
    for e in cpu:
        for k in e.kernels:
            if k.name in device_us:
                linked.append(Activity(k.name, k.duration, _enclosing(e)))
                linked_us[k.name] += k.duration
    unlinked = [Activity(name, us - linked_us[name], ()) for name, us in device_us.items() if us - linked_us[name] > 0]
    return linked + unlinked


def breakdown(acts: list[Activity], steps: int) -> dict:
    """Milliseconds per step: the device total, by category (they sum to the total), and the top kernels."""
    by_category = dict.fromkeys(CATEGORIES, 0.0)
    by_kernel: dict[tuple[str, str], float] = defaultdict(float)
    by_range_us = 0.0
    for a in acts:
        category = classify(a.name, a.ranges)
        by_category[category] += a.us
        by_kernel[a.name, category] += a.us
        by_range_us += a.us if {ATTENTION_RANGE, SAMPLER_RANGE} & set(a.ranges) else 0.0
    total = sum(a.us for a in acts)
    top = sorted(by_kernel.items(), key=lambda kv: -kv[1])[:12]
    return {"device_ms": total / steps / 1e3,
            "by_category_ms": {c: us / steps / 1e3 for c, us in by_category.items()},
            "inside_labelled_ranges_ms": by_range_us / steps / 1e3,
            "top": [{"name": name[:120], "category": category, "ms": us / steps / 1e3} for (name, category), us in top]}


def _ranged(fn, name: str):
    def call(*args, **kwargs):
        with record_function(name):
            return fn(*args, **kwargs)
    return call


@contextmanager
def wrapped_attributes(targets):
    """targets: (object, attribute, wrap) triples. While open, each attribute is wrap(its value), set on the
    instance; on exit each is as it was (an instance attribute restored, a method's instance override removed)."""
    saved = [(obj, attr, obj.__dict__.get(attr)) for obj, attr, _ in targets]
    for obj, attr, wrap in targets:
        setattr(obj, attr, wrap(getattr(obj, attr)))
    try:
        yield
    finally:
        for obj, attr, before in saved:
            if before is None:
                delattr(obj, attr)
            else:
                setattr(obj, attr, before)


def labelled_ranges(engine):
    """The attention backend's plan/write_kv/attend and the engine's sampler run inside profiler ranges while
    this is open."""
    backend = engine.attention_backend
    targets = [(backend, attr, ATTENTION_RANGE) for attr in ("plan", "write_kv", "attend")]
    targets.append((engine, "sampler", SAMPLER_RANGE))
    return wrapped_attributes([(obj, attr, lambda fn, name=name: _ranged(fn, name)) for obj, attr, name in targets])


# The host's side of a step, timed phase by phase without the profiler: the scheduler, the runner's input building,
# the forward's launch (a graph replay returns at once on CUDA), the sampler (on CUDA it includes the wait for the
# device, since its token read waits for the step) and the rest of Engine.step (the outputs, the block bookkeeping).
PHASES = (("schedule", "scheduler", "schedule"), ("prepare", "runner", "prepare"), ("execute", "runner", "execute"),
          ("sample", None, "sampler"))


def timed_phases(engine, totals: dict[str, float], sync_after_execute: bool):
    """While open, each phase's seconds add up in `totals`; with sync_after_execute the device is synchronised when
    the forward returns, so that `execute` holds the forward's device time and `sample` the sampler's own."""
    device = engine.device

    def timed(fn, name):
        def call(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                if sync_after_execute and name == "execute":
                    _sync(device)
                totals[name] = totals.get(name, 0.0) + time.perf_counter() - t0
        return call

    return wrapped_attributes([(getattr(engine, owner) if owner else engine, attr,
                                lambda fn, name=name: timed(fn, name)) for name, owner, attr in PHASES])


def host_phases(engine, steps: int, sync_after_execute: bool) -> dict[str, float]:
    """Milliseconds per step by phase over `steps` engine steps (and `step`, the whole step; `rest` what the
    phases leave of it)."""
    totals: dict[str, float] = {}
    with timed_phases(engine, totals, sync_after_execute):
        _sync(engine.device)
        t0 = time.perf_counter()
        for _ in range(steps):
            engine.step()
        _sync(engine.device)
        wall = time.perf_counter() - t0
    result = {name: totals.get(name, 0.0) * 1e3 / steps for name, _, _ in PHASES}
    result["step"] = wall * 1e3 / steps
    result["rest"] = result["step"] - sum(result[name] for name, _, _ in PHASES)
    return result


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def profile_decode(engine, prompts: list[list[int]], steps: int, warmup: int = 3) -> dict:
    """Prefills `prompts` (one sequence each), runs `warmup` decode steps, times `steps` steps, then profiles
    `steps` more; the sequences are aborted at the end. Returns the step's wall time, the device time (both in ms
    per step) and the breakdown."""
    from shared.sampling_params import SamplingParams

    device = engine.device
    on_cuda = device.type == "cuda"
    params = SamplingParams(temperature=0.0, max_tokens=warmup + 4 * steps + 4, ignore_eos=True)
    ids = [f"profile-{len(prompts)}-{i}" for i in range(len(prompts))]
    for rid, prompt in zip(ids, prompts):
        engine.add_request(rid, prompt, params)
    try:
        while engine.scheduler.waiting or any(s.num_computed_tokens < s.num_prompt_tokens
                                              for s in engine.scheduler.running):
            engine.step()
        for _ in range(warmup):
            engine.step()
        _sync(device)
        t0 = time.perf_counter()
        for _ in range(steps):
            engine.step()
        _sync(device)
        step_ms = (time.perf_counter() - t0) * 1e3 / steps
        phases = {"as_run": host_phases(engine, steps, sync_after_execute=False),
                  "synced_after_forward": host_phases(engine, steps, sync_after_execute=True)}
        activity = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_cuda else [])
        with labelled_ranges(engine), profile(activities=activity) as prof:
            t0 = time.perf_counter()
            for _ in range(steps):
                engine.step()
            _sync(device)
            profiled_ms = (time.perf_counter() - t0) * 1e3 / steps
        running = len(engine.scheduler.running)
    finally:
        for rid in ids:
            engine.abort_request(rid)
        while engine.has_unfinished_requests():
            engine.step()
    result = {"batch": len(prompts), "context": len(prompts[0]), "steps": steps, "running_during_profile": running,
              "step_ms": step_ms, "profiled_step_ms": profiled_ms, "host_phases_ms": phases,
              "device_kind": "CUDA kernels and copies" if on_cuda else "CPU operators' self time"}
    result.update(breakdown(activities(prof.events(), on_cuda), steps))
    # Kernel durations are what they are with or without the profiler, so on CUDA the busy share is of the plain
    # steps' wall time; a CPU operator's time grows under the profiler as the step does, so there it is of the
    # profiled steps'.
    result["wall_ms"] = step_ms if on_cuda else profiled_ms
    result["device_busy_fraction"] = result["device_ms"] / result["wall_ms"]
    result["host_gap_ms"] = result["wall_ms"] - result["device_ms"]  # launch gaps and host work
    return result


def table(rows: list[dict]) -> str:
    head = f"{'decode step':<16} {'wall ms':>8} {'device ms':>9} {'busy':>5} " + " ".join(
        f"{c + ' ms':>13}" for c in CATEGORIES)
    lines = [head]
    for r in rows:
        cats = " ".join(f"{r['by_category_ms'][c]:>8.3f} {100 * r['by_category_ms'][c] / r['device_ms']:3.0f}%"
                        if r["device_ms"] else f"{'-':>13}" for c in CATEGORIES)
        lines.append(f"{'batch ' + str(r['batch']) + ' ctx ' + str(r['context']):<16} {r['wall_ms']:>8.3f} "
                     f"{r['device_ms']:>9.3f} {100 * r['device_busy_fraction']:4.0f}% {cats}")
    names = [name for name, _, _ in PHASES] + ["rest", "step"]
    lines += ["", f"{'host phases, ms per step':<32} " + " ".join(f"{n:>8}" for n in names)]
    for r in rows:
        for mode, phases in (r.get("host_phases_ms") or {}).items():
            label = f"batch {r['batch']}, {mode.replace('_', ' ')}"
            lines.append(f"{label:<32} " + " ".join(f"{phases[n]:>8.3f}" for n in names))
    return "\n".join(lines)
