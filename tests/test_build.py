"""Build facts and the import-time torch version check."""

import os
import subprocess
import sys

import torch

import specdec_cuda


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
