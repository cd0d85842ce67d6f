"""Build script for specdec_cuda.

setup.py is the source of truth for the build. It compiles one extension, ``specdec_cuda._C``,
from the sources that `source_files` picks by a fixed rule (CMakeLists.txt applies the same rule
to the same folders, so there is no second list to keep in sync):

* always: ``csrc/kernels/**/*.cpp`` and ``csrc/ops/*.cpp`` except ``*_cuda.cpp``;
* with CUDA: also ``csrc/kernels/**/*.cu`` and ``csrc/ops/*_cuda.cpp``.

``.cu`` files are torch-free kernels compiled by nvcc; the ``*_cuda.cpp`` glue that includes torch
headers is compiled by the host compiler, so nvcc never parses torch.

Environment switches:
  SPECDEC_CUDA=0|1         0 forces a CPU-only build; 1 fails loudly if CUDA cannot be built;
                           unset builds CUDA when torch has CUDA and nvcc is found.
  TORCH_CUDA_ARCH_LIST     CUDA architectures (default "8.0;9.0", i.e. sm_80 and sm_90).
  MAX_JOBS                 parallel compile jobs (honoured by torch's ninja build).
  SPECDEC_DEBUG=1          -O0 -g host code, -lineinfo and device assertions for CUDA.
  SPECDEC_REGISTER_ONLY=1  no extension (the Makefile's `pip install -e` registration step).

Rebuilds: `setup.py build_ext --inplace` keeps its objects in build/, and ninja recompiles only
what changed (it tracks the sources, the headers they include and the flags). When nothing that
the binary depends on changed at all — every file under csrc/, setup.py, torch's version, the
Python ABI and the switches above, hashed into build/specdec_build_digest.txt after each in-place
build — it does not even relink: the in-place binary is reused as is.
"""

import glob
import hashlib
import os
import shutil
import sys

from setuptools import find_packages, setup

def _default_cuda_home() -> None:
    """Point torch at a real toolkit folder when nvcc on PATH is only a wrapper script.

    torch derives CUDA_HOME from `which nvcc`; a wrapper in /usr/local/bin would make it look for
    libcudart in /usr/local/lib. The conventional /usr/local/cuda is tried first.
    """
    if os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH"):
        return
    if os.path.exists("/usr/local/cuda/bin/nvcc"):
        os.environ["CUDA_HOME"] = "/usr/local/cuda"


_default_cuda_home()

try:
    import torch
    from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension
except ImportError as exc:  # pragma: no cover - only on a misconfigured machine
    raise SystemExit(
        "specdec_cuda builds against the torch already installed in this environment; install "
        "torch first and build with `pip install --no-build-isolation .` "
        f"(import failed: {exc})"
    )

ROOT = os.path.dirname(os.path.abspath(__file__))
VERSION = "0.1.0"
DEFAULT_ARCHS = "8.0;9.0"


def _log(msg: str) -> None:
    print(f"[specdec_cuda build] {msg}", file=sys.stderr, flush=True)


def cuda_decision() -> tuple[bool, str]:
    """Returns (build_cuda, reason) following SPECDEC_CUDA; raises when 1 cannot be honoured."""
    switch = os.environ.get("SPECDEC_CUDA", "").strip()
    if switch == "0":
        return False, "SPECDEC_CUDA=0 was set"
    missing = []
    if torch.version.cuda is None:
        missing.append(f"torch {torch.__version__} is a CPU-only build")
    nvcc = shutil.which("nvcc") or (CUDA_HOME and os.path.join(CUDA_HOME, "bin", "nvcc"))
    if CUDA_HOME is None or not nvcc or not os.path.exists(nvcc):
        missing.append("nvcc was not found (set CUDA_HOME or put nvcc on PATH)")
    if missing:
        reason = "; ".join(missing)
        if switch == "1":
            raise SystemExit(f"SPECDEC_CUDA=1 but the CUDA kernels cannot be built: {reason}")
        return False, reason
    return True, f"torch CUDA {torch.version.cuda}, nvcc at {nvcc}"


def source_files(with_cuda: bool) -> list[str]:
    """The one source rule (mirrored in CMakeLists.txt)."""
    kernels_cpp = glob.glob("csrc/kernels/**/*.cpp", recursive=True)
    ops_cpp = [p for p in glob.glob("csrc/ops/*.cpp") if not p.endswith("_cuda.cpp")]
    sources = kernels_cpp + ops_cpp
    if with_cuda:
        sources += glob.glob("csrc/kernels/**/*.cu", recursive=True)
        sources += glob.glob("csrc/ops/*_cuda.cpp")
    return sorted(sources)


def build_digest(with_cuda: bool, archs: str, debug: bool) -> str:
    """A hash of everything the binary is built from: the content of every file under csrc/ and of
    setup.py, torch's version (and the CUDA it was built with), the Python ABI and the switches.
    Content, not modification times, so an edit made while a build runs is not missed."""
    h = hashlib.sha256()
    h.update(f"torch {torch.__version__} cuda {torch.version.cuda} python {sys.implementation.cache_tag} "
             f"with_cuda {with_cuda} archs {archs if with_cuda else ''} debug {debug}\n".encode())
    for path in sorted(glob.glob("csrc/**/*", recursive=True)) + ["setup.py"]:
        if os.path.isfile(path):
            with open(path, "rb") as f:
                h.update(path.encode() + b"\0" + f.read() + b"\0")
    return h.hexdigest()


DIGEST_PATH = os.path.join(ROOT, "build", "specdec_build_digest.txt")
_DIGEST: str | None = None  # of the extension being built (set by make_extension)


class BuildExt(BuildExtension.with_options(use_ninja=True)):
    """torch's BuildExtension (ninja; it forces setuptools to relink every time), plus: an in-place
    build whose inputs hash to the digest recorded by the last in-place build, with the binary still
    in place, is skipped entirely (no compile, no link)."""

    def run(self):
        if self.inplace and _DIGEST is not None and self.extensions:
            target = os.path.join(ROOT, "python", self.get_ext_filename(self.extensions[0].name))
            recorded = open(DIGEST_PATH).read().strip() if os.path.exists(DIGEST_PATH) else None
            if recorded == _DIGEST and os.path.exists(target):
                _log(f"{os.path.relpath(target, ROOT)} is up to date (no source, header, switch or torch "
                     "change since it was built): nothing to compile")
                return
            if os.path.exists(DIGEST_PATH):
                os.remove(DIGEST_PATH)  # a failed or interrupted build must not look up to date
        super().run()
        if self.inplace and _DIGEST is not None and self.extensions:
            os.makedirs(os.path.dirname(DIGEST_PATH), exist_ok=True)
            with open(DIGEST_PATH, "w") as f:
                f.write(_DIGEST + "\n")


def write_build_meta(with_cuda: bool, archs: str, debug: bool, reason: str) -> None:
    """Python-side copy of the build facts, read before the binary is loaded (version check)."""
    path = os.path.join(ROOT, "python", "specdec_cuda", "_build_meta.py")
    with open(path, "w") as f:
        f.write("# Written by setup.py at build time; do not edit.\n")
        f.write(f"TORCH_VERSION = {torch.__version__!r}\n")
        f.write(f"WITH_CUDA = {with_cuda!r}\n")
        f.write(f"CUDA_ARCHS = {archs if with_cuda else ''!r}\n")
        f.write(f"TORCH_CUDA_VERSION = {torch.version.cuda if with_cuda else None!r}\n")
        f.write(f"DEBUG = {debug!r}\n")
        f.write(f"CUDA_REASON = {reason!r}\n")


def make_extension():
    with_cuda, reason = cuda_decision()
    debug = os.environ.get("SPECDEC_DEBUG", "0") == "1"
    archs = os.environ.get("TORCH_CUDA_ARCH_LIST", "").strip() or DEFAULT_ARCHS
    if with_cuda:
        os.environ["TORCH_CUDA_ARCH_LIST"] = archs  # read by torch's CUDA flag builder
        _log(f"building CPU and CUDA kernels for archs {archs} ({reason})")
    else:
        _log(f"building CPU kernels only: {reason}")
    write_build_meta(with_cuda, archs, debug, reason)
    global _DIGEST
    _DIGEST = build_digest(with_cuda, archs, debug)  # hashed before compiling: edits during it count

    # -g0: Python's own CFLAGS (sysconfig) carry -g, and debug info for torch's headers was most of
    # each glue file's compile time and size (csrc/ops/ddtree_cpu.cpp: 36 -> 18 s, 4.8 MB -> 88 KB
    # on a 2-core EPYC); SPECDEC_DEBUG=1 keeps it.
    opt = ["-O0", "-g"] if debug else ["-O3", "-g0"]
    # -fopenmp: ATen's at::parallel_for is header-inline over OpenMP (torch's own backend), so
    # without it every parallel_for in the glue would run serially. The runtime is the libgomp.so.1
    # that libtorch_cpu already loaded (same soname), so torch.set_num_threads applies.
    cxx = ["-std=c++20", "-fopenmp", "-fvisibility=hidden"] + opt
    cxx += [f'-DSPECDEC_TORCH_VERSION="{torch.__version__}"', f'-DSPECDEC_VERSION="{VERSION}"']
    nvcc = ["-std=c++20", "--expt-relaxed-constexpr", "-Xcompiler=-fvisibility=hidden"]
    nvcc += ["-lineinfo", "-O0", "-G"] if debug else ["-O3", "-lineinfo"]
    if with_cuda:
        cxx += ["-DSPECDEC_WITH_CUDA", f'-DSPECDEC_CUDA_ARCHS="{archs}"']
    include_dirs = [os.path.join(ROOT, "csrc")]
    sources = source_files(with_cuda)
    kind = CUDAExtension if with_cuda else CppExtension
    extra = {"cxx": cxx, "nvcc": nvcc} if with_cuda else {"cxx": cxx}
    return kind(
        name="specdec_cuda._C",
        sources=sources,
        include_dirs=include_dirs,
        extra_compile_args=extra,
        extra_link_args=["-fopenmp"],
    )


setup(
    name="specdec_cuda",
    version=VERSION,
    description="Lossless speculative decoding kernels and orchestrator for PyTorch causal LMs",
    package_dir={"": "python"},
    packages=find_packages("python"),
    # SPECDEC_REGISTER_ONLY=1 (used by the Makefile): register the package in the environment
    # (`pip install -e`) without compiling; `setup.py build_ext --inplace` then builds the binary
    # incrementally in python/specdec_cuda/, where the editable install finds it.
    ext_modules=[] if os.environ.get("SPECDEC_REGISTER_ONLY") == "1" else [make_extension()],
    cmdclass={"build_ext": BuildExt},
    python_requires=">=3.10",
    install_requires=["numpy", "safetensors"],
    # real: what models.fetch needs to convert a registry GGUF file into a Hugging Face folder.
    extras_require={"hf": ["transformers"], "test": ["pytest", "scipy", "transformers"],
                    "real": ["transformers", "gguf", "accelerate"]},
    # vllm.general_plugins: vLLM calls register() in each of its processes (docs/integrations.md).
    entry_points={"console_scripts": ["specdec-cuda=specdec_cuda.__main__:main"],
                  "vllm.general_plugins": ["specdec_cuda = specdec_cuda.integrations.vllm:register"]},
    zip_safe=False,
)
