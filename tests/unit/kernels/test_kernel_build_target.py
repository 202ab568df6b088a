"""The kernels' build key and target CPU (kernels/builder/modules.py, kernels/builder/target.py), without compiling kernels:
kernels built for one kind of CPU are never found, or never loaded, on another; MILI_KERNEL_TARGET_CPU reaches
`mojo build --target-cpu`; the host default compiles exactly as before; a read-only build root falls back to the
cache. The compiler is asked only for `--print-effective-target` (milliseconds)."""

from __future__ import annotations

import pytest

from kernels.builder import modules, target

MITIGATIONS = "fpu sse sse2 ht syscall nx lm constant_tsc rep_good nopl xtopology cpuid pni ssse3"
HOST = f"processor\t: 0\nflags\t\t: {MITIGATIONS} avx avx2 fma avx512f avx512bw avx512_vnni ibrs ibpb stibp\n"


def cpuinfo(*extra: str, drop: tuple[str, ...] = ()) -> str:
    flags = [f for f in HOST.split("flags\t\t: ")[1].split() if f not in drop]
    return f"processor\t: 0\nflags\t\t: {' '.join([*flags, *extra])}\n"


@pytest.fixture
def host_target(monkeypatch):
    monkeypatch.delenv(target.TARGET_CPU_ENV, raising=False)


def test_host_key_follows_instruction_sets_not_mitigations(host_target):
    key = modules.build_key(HOST)
    assert modules.build_key(HOST) == key  # stable: the same CPU finds its build again
    # Microcode and kernel updates toggle mitigation and virtualisation flags: the same build still fits.
    assert modules.build_key(cpuinfo("md_clear", "flush_l1d", "hypervisor", drop=("ibrs", "stibp"))) == key
    # Another instruction set, more or fewer: another build directory, so no SIGILL from a reused one.
    assert modules.build_key(cpuinfo("amx_tile", "amx_int8")) != key
    assert modules.build_key(cpuinfo(drop=("avx512f", "avx512bw", "avx512_vnni"))) != key
    arm = "processor\t: 0\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics\n"
    assert modules.build_key(arm) != modules.build_key(arm.replace(" atomics", " atomics sve"))


def test_host_default_compiles_as_before(host_target):
    """No target flags of its own: the compiler's host default, plus the quantized matmuls' AMX features."""
    assert target.target_flags() == ()
    assert modules.module_flags("mili_attention") == modules.module_flags("mili_layers") == ()
    assert modules.module_flags("mili_quant") == modules.module_flags("mili_quant_k") == modules.AMX_FLAGS


def test_explicit_target_cpu_reaches_the_compiler_and_the_key(monkeypatch, host_target):
    host_key = modules.build_key(HOST)
    monkeypatch.setenv(target.TARGET_CPU_ENV, "x86-64-v3")
    v3 = modules.build_key(HOST)
    assert v3 != host_key
    assert modules.build_key(cpuinfo("amx_tile")) == v3  # an explicit target does not depend on the build host
    monkeypatch.setenv(target.TARGET_CPU_ENV, "sapphirerapids")
    assert modules.build_key(HOST) not in (v3, host_key)
    assert modules.module_flags("mili_attention") == ("--target-cpu", "sapphirerapids")
    flags = modules.module_flags("mili_quant")
    assert flags[:2] == ("--target-cpu", "sapphirerapids") and "+avx512vnni" in flags[3] and "+amx-int8" in flags[3]
    monkeypatch.setenv(target.TARGET_CPU_ENV, "  ")
    assert target.target_cpu() is None  # empty (the Dockerfile's default ARG) means this host
    monkeypatch.setenv(target.TARGET_CPU_ENV, "x86-64-v3 --emit exe")
    with pytest.raises(ValueError, match="not a CPU name"):
        target.target_cpu()


def test_compile_command_carries_the_target(monkeypatch, tmp_path):
    seen = []

    class Done:
        returncode, stderr = 0, ""

    def fake_run(cmd, **kwargs):
        seen.append(cmd)
        (tmp_path / "out.so").touch()
        return Done()

    monkeypatch.setattr(modules.subprocess, "run", fake_run)
    monkeypatch.setattr(modules, "mojo_compiler", lambda: "mojo")
    monkeypatch.setenv(target.TARGET_CPU_ENV, "x86-64-v4")
    modules.compile_source(modules.KERNELS_DIR / "attention.mojo", tmp_path / "mili_attention.so",
                   modules.module_flags("mili_attention"))
    (cmd,) = seen
    assert cmd[:4] == ["mojo", "build", "--target-cpu", "x86-64-v4"] and "shared-lib" in cmd


def test_effective_features_are_recorded_and_checked(monkeypatch, tmp_path):
    """What the compiler says the target needs is kept beside the kernels; a CPU lacking one of those
    features gets a KernelBuildError (attention then falls back to torch), not a SIGILL."""
    monkeypatch.setenv(target.TARGET_CPU_ENV, "x86-64-v3")
    try:
        modules.mojo_compiler()
    except modules.KernelBuildError:
        pytest.skip("the mojo compiler is not installed")
    modules._record_target_features(tmp_path)
    recorded = (tmp_path / modules.TARGET_FILE).read_text().strip().split(",")
    assert {"avx2", "fma", "bmi2", "sse4.2"} <= set(recorded) and not any(f.startswith("avx512") for f in recorded)
    v3_cpu = target.cpu_flags(cpuinfo("avx2", "fma", "bmi1", "bmi2", "f16c", "movbe", "abm", "popcnt",
                                            "sse4_1", "sse4_2", "cx16", "xsave", "lahf_lm", "cmov", "cx8", "fxsr",
                                            "mmx"))
    assert target.missing_features(recorded, v3_cpu) == []
    monkeypatch.setattr(target, "cpu_flags", lambda: v3_cpu)
    modules._checked.clear()
    modules.check_runs_here(tmp_path)  # passes
    older = frozenset(v3_cpu - {"avx2", "fma"})
    monkeypatch.setattr(target, "cpu_flags", lambda: older)
    modules._checked.clear()
    with pytest.raises(modules.KernelBuildError, match="avx2.*fma|fma.*avx2"):
        modules.check_runs_here(tmp_path)
    monkeypatch.setenv(target.TARGET_CPU_ENV, "no-such-cpu")
    with pytest.raises(modules.KernelBuildError, match="no-such-cpu"):
        modules._record_target_features(tmp_path / "unknown")


def test_feature_names_map_to_cpuinfo_flags():
    flags = frozenset("fpu pni sse4_1 sse4_2 pclmulqdq abm lahf_lm avx512_vnni amx_tile avx2".split())
    assert target.missing_features(["x87", "sse3", "sse4.1", "sse4.2", "crc32", "pclmul", "lzcnt", "sahf",
                                          "avx512vnni", "amx-tile", "avx2"], flags) == []
    assert target.missing_features(["avx512f", "avx512bw", "amx-int8"], flags) == ["avx512f", "avx512bw",
                                                                                           "amx-int8"]
    # A feature with no cpuinfo flag and no instruction-set name is not held against the CPU.
    assert target.missing_features(["64bit", "slow-unaligned-mem-16"], flags) == []


def test_read_only_build_root_falls_back_to_the_cache(monkeypatch, tmp_path, host_target):
    key = "0123456789abcdef"
    blocked = tmp_path / "a-file"
    blocked.write_text("")  # nothing can be created under a regular file, whoever runs this
    monkeypatch.setattr(modules, "BUILD_ROOT", blocked / "kernels")
    monkeypatch.setenv("MILI_CACHE_DIR", str(tmp_path / "cache"))
    assert modules.build_dir(key) == tmp_path / "cache" / "kernels" / key
    # A build already under the build root is used as it is, read-only or not.
    monkeypatch.setattr(modules, "BUILD_ROOT", tmp_path / "image" / "kernels")
    (tmp_path / "image" / "kernels" / key).mkdir(parents=True)
    (tmp_path / "image" / "kernels" / key / "mili_attention.so").touch()
    assert modules.build_dir(key) == tmp_path / "image" / "kernels" / key
    # Neither writable: a clear error naming both places and the ways out.
    monkeypatch.setattr(modules, "BUILD_ROOT", blocked / "kernels")
    monkeypatch.setenv("MILI_CACHE_DIR", str(blocked / "cache"))
    with pytest.raises(modules.KernelBuildError, match="MILI_CACHE_DIR.*MILI_KERNEL_TARGET_CPU"):
        modules.build_dir(key)


def test_load_checks_an_explicit_target_but_building_does_not(monkeypatch, tmp_path):
    """`python -m kernels.builder` may build an image's kernels on a CPU older than their target; handing a
    module out to be loaded checks the target against this CPU."""
    monkeypatch.setenv(target.TARGET_CPU_ENV, "x86-64-v4")
    monkeypatch.setattr(modules, "BUILD_ROOT", tmp_path)
    directory = tmp_path / modules.build_key()
    directory.mkdir()
    for module in modules.MODULES:
        (directory / f"{module}.so").touch()
    (directory / modules.TARGET_FILE).write_text("avx2,avx512f,avx512bw\n")
    monkeypatch.setattr(target, "cpu_flags", lambda: frozenset({"avx2"}))
    modules._checked.clear()
    assert modules.build("mili_layers", check=False) == directory / "mili_layers.so"
    with pytest.raises(modules.KernelBuildError, match="avx512f, avx512bw"):
        modules.build("mili_layers")
    monkeypatch.setattr(target, "cpu_flags", lambda: frozenset({"avx2", "avx512f", "avx512bw"}))
    assert modules.build("mili_layers") == directory / "mili_layers.so"


def test_quantized_kernels_run_where_their_build_allows(monkeypatch, host_target):
    """Built for this host they run on any AVX2 CPU (vpdpbusd or its exact fallback); built for an explicit target
    they carry the AVX-512 path, which a CPU without AVX-512 VNNI is refused (an error, not a SIGILL)."""
    avx2 = cpuinfo(drop=("avx512f", "avx512bw", "avx512_vnni"))
    assert target.quant_kernels_unsupported(HOST) is None
    assert target.quant_kernels_unsupported(avx2) is None
    assert "AVX2" in target.quant_kernels_unsupported(cpuinfo(drop=("avx2", "avx512f", "avx512bw", "avx512_vnni")))
    monkeypatch.setenv(target.TARGET_CPU_ENV, "x86-64-v3")
    assert target.quant_kernels_unsupported(HOST) is None
    reason = target.quant_kernels_unsupported(avx2)
    assert "avx512f, avx512bw, avx512_vnni" in reason and target.TARGET_CPU_ENV in reason
