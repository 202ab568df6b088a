"""OpenVINO GenAI as a peer: int4 weights exported with optimum-intel, generated with its own pipelines, in a venv
of its own under build/peers/openvino-genai-<version>/ (never MILI's: it brings its own torch for the export).

    python -m loadtest.peers.openvino_genai          # installs once, prints the venv's python

OpenVINO GenAI has no HTTP server, so it is compared offline (loadtest/bench_offline.py): this module installs
it, exports a model (`optimum-cli export openvino --weight-format int4 --group-size 32`: the default model's 576
channels do not split into optimum-intel's default groups of 128), and hands a job (token ids, levels) to
openvino_genai_job.py, which the venv's python runs by path and which reports timings as JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from loadtest.peers.venv import ensure_venv, python_in, recorded

OPENVINO_GENAI_VERSION = "2026.4.1.0"
OPTIMUM_INTEL_VERSION = "2.2.0"
TORCH_VERSION = "2.13.0+cpu"  # the export traces the model with torch; the local CPU wheel, not the CUDA build
GROUP_SIZE = 32  # int4 group: divides 576, the default model's hidden size
ROOT = Path(__file__).resolve().parents[2]
BUILD_ROOT = ROOT / "build" / "peers"
EXPORT_RECORD = "export.json"  # written last in an export's directory
JOB_SCRIPT = Path(__file__).with_name("openvino_genai_job.py")  # run by the venv's python: JSON in, JSON out


def install_dir() -> Path:
    return BUILD_ROOT / f"openvino-genai-{OPENVINO_GENAI_VERSION}"


def python_path() -> Path:
    return python_in(install_dir())


def ensure_openvino_genai() -> Path:
    """The venv's python with openvino_genai and optimum-intel importable, installed if not there yet."""
    ensure_venv(install_dir(), [f"openvino-genai=={OPENVINO_GENAI_VERSION}",
                                f"optimum-intel[openvino]=={OPTIMUM_INTEL_VERSION}", f"torch=={TORCH_VERSION}"],
                "import json, openvino, openvino_genai, optimum.intel.openvino; print(json.dumps("
                "{'openvino_genai': openvino_genai.__version__, 'openvino': openvino.__version__}))")
    return python_path()


def version() -> str:
    installed = recorded(install_dir())
    if installed is None:
        return f"openvino-genai {OPENVINO_GENAI_VERSION} (not installed)"
    return (f"openvino-genai {installed['openvino_genai']} (OpenVINO {installed['openvino']}), "
            f"optimum-intel {OPTIMUM_INTEL_VERSION}")


def export_int4(model_dir: Path) -> Path:
    """The OpenVINO IR of an HF directory, int4 weights in groups of GROUP_SIZE, with its tokenizer models; made
    once under the install directory, keyed by the source directory's name (which carries its content key)."""
    ensure_openvino_genai()
    out = install_dir() / "models" / f"{Path(model_dir).name}-int4-g{GROUP_SIZE}"
    if (out / EXPORT_RECORD).is_file():
        return out
    # The CLI as a module of the venv's python: a console script's shebang names the path the venv was created
    # at, and breaks when the venv is reached through another path (a moved or symlinked build directory).
    optimum_cli = [str(python_path()), "-m", "optimum.commands.optimum_cli"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}  # a local directory only
    log = out.with_name(out.name + ".log")  # the exporter's tracing warnings and NNCF's tables
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as f:
        run = subprocess.run([*optimum_cli, "export", "openvino", "--model", str(model_dir), "--task",
                              "text-generation-with-past", "--weight-format", "int4", "--group-size", str(GROUP_SIZE),
                              str(out)], stdout=f, stderr=subprocess.STDOUT, env=env, cwd=install_dir())
    if run.returncode != 0:
        raise RuntimeError(f"optimum-cli's int4 export exited with code {run.returncode}; see {log}")
    (out / EXPORT_RECORD).write_text(json.dumps({"source": str(model_dir), "weight_format": "int4",
                                                 "group_size": GROUP_SIZE}) + "\n")
    return out


def run_offline(ov_model: Path, prompts: list[list[int]], levels: list[int], output_len: int, threads: int,
                requests_per_level: int) -> dict:
    """Runs the script half in the venv; returns its JSON: per level, output tok/s and the pipeline chosen, and the
    CPU plugin's precision defaults (cpu_properties)."""
    job = {"model": str(ov_model), "prompts": prompts, "levels": levels, "output_len": output_len,
           "threads": threads, "requests_per_level": requests_per_level}
    # Its progress lines (stderr) pass through; its result is the last line on stdout. -P: the script's folder stays
    # off sys.path, or `import openvino_genai` would find this module instead of OpenVINO's.
    run = subprocess.run([str(python_path()), "-P", str(JOB_SCRIPT)], input=json.dumps(job), stdout=subprocess.PIPE,
                         text=True, cwd=install_dir(), env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if run.returncode != 0:
        raise RuntimeError(f"OpenVINO GenAI's run exited with code {run.returncode} (its error is printed above)")
    return json.loads(run.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    print(ensure_openvino_genai())
