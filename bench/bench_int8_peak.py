"""The int8 multiply ceiling of one core: how many u8 x s8 products per second its dot-product
instructions can issue, against which the GGUF kernels' multi-row speed is read.

    python bench/bench_int8_peak.py [--out PATH]

A verification forward and a prompt's prefill multiply many rows of x by each weight, so on a CPU
without AMX they are bound by the integer dot products, not by memory: bench/bench_gguf_compute.py
gives ns per 256 weights and row of x, and this bench the floor under it. It compiles a small C
program with the system compiler (``cc -O2 -march=native``) that runs each instruction on 12
independent accumulators (throughput, not latency), one thread, and a dependent chain of scalar
adds to read the clock; it reports cycles per instruction and G MAC/s per core for:

- ``vpdpbusd`` zmm / ymm (AVX-512 VNNI: 64 / 32 products each), where the CPU has it;
- ``vpmaddubsw`` zmm / ymm (pairs of products into int16: 64 / 32), the AVX-512 BW / AVX2 body
  (its int16 sums still need a ``vpmaddwd`` to widen, which this does not count);
- ``vdpbf16ps`` zmm (AVX-512 BF16: 32 bfloat16 products), for comparison with a bf16 kernel;
- ``vfmadd231ps`` zmm / ymm (16 / 8 float32 products).

With VNNI it also times SKETCH below: the inner loop the Q8K prefill kernel (csrc/kernels/gguf/q8k.h)
was built from, without its decoding or its loads of real blocks (not a kernel of the library).
Then, where bench/results/gguf_compute.json exists, each format's share of the peak: 256 products
per (super-block, row) over its ns per super-block and row, at its fastest row count.
JSON to bench/results/int8_peak.json. Needs a C compiler; x86-64 only.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")

# Each entry: name, products per instruction, the C feature test, the accumulator type and the
# statement run on accumulator a[j] (u, s: the operands).
KERNELS = [
    ("vpdpbusd zmm", 64, "__AVX512VNNI__", "__m512i", "a[j] = _mm512_dpbusd_epi32(a[j], u512, s512);"),
    ("vpdpbusd ymm", 32, "__AVX512VNNI__) && defined(__AVX512VL__", "__m256i",
     "a[j] = _mm256_dpbusd_epi32(a[j], u256, s256);"),
    # the accumulator is also the u8 operand, so the product cannot be hoisted out of the loop
    ("vpmaddubsw zmm", 64, "__AVX512BW__", "__m512i", "a[j] = _mm512_maddubs_epi16(a[j], s512);"),
    ("vpmaddubsw ymm", 32, "__AVX2__", "__m256i", "a[j] = _mm256_maddubs_epi16(a[j], s256);"),
    ("vdpbf16ps zmm", 32, "__AVX512BF16__", "__m512", "a[j] = _mm512_dpbf16_ps(a[j], b512, c512);"),
    ("vfmadd231ps zmm", 16, "__AVX512F__", "__m512", "a[j] = _mm512_fmadd_ps(a[j], f512, g512);"),
    ("vfmadd231ps ymm", 8, "__FMA__", "__m256", "a[j] = _mm256_fmadd_ps(a[j], f256, g256);"),
]

PRELUDE = r"""
#include <immintrin.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
#define ITERS 20000000L
#define ACC 12  /* ACCUMULATORS */
volatile long sink;
static double clock_ghz(void) {
  long x = 0; double t = now();
  for (long i = 0; i < 4 * ITERS; ++i) __asm__ volatile("add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0" : "+r"(x));
  double dt = now() - t; sink = x; return 16.0 * ITERS / dt / 1e9;
}
int main(void) {
  printf("clock_ghz %.4f\n", clock_ghz());
"""

BODY = r"""
#if defined({test})
  {{
    {decls}
    {operands}
    double t = now();
    for (long i = 0; i < ITERS; ++i) {{
      {stmts}
    }}
    double dt = now() - t;
    unsigned char bytes[sizeof(a0)]; memcpy(bytes, &a0, sizeof(a0)); sink = bytes[0];
    printf("{name}|%.6f\n", dt / (ITERS * (double)ACC) * 1e9);
  }}
#endif
"""

ZERO = {"__m512i": "_mm512_setzero_si512()", "__m256i": "_mm256_setzero_si256()", "__m512": "_mm512_setzero_ps()",
        "__m256": "_mm256_setzero_ps()"}
ACCUMULATORS = 12  # independent chains: more than latency x issue width of any of them

OPERANDS = """__m512i u512 = _mm512_set1_epi8(3), s512 = _mm512_set1_epi8(-2);
    __m256i u256 = _mm256_set1_epi8(3), s256 = _mm256_set1_epi8(-2);
    __m512 f512 = _mm512_set1_ps(1.0f), g512 = _mm512_set1_ps(1e-9f);
    __m256 f256 = _mm256_set1_ps(1.0f), g256 = _mm256_set1_ps(1e-9f);
#if defined(__AVX512BF16__)
    __m512bh b512 = (__m512bh)_mm512_set1_epi32(0x3f803f80), c512 = (__m512bh)_mm512_set1_epi32(0x3c003c00);
#endif
    __asm__ volatile("" : "+v"(u512), "+v"(s512), "+v"(u256), "+v"(s256), "+v"(f512), "+v"(g512), "+v"(f256), "+v"(g256));"""


# The inner loop of a prefill GEMM for CPUs without AMX, as it was sketched to size the route before
# the library's Q8K kernel (csrc/kernels/gguf/q8k_avx512_vnni.cpp) was built from it; kept as the
# kernel's ceiling on the machine at hand (not a kernel of the library): Q4_K-like super-blocks
# with 16 rows of W in the lanes, their codes decoded beforehand into [t][sub-block j][step s][16
# rows][4 codes] (done once per prompt chunk in such a kernel, not timed), x as int8 with one scale
# per 256 values and per-sub-block sums (Q8_K-like), MB rows of x per register tile. Per row of x
# and super-block of 16 rows: 64 vpdpbusd, the sub-block scales and mins applied in integers (16
# vpmulld), then two converts and two fused multiply-adds.
SKETCH = r"""
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
#define K 1536
#define T (K / 256)
#define NR 256
#define MB 4
#define M 96
int main(void) {
  uint8_t* W = aligned_alloc(64, (size_t)NR / 16 * T * 64 * 64);
  int32_t* SC = aligned_alloc(64, (size_t)NR / 16 * T * 8 * 16 * 4);
  int32_t* MN = aligned_alloc(64, (size_t)NR / 16 * T * 8 * 16 * 4);
  float* D = aligned_alloc(64, (size_t)NR / 16 * T * 16 * 4);
  float* DM = aligned_alloc(64, (size_t)NR / 16 * T * 16 * 4);
  int8_t* X = aligned_alloc(64, (size_t)M * K);
  float* DX = aligned_alloc(64, (size_t)M * T * 4);
  int32_t* BS = aligned_alloc(64, (size_t)M * T * 8 * 4);
  float* Y = aligned_alloc(64, (size_t)M * NR * 4);
  srand(1);
  for (size_t i = 0; i < (size_t)NR / 16 * T * 64 * 64; ++i) W[i] = rand() & 15;
  for (size_t i = 0; i < (size_t)NR / 16 * T * 8 * 16; ++i) { SC[i] = rand() & 63; MN[i] = rand() & 63; }
  for (size_t i = 0; i < (size_t)NR / 16 * T * 16; ++i) { D[i] = 1e-3f; DM[i] = 2e-3f; }
  for (size_t i = 0; i < (size_t)M * K; ++i) X[i] = (int8_t)(rand() % 255 - 127);
  for (size_t i = 0; i < (size_t)M * T; ++i) DX[i] = 0.01f;
  for (size_t i = 0; i < (size_t)M * T * 8; ++i) BS[i] = rand() % 1000;
  double best = 1e9;
  for (int r = 0; r < 200; ++r) {
    double t0 = now();
    for (int g = 0; g < NR / 16; ++g)
      for (int m0 = 0; m0 < M; m0 += MB) {
        __m512 A[MB];
        for (int i = 0; i < MB; ++i) A[i] = _mm512_setzero_ps();
        for (int t = 0; t < T; ++t) {
          const uint8_t* w = W + ((size_t)g * T + t) * 64 * 64;
          const int32_t* sc = SC + ((size_t)g * T + t) * 8 * 16;
          const int32_t* mn = MN + ((size_t)g * T + t) * 8 * 16;
          __m512i S[MB], Mi[MB];
          for (int i = 0; i < MB; ++i) { S[i] = _mm512_setzero_si512(); Mi[i] = _mm512_setzero_si512(); }
          for (int j = 0; j < 8; ++j) {
            __m512i acc[MB];
            for (int i = 0; i < MB; ++i) acc[i] = _mm512_setzero_si512();
            for (int s = 0; s < 8; ++s) {
              const __m512i wv = _mm512_load_si512(w + (j * 8 + s) * 64);
              for (int i = 0; i < MB; ++i) {
                int32_t xv;
                memcpy(&xv, X + (size_t)(m0 + i) * K + t * 256 + j * 32 + 4 * s, 4);
                acc[i] = _mm512_dpbusd_epi32(acc[i], wv, _mm512_set1_epi32(xv));
              }
            }
            const __m512i scv = _mm512_load_si512(sc + j * 16), mnv = _mm512_load_si512(mn + j * 16);
            for (int i = 0; i < MB; ++i) {
              S[i] = _mm512_add_epi32(S[i], _mm512_mullo_epi32(acc[i], scv));
              Mi[i] = _mm512_add_epi32(Mi[i], _mm512_mullo_epi32(mnv, _mm512_set1_epi32(BS[((size_t)(m0 + i) * T + t) * 8 + j])));
            }
          }
          const __m512 d = _mm512_load_ps(D + ((size_t)g * T + t) * 16), dm = _mm512_load_ps(DM + ((size_t)g * T + t) * 16);
          for (int i = 0; i < MB; ++i) {
            const __m512 dx = _mm512_set1_ps(DX[(size_t)(m0 + i) * T + t]);
            A[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(S[i]), _mm512_mul_ps(d, dx), A[i]);
            A[i] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(Mi[i]), _mm512_mul_ps(dm, dx), A[i]);
          }
        }
        for (int i = 0; i < MB; ++i) _mm512_storeu_ps(Y + (size_t)(m0 + i) * NR + g * 16, A[i]);
      }
    double dt = now() - t0;
    if (dt < best) best = dt;
  }
  printf("sketch|%.6f|%g\n", best / ((double)M * NR * T) * 1e9, Y[0]);
  return 0;
}
"""


def source() -> str:
    parts = [PRELUDE]
    for name, _, test, acc, stmt in KERNELS:
        # named accumulators (an array would live on the stack), each kept opaque in its register
        decls = " ".join(f"{acc} a{j} = {ZERO[acc]};" for j in range(ACCUMULATORS))
        stmts = "\n      ".join(stmt.replace("a[j]", f"a{j}") + f' __asm__ volatile("" : "+v"(a{j}));'
                                for j in range(ACCUMULATORS))
        parts.append(BODY.format(test=test, decls=decls, operands=OPERANDS, stmts=stmts, name=name))
    parts.append("  return 0;\n}\n")
    return "".join(parts)


def run_c(cc: str, text: str, opt: str = "-O2") -> list[str]:
    """Compile ``text`` natively and return the lines it prints."""
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = os.path.join(tmp, "prog.c"), os.path.join(tmp, "prog")
        with open(src, "w") as f:
            f.write(text)
        subprocess.run([cc, opt, "-march=native", "-Wno-psabi", src, "-o", exe], check=True)
        return subprocess.run([exe], check=True, capture_output=True, text=True).stdout.splitlines()


def sketch_ns(cc: str) -> float | None:
    """ns per super-block and row of x of the prefill GEMM sketch (SKETCH), or None without VNNI."""
    probe = run_c(cc, "#include <stdio.h>\nint main(void) {\n#if defined(__AVX512VNNI__)\n puts(\"1\");\n"
                      "#else\n puts(\"0\");\n#endif\n return 0; }\n")
    if probe != ["1"]:
        return None
    line = run_c(cc, SKETCH, "-O3")[0]
    return float(line.split("|")[1])


def measure(cc: str) -> dict:
    lines = run_c(cc, source())
    ghz = float(lines[0].split()[1])
    macs = {name: n for name, n, *_ in KERNELS}
    rows = {}
    for line in lines[1:]:
        name, ns = line.split("|")
        ns = float(ns)
        rows[name] = {"ns_per_instruction": ns, "cycles_per_instruction": ns * ghz,
                      "gmac_per_s": macs[name] / ns}
    return {"clock_ghz": ghz, "instructions": rows}


def kernel_efficiency(peak: dict, path: str) -> dict:
    """bench_gguf_compute.py's formats at their fastest row count, as a share of the int8 peak."""
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        compute = json.load(f)
    best = max((r["gmac_per_s"] for n, r in peak["instructions"].items() if "vpdpbusd" in n or "maddubsw" in n),
               default=None)
    out = {}
    for r in compute.get("results", []):  # each format's fastest row count
        gmac = 256 / r["ns_per_superblock_row"]
        if r["format"] not in out or gmac > out[r["format"]]["gmac_per_s"]:
            out[r["format"]] = {"rows": r["rows"], "gmac_per_s": gmac, "share_of_peak": gmac / best if best else None}
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cc", default=os.environ.get("CC", "cc"))
    p.add_argument("--compute", default=os.path.join(RESULTS, "gguf_compute.json"),
                   help="bench_gguf_compute.py's JSON, for the kernels' share of the peak")
    p.add_argument("--out", default=os.path.join(RESULTS, "int8_peak.json"))
    args = p.parse_args(argv)
    if shutil.which(args.cc) is None:
        print(f"no C compiler ({args.cc}); set --cc or CC", file=sys.stderr)
        return 2
    peak = measure(args.cc)
    print(f"clock {peak['clock_ghz']:.2f} GHz (a dependent chain of scalar adds), one thread, 12 accumulators")
    print(f"{'instruction':<18}{'cycles':>8}{'G MAC/s':>10}")
    for name, r in peak["instructions"].items():
        print(f"{name:<18}{r['cycles_per_instruction']:>8.2f}{r['gmac_per_s']:>10.1f}")
    sketch = sketch_ns(args.cc)
    if sketch is not None:
        best = max(r["gmac_per_s"] for n, r in peak["instructions"].items() if "vpdpbusd" in n)
        peak["prefill_gemm_sketch"] = {"ns_per_superblock_row": sketch, "gmac_per_s": 256 / sketch,
                                       "share_of_peak": 256 / sketch / best}
        print(f"\nprefill GEMM sketch (16 outputs in the lanes, per-256 x scales, 96 rows of x): "
              f"{sketch:.2f} ns per super-block and row, {256 / sketch:.1f} G MAC/s, "
              f"{100 * 256 / sketch / best:.0f}% of the int8 peak")
    eff = kernel_efficiency(peak, args.compute)
    if eff:
        print("\nbench_gguf_compute.py's kernels at their fastest row count (256 products per super-block and row):")
        for fmt, r in eff.items():
            share = f"{100 * r['share_of_peak']:.0f}% of the int8 peak" if r["share_of_peak"] else ""
            print(f"  {fmt:<12} {r['rows']:>4} rows  {r['gmac_per_s']:6.1f} G MAC/s  {share}")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"peak": peak, "kernels": eff}, f, indent=1)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
