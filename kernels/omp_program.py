"""A list of kernel calls run as one OpenMP program (kernels/omp_program.c, mili_omp_program).

Each call is a phase: a kernel's C range entry (`mili_<kernel>_range`), the address of its int64
parameters and a number of work items, split over torch's OpenMP team, with a barrier before the next
phase. A builder collects the phases once, with parameters made by the kernels' checked entry points;
the program keeps everything in one int64 array (the phase table, then every phase's parameters), so a
step changes what varies (row counts, switches) with one NumPy assignment and runs every phase with one
call from Python.
"""

from __future__ import annotations

import array
import time
from collections.abc import Sequence
from types import ModuleType

import numpy as np

from kernels.attention import OmpTeam

PHASE_WORDS = 4  # (range entry, params address, work items, flags), as omp_program.c reads them
SAME_SPLIT = 1  # flag: no barrier before this phase (see ProgramBuilder.add)
TAKEN = 2  # flag: a thread that has run out takes what is left of another's share (see ProgramBuilder.add)


class ProgramBuilder:
    """Collects phases. A phase's work-item count and any of its parameters may be named per-step
    values (given to Program.run in the order of `values`) instead of numbers."""

    def __init__(self, team: OmpTeam, values: Sequence[str]):
        self._team = team
        self._values = tuple(values)
        self._phases: list[tuple[int, array.array, int | str, int, dict[int, str]]] = []
        self._labels: list[str] = []  # each phase's kernel entry

    def add(self, module: ModuleType, entry: str, params: array.array, n_items: int | str,
            patches: dict[int, str] | None = None, same_split: bool = False, taken: bool = False) -> None:
        """patches: parameter index -> the per-step value written there. same_split: this phase splits
        the same work-item count as the previous one, and each of its items reads only what the same item
        there wrote, so a thread goes on to its share without waiting for the others. taken: each thread runs
        its equal share and, once out of work, takes the back half of what is left of another's, for phases
        whose items are independent and long enough that a slower thread would keep the others waiting (a
        matmul's column tiles, attention's work items); the items' results are the same either way."""
        if same_split and not (self._phases and self._phases[-1][2] == n_items):
            raise ValueError("same_split needs the previous phase's work-item count")
        if same_split and (taken or self._phases[-1][3] & TAKEN):
            raise ValueError("same_split needs equal shares in both phases: neither may be taken")
        for name in ([n_items] if isinstance(n_items, str) else []) + list((patches or {}).values()):
            if name not in self._values:
                raise ValueError(f"unknown per-step value {name!r}")
        self._phases.append((self._team.entry_address(module, entry), params, n_items,
                             (SAME_SPLIT if same_split else 0) | (TAKEN if taken else 0), dict(patches or {})))
        self._labels.append(entry)

    def build(self) -> "Program":
        """Phases that were given the same params array (a matmul's two phases) share one copy of it."""
        n = len(self._phases)
        offsets: dict[int, int] = {}  # id(params) -> its offset in the code array
        end = n * PHASE_WORDS
        for _, params, *_ in self._phases:
            if id(params) not in offsets:
                offsets[id(params)] = end
                end += len(params)
        code = np.zeros(end, dtype=np.int64)
        base = code.ctypes.data
        patches: dict[int, int] = {}  # index in code -> index of the per-step value
        for i, (entry, params, n_items, flags, params_patches) in enumerate(self._phases):
            row, offset = i * PHASE_WORDS, offsets[id(params)]
            code[offset:offset + len(params)] = params
            code[row:row + PHASE_WORDS] = (entry, base + 8 * offset, 0 if isinstance(n_items, str) else n_items,
                                           flags)
            if isinstance(n_items, str):
                patches[row + 2] = self._values.index(n_items)
            for index, name in params_patches.items():
                patches[offset + index] = self._values.index(name)
        return Program(self._team, code, n, np.array(list(patches), dtype=np.intp),
                       np.array(list(patches.values()), dtype=np.intp), len(self._values), tuple(self._labels))


class Program:
    def __init__(self, team: OmpTeam, code: np.ndarray, n_phases: int, patch_at: np.ndarray,
                 patch_value: np.ndarray, n_values: int, labels: tuple[str, ...]):
        self._team = team
        self.labels = labels  # each phase's kernel entry, in order
        self._code = code  # [n_phases * 4 | parameters] int64; the phase table points into it
        self._address = code.ctypes.data
        self.n_phases = n_phases
        self._patch_at, self._patch_value, self._n_values = patch_at, patch_value, n_values

    def run(self, *values: int) -> None:
        """Every phase, in order, with this step's values (in the builder's order) patched in first."""
        self._patch(values)
        self._team.run_program(self._address, self.n_phases)

    def time_phases(self, *values: int) -> list[float]:
        """Seconds each phase takes run alone, in order, as a program of its own (so with a barrier after it, and
        the team's start-up in each figure): where a step's time goes, for profiling. Phases that write state
        (the KV cache, the residual stream) write it again, so what a model computes next is not meaningful."""
        self._patch(values)
        seconds = []
        for i in range(self.n_phases):
            row = self._code[i * PHASE_WORDS:(i + 1) * PHASE_WORDS].copy()
            row[3] &= ~SAME_SPLIT  # alone: no phase before it to share a split with
            start = time.perf_counter()
            self._team.run_program(row.ctypes.data, 1)
            seconds.append(time.perf_counter() - start)
        return seconds

    def _patch(self, values: tuple[int, ...]) -> None:
        if len(values) != self._n_values:
            raise ValueError(f"expected {self._n_values} per-step values, got {len(values)}")
        self._code[self._patch_at] = np.array(values, dtype=np.int64)[self._patch_value]
