"""`make gpu-check`: the one command a GPU session runs on the GPU machine.

It installs the wheels `make gpu-bundle` put into .gpu-bundle/ into /tmp/site (the machine has no network),
unpacks the carried Mojo runtime (loadtest/runtime.py), first checks that every carried GPU attention module
imports under this Python and, with CUDA, agrees with the torch reference on a small ragged step; then runs
tests/gpu, the integration suite's API tests against `mili serve --device cuda`, the attention
micro-benchmark (loadtest/gpu/bench_attention.py) and the engine benchmark against transformers `generate`
(loadtest/gpu/bench_engine.py: gpu.json and gpu.md), writes the results as JSON (and the suites' JUnit XML) under
$OUT (or build/gpu-check/), and prints a short table last. `--only` picks some of these (on an H200 one device
call of 256 s held the module checks, the module's tests, bench and engine-bench with a 215 s budget).

`--dry-run` uses this interpreter's packages and installs nothing: on a machine without CUDA every test skips,
with its reason, which is what CI can check of this script (tests/unit/loadtest/test_gpu_check.py).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from loadtest.gpu import runtime

ROOT = Path(__file__).resolve().parents[2]
SITE = Path("/tmp/site")
# The integration files whose tests all use the one shared server (tests/integration/conftest.py), which
# --server-device starts on the GPU: the OpenAI API through the SDK, structured output, prompt scoring.
INTEGRATION = ("tests/integration/api/test_api.py", "tests/integration/api/test_structured_output.py",
               "tests/integration/api/test_prompt_scoring.py")
# The GPU attention module's tests run in a process of their own: a device fault is sticky (every later CUDA call
# of the process fails), so a faulting kernel would otherwise fail every test after it, the torch path's too.
MODULE_TESTS = "mojo or module"
SUITES = {
    "tests/gpu": ["tests/gpu", "-k", f"not ({MODULE_TESTS})"],
    "tests/gpu module": ["tests/gpu", "-k", MODULE_TESTS],
    "integration --server-device cuda": ["--server-device", "cuda", *INTEGRATION],
}
# What --only can pick: the carried modules' import check, the suites (by their first word; `module-tests` the
# module's suite alone), the attention benchmark, the engine benchmark, the serving benchmark, and the module's
# kernels one by one (diagnose).
PARTS = ("modules", "tests/gpu", "module-tests", "integration", "bench", "engine-bench", "serve-bench", "diagnose")

# Each carried module: does it import here, and (with CUDA) does it open the device and agree with the reference?
MODULE_CHECK = """
import json, torch
from kernels.builder import gpu_modules
from kernels import gpu_attention
report = []
for shape in gpu_modules.CARRIED_SHAPES:
    entry = {"shape": str(shape)}
    if gpu_modules.find_module(shape) is None:
        entry["skipped"] = "not built here (make gpu-bundle builds and carries it)"
        report.append(entry)
        continue
    try:
        entry["module"] = str(gpu_attention.load_module(shape).__file__)
        if torch.cuda.is_available():
            from worker.attention.cuda import check_against_reference
            ops = gpu_attention.open_attention(shape, torch.device("cuda"))
            entry["self_check"] = check_against_reference(ops) or "ok"
    except Exception as e:
        entry["error"] = f"{type(e).__name__}: {e}"
    report.append(entry)
print(json.dumps(report))
"""

ENVIRONMENT = """
import json, platform, torch
info = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available()}
if torch.cuda.is_available():
    props = torch.cuda.get_device_properties(0)
    info.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1),
                multiprocessors=props.multi_processor_count)
print(json.dumps(info))
"""


def install(bundle: Path) -> None:
    wheels = sorted(str(p) for p in (bundle / "wheels").glob("*.whl"))
    if not wheels:
        raise SystemExit(f"no wheels in {bundle / 'wheels'}: run `make gpu-bundle` first and carry {bundle.name}")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                    "--no-cache-dir", "--upgrade", "--target", str(SITE), *wheels], check=True)


def suite_env(bundle: Path, dry_run: bool) -> dict[str, str]:
    paths = [str(ROOT)] if dry_run else [str(SITE), str(ROOT)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths + [os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
               PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    if (bundle / "tokenizer").is_dir():  # no default model on the GPU machine: its tokenizer travels alone
        env["MILI_TEST_TOKENIZER_DIR"] = str(bundle / "tokenizer")
    return env


def suites_need_the_reference(modules: list[dict], cuda: bool) -> bool:
    """Whether a module failed its check on the device: the suites' servers then serve on the torch reference,
    so that the engine's own checks are not lost to a module fault (the module's own tests in tests/gpu still
    run, and fail)."""
    return cuda and any("error" in m or m.get("self_check", "ok") != "ok" for m in modules)


def check_modules(env: dict[str, str], timeout: float = 300.0) -> list[dict]:
    """In its own process: a module that faults the device there cannot take the suites down with it."""
    try:
        run = subprocess.run([sys.executable, "-c", MODULE_CHECK], cwd=ROOT, env=env, capture_output=True,
                             text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return [{"error": f"the module check took over {timeout:.0f} s (compiling the modules' PTX?)"}]
    if run.returncode != 0:
        return [{"error": run.stderr[-3000:]}]
    return json.loads(run.stdout.strip().splitlines()[-1])


def run_benchmark_module(name: str, args: list[str], env: dict[str, str], timeout: float, dry_run: bool) -> dict:
    """`python -m loadtest.NAME ARGS` (with --dry-run on a dry run) under a timeout: its return code and time."""
    cmd = [sys.executable, "-m", f"loadtest.{name}", *args, *(["--dry-run"] if dry_run else [])]
    start = time.monotonic()
    try:
        rc = subprocess.run(cmd, cwd=ROOT, env=env, timeout=timeout).returncode
    except subprocess.TimeoutExpired:
        rc = "timeout"
    return {"benchmark": name, "returncode": rc, "seconds": round(time.monotonic() - start, 1)}


def read_report(path: Path) -> dict | None:
    """A benchmark's JSON, or None where it wrote none (or half of one: stopped by the timeout)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def run_benchmark(env: dict[str, str], out: Path, timeout: float, dry_run: bool) -> dict:
    return run_benchmark_module("gpu.bench_attention", ["--out", str(out / "gpu_attention.json")], env, timeout,
                                dry_run)


def run_engine_benchmark(env: dict[str, str], out: Path, timeout: float, dry_run: bool, backend: str = "auto",
                         skip: str = "", compile_layer_ops: bool | None = None) -> dict:
    """loadtest/gpu/bench_engine.py with a budget a minute short of `timeout` (it stops its own parts at the budget, and
    writes its JSON after each, so a run stopped by the timeout still leaves what it measured)."""
    json_path, md_path = out / "gpu.json", out / "gpu.md"
    result = run_benchmark_module("gpu.bench_engine", ["--out", str(json_path), "--markdown", str(md_path),
                                                "--budget-s", str(max(timeout - 60, 30)),
                                                "--attention-backend", backend,
                                                *(["--skip", skip] if skip else []),
                                                *({True: ["--compile-layer-ops"], False: ["--no-compile-layer-ops"]}
                                                  .get(compile_layer_ops, []))],
                                  env, timeout, dry_run)
    result.update(json=str(json_path), markdown=str(md_path))
    report = read_report(json_path) or {}
    for key in ("device", "attention_backend", "layer_ops", "single_stream_tok_s", "offline_tok_s",
                "transformers_offline_tok_s", "ratio_offline_vs_transformers", "ttft_1k_ms", "skipped"):
        if report.get(key) is not None:
            result[key] = report[key]
    return result


def engine_bench_line(result: dict) -> str:
    """The engine benchmark's line of the final table."""
    if "skipped" in result:
        return f"engine-bench: not run ({result['skipped']}), return code {result['returncode']}"

    def num(v, fmt=",.0f"):
        return "-" if v is None else format(v, fmt)

    single = ", ".join(f"{c}: {num(v)}" for c, v in (result.get("single_stream_tok_s") or {}).items())
    return (f"engine-bench ({result.get('attention_backend', '?')} attention, {result.get('layer_ops', '?')} layer ops): "
            f"offline {num(result.get('offline_tok_s'))}"
            f" tok/s, {num(result.get('ratio_offline_vs_transformers'), '.2f')}x transformers; single stream by "
            f"context {single or '-'} tok/s; TTFT 1k {num(result.get('ttft_1k_ms'), '.1f')} ms; return code "
            f"{result['returncode']} in {result['seconds']} s")


def run_serve_benchmark(env: dict[str, str], out: Path, timeout: float, dry_run: bool) -> dict:
    """loadtest/gpu/bench_serve.py: the engine alone against `mili serve` at concurrency 1, 32 and 128."""
    json_path = out / "gpu_serve.json"
    result = run_benchmark_module("gpu.bench_serve", ["--out", str(json_path)], env, timeout, dry_run)
    result["json"] = str(json_path)
    report = read_report(json_path) or {}
    if "skipped" in report:
        result["skipped"] = report["skipped"]
    result["levels"] = {level["concurrency"]: round(level["served_over_engine"], 2) for level in report.get("levels", [])}
    return result


def serve_bench_line(result: dict) -> str:
    """The serving benchmark's line of the final table: served / engine output tok/s by concurrency."""
    if "skipped" in result:
        return f"serve-bench: not run ({result['skipped']}), return code {result['returncode']}"
    levels = ", ".join(f"{c}: {r}x" for c, r in (result.get("levels") or {}).items())
    return (f"serve-bench: served / engine output tok/s by concurrency {levels or '-'}; return code "
            f"{result['returncode']} in {result['seconds']} s")


def parallel_workers(workers: int = 4) -> list[str]:
    """pytest-xdist's flag where it is installed: the GPU suites' tests are independent (each builds its own model,
    servers take free ports), and one GPU serves four workers' tiny models at once; on the first GPU run the torch
    path's 51 tests took 38 s on six."""
    return ["-n", str(workers)] if importlib.util.find_spec("xdist") else []


def per_test_timeout(seconds: float) -> list[str]:
    """pytest-timeout's flag where it is installed: one hung test then fails alone instead of taking the suite's
    whole time (and its JUnit file) with it."""
    return [f"--timeout={seconds:.0f}"] if importlib.util.find_spec("pytest_timeout") else []


def run_suite(name: str, args: list[str], env: dict[str, str], out: Path, timeout: float, workers: int = 4) -> dict:
    xml = out / f"junit-{len(list(out.glob('junit-*.xml')))}.xml"
    start = time.monotonic()
    try:
        # -v: each test's outcome reaches the log as it ends, so a suite stopped by its timeout still says how far
        # it got; --durations: where a device run's minutes went.
        # The integration suites share one server per process (tests/integration/conftest.py): those run in one.
        parallel = parallel_workers(workers) if name.startswith("tests/gpu") and workers > 1 else []
        rc = subprocess.run([sys.executable, "-m", "pytest", "-v", "-rs", "--durations=10", "-p", "no:cacheprovider",
                             *per_test_timeout(timeout / 2), *parallel, f"--junitxml={xml}", *args], cwd=ROOT,
                            env=env, timeout=timeout).returncode
    except subprocess.TimeoutExpired:
        rc = "timeout"
    result = {"suite": name, "returncode": rc, "seconds": round(time.monotonic() - start, 1),
              "tests": 0, "passed": 0, "failed": 0, "errors": 0, "skipped": 0, "skip_reasons": [], "failures": []}
    if xml.is_file():
        for case in ET.parse(xml).getroot().iter("testcase"):
            result["tests"] += 1
            test_id = f"{case.get('classname')}::{case.get('name')}"
            if case.find("failure") is not None:
                result["failed"] += 1
                result["failures"].append(test_id)
            elif case.find("error") is not None:
                result["errors"] += 1
                result["failures"].append(test_id)
            elif (skipped := case.find("skipped")) is not None:
                result["skipped"] += 1
                reason = skipped.get("message", "")
                if reason not in result["skip_reasons"]:
                    result["skip_reasons"].append(reason)
            else:
                result["passed"] += 1
    return result


def narrowed(suite: list[str], select: str | None) -> list[str]:
    """The suite's arguments with pytest's -k narrowed further by `select` (its own -k expression kept)."""
    if not select:
        return suite
    if "-k" in suite:
        at = suite.index("-k")
        return [*suite[:at], "-k", f"({suite[at + 1]}) and ({select})", *suite[at + 2:]]
    return [*suite, "-k", select]


def table(environment: dict, results: list[dict], engine_bench: dict | None = None,
          serve_bench: dict | None = None) -> str:
    device = environment.get("gpu") or ("no CUDA device" if not environment.get("cuda_available") else "?")
    lines = [f"GPU check: {device}; python {environment.get('python')}, torch {environment.get('torch')} "
             f"(CUDA {environment.get('cuda')})",
             f"{'suite':<34} {'passed':>6} {'failed':>6} {'errors':>6} {'skipped':>7} {'seconds':>8}"]
    for r in results:
        lines.append(f"{r['suite']:<34} {r['passed']:>6} {r['failed']:>6} {r['errors']:>6} {r['skipped']:>7} "
                     f"{r['seconds']:>8}")
    if engine_bench is not None:
        lines.append(engine_bench_line(engine_bench))
    if serve_bench is not None:
        lines.append(serve_bench_line(serve_bench))
    return "\n".join(lines)


def chosen_suites(parts: list[str]) -> list[str]:
    """The suites `--only`'s parts ask for, in SUITES' order: each by its first word, and the module's suite also
    alone (module-tests)."""
    return [name for name in SUITES
            if name.split()[0] in parts or (name == "tests/gpu module" and "module-tests" in parts)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.gpu.check", description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", type=Path, default=ROOT / ".gpu-bundle")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or ROOT / "build" / "gpu-check"))
    parser.add_argument("--dry-run", action="store_true",
                        help="install nothing; use this interpreter's packages (without CUDA: everything skips)")
    parser.add_argument("--module-timeout", type=float, default=300.0,
                        help="seconds for the carried modules' import and self-check (their PTX compiles then)")
    parser.add_argument("--suite-timeout", type=float, default=270.0,
                        help="seconds per suite before it is stopped (two suites fit one 10-minute device call)")
    parser.add_argument("--workers", type=int, default=4,
                        help="pytest-xdist workers for tests/gpu (1: one process, nothing else on the GPU meanwhile)")
    parser.add_argument("--select", metavar="EXPR", help="run only the suites' tests that match this pytest -k expression")
    parser.add_argument("--bench-timeout", type=float, default=150.0, help="seconds for the attention benchmark")
    parser.add_argument("--engine-bench-timeout", type=float, default=480.0,
                        help="seconds for the engine benchmark (its budget is a minute less)")
    parser.add_argument("--serve-bench-timeout", type=float, default=300.0,
                        help="seconds for the serving benchmark (engine alone, then mili serve)")
    parser.add_argument("--engine-bench-skip", default="",
                        help="parts of the engine benchmark to leave out (transformers, profile)")
    parser.add_argument("--engine-bench-compile", action=argparse.BooleanOptionalAction, default=None,
                        help="the engine benchmark with (or without) the layers' elementwise operators fused by "
                             "torch.compile (default: the engine's, on for CUDA)")
    parser.add_argument("--diagnose-repeats", type=int, default=3, help="seeds per diagnose case")
    parser.add_argument("--only", default=",".join(p for p in PARTS if p != "module-tests"),
                        help=f"comma-separated parts to run, of {', '.join(PARTS)} (default: all)")
    parser.add_argument("--ptxas", default=None, metavar="PATH|triton",
                        help="compile the GPU modules' PTX with this ptxas (triton: the one triton ships) instead "
                             "of the carried libNVPTX")
    args = parser.parse_args(argv)
    parts = args.only.split(",")
    unknown = set(parts) - set(PARTS)
    if unknown:
        parser.error(f"unknown parts {sorted(unknown)}; choose from {', '.join(PARTS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.dry_run:
        install(args.bundle)
    env = suite_env(args.bundle, args.dry_run)
    if not args.dry_run:  # a dry run loads the modules from this machine's build folder, as built
        ptxas = runtime.triton_ptxas() if args.ptxas == "triton" else args.ptxas
        env.update(runtime.device_env(args.bundle, external_ptxas=ptxas))
    probe = subprocess.run([sys.executable, "-c", ENVIRONMENT], env=env, capture_output=True, text=True)
    environment = json.loads(probe.stdout) if probe.returncode == 0 else {"error": probe.stderr[-2000:]}
    environment["triton_ptxas"] = runtime.triton_ptxas()
    modules = check_modules(env, args.module_timeout) if "modules" in parts else []
    if suites_need_the_reference(modules, bool(environment.get("cuda_available"))):
        env["MILI_ATTENTION_BACKEND"] = "torch"
        print("a GPU attention module failed its check: the suites' servers use the torch reference "
              "(MILI_ATTENTION_BACKEND=torch)")
    results = [run_suite(name, narrowed(SUITES[name], args.select), env, args.out, args.suite_timeout, args.workers)
               for name in chosen_suites(parts)]
    bench = run_benchmark(env, args.out, args.bench_timeout, args.dry_run) if "bench" in parts else None
    # The module by name where it passed its self-check here (a module that cannot serve then fails the benchmark
    # rather than quietly measuring the reference), the reference where it failed, else auto; the JSON and the table
    # say which backend ran.
    engine_backend = ("auto" if not modules else
                      "mojo" if all(m.get("self_check") == "ok" for m in modules) else "torch")
    engine_bench = (run_engine_benchmark(env, args.out, args.engine_bench_timeout, args.dry_run, engine_backend,
                                         args.engine_bench_skip, args.engine_bench_compile)
                    if "engine-bench" in parts else None)
    serve_bench = (run_serve_benchmark(env, args.out, args.serve_bench_timeout, args.dry_run)
                   if "serve-bench" in parts else None)
    # Each of the module's kernels alone, per step kind, synced and streamed (loadtest/gpu/diagnose.py).
    diagnose = (run_benchmark_module("gpu.diagnose", ["--sanitizer", "--repeats", str(args.diagnose_repeats),
                                                      "--out", str(args.out / "diagnose.json")], env,
                                     args.bench_timeout * 2, dry_run=False)
                if "diagnose" in parts and not args.dry_run else None)
    cuda = bool(environment.get("cuda_available"))
    ok = (all(r["returncode"] in (0, 5) and not r["failed"] and not r["errors"] for r in results)  # 5: none collected
          and all("error" not in m and m.get("self_check", "ok") == "ok" and ("skipped" not in m or args.dry_run)
                  for m in modules)
          and (bench is None or bench["returncode"] == 0)
          and (engine_bench is None or engine_bench["returncode"] == 0)
          and (serve_bench is None or serve_bench["returncode"] == 0))
    report = {"dry_run": args.dry_run, "ok": ok, "environment": environment, "gpu_modules": modules,
              "suites_attention_backend": env.get("MILI_ATTENTION_BACKEND", "auto"),
              "suites": results, "benchmark": bench, "engine_benchmark": engine_bench,
              "serve_benchmark": serve_bench, "diagnose": diagnose}
    (args.out / "gpu-check.json").write_text(json.dumps(report, indent=2) + "\n")
    for m in modules:
        status = m.get("error") or m.get("skipped") or (f"self-check {m['self_check']}" if "self_check" in m else
                                                        "imports" + ("" if cuda else " (no CUDA: not run)"))
        print(f"GPU attention module {m.get('shape', '?')}: {status}")
    if bench is not None:
        print(f"attention benchmark: return code {bench['returncode']} in {bench['seconds']} s "
              f"({args.out / 'gpu_attention.json'})")
    for r in results:
        for reason in r["skip_reasons"]:
            print(f"skipped in {r['suite']}: {reason}")
        for test_id in r["failures"]:
            print(f"FAILED in {r['suite']}: {test_id}")
    print(table(environment, results, engine_bench, serve_bench))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
