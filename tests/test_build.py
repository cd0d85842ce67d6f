"""Build facts and the import-time torch version check."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import specdec_cuda

pytestmark = pytest.mark.kernels  # what make cpu-only-check runs on a CPU-only build


def test_build_info_reports_torch_and_cuda():
    info = specdec_cuda.build_info()
    assert info["torch_version"].split("+")[0] == torch.__version__.split("+")[0]
    assert isinstance(info["with_cuda"], bool)
    if info["with_cuda"]:
        archs = info["cuda_archs"].split(";")
        assert archs and all(a.replace(".", "").isdigit() for a in archs)
    else:
        assert info["cuda_archs"] == "" and info["cuda_skipped_because"]


def test_binary_for_another_torch_gives_readable_error():
    # Pretend the binary was built for torch 1.0.0: importing must fail before the .so loads,
    # naming both versions.
    code = (
        "import sys, types\n"
        "meta = types.ModuleType('specdec_cuda._build_meta')\n"
        "meta.TORCH_VERSION = '1.0.0'\n"
        "sys.modules['specdec_cuda._build_meta'] = meta\n"
        "try:\n"
        "    import specdec_cuda\n"
        "except ImportError as exc:\n"
        "    print('ERR', exc)\n"
    )
    package_root = os.path.dirname(os.path.dirname(specdec_cuda.__file__))
    env = dict(os.environ, PYTHONPATH=package_root)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         check=True).stdout
    assert out.startswith("ERR")
    assert "1.0.0" in out and torch.__version__ in out


def test_every_public_op_is_tested_by_a_kernels_module():
    # `make cpu-only-check` runs only the modules marked `kernels` against its CPU-only build, so
    # each op the schema defines (csrc/ops/schema.cpp; the `_`-prefixed ISA queries aside) must be
    # named in one of them, or that build would go untested for it.
    root = Path(__file__).resolve().parents[1]
    ops = re.findall(r'm\.def\(\s*"(\w+)\(', (root / "csrc" / "ops" / "schema.cpp").read_text())
    assert len(ops) > 20, ops  # the pattern still reads the schema
    marked = "\n".join(t for t in (p.read_text() for p in (root / "tests").glob("test_*.py"))
                       if re.search(r"^pytestmark = \[?pytest\.mark\.kernels\b", t, re.M))
    untested = [op for op in ops if not op.startswith("_") and not re.search(rf"\b{op}\b", marked)]
    assert not untested, f"ops no `kernels` test module names: {untested}"
