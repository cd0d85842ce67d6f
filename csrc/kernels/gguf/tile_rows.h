// The loop both GGUF matmuls (matmul_body.h: float32 activations; q8_body.h: int8 activations)
// run over their tiles: rows n of W in steps of V::kRows, rows of x in tiles of up to kMaxMB, each
// tile instantiated for its exact height (its accumulators are arrays sized at compile time, kept
// in registers), and the format's loop picked by type id. Included, like the bodies that use it,
// inside each tier's anonymous namespace, so every tier instantiates it with its own target options.
//
//   Tile<V, MB>{args, n, m0}: rows n .. n + V::kRows - 1 of W against rows m0 .. m0 + MB - 1 of x,
//   with members q4_k(), q6_k() and legacy<type>() (Q8_0 = 8, Q5_0 = 6, Q4_1 = 3), and
//   kPrefetchInLoop: whether its loops call prefetch_ahead where prefetch_in_loop says so.
#pragma once

#include <cstdint>

// Software prefetch distance in bytes of W: before a tile's rows, the cache lines kPrefetchBytes
// further on are requested into L2 (locality 2). Tiles walk W's blocks in memory order, yet with
// the hardware prefetchers alone a one-row step of the real 1.5B ran at ~60% of the measured
// bandwidth (compute and memory waits serialised): 63 -> 53-55 ms per one-row step, 100 -> 85 ms
// per 5-row verification; the 0.5B's step (draft vocabulary 32768) 21 -> 17.6 ms
// (bench/bench_real_step.py, 2 threads, alternating runs). 1 KiB ahead gained less on the 0.5B,
// whose 896-wide rows are short; 3 KiB and more, or locality 3, no more; locality 0 lost. On a Zen 4
// EPYC 4 KiB pays where 2 KiB did not reach: 1.5B one-row step 50.5 -> 40.2 ms, 5 rows 96 -> 86 ms,
// 0.5B one-row 19.6 -> 16.8 ms (medians of 15 forwards, three alternating runs; 8 KiB no better).
//
// A tile longer than that (rows of a down projection: K = 8960 makes a Q6_K row 7350 bytes, a
// Q4_K row 5040) would have its own bytes requested, all at once, just before it reads them: the
// Q8 tiles then prefetch inside their block loop instead (prefetch_in_loop, prefetch_ahead), and
// a one-row step of the real 1.5B fell 41-44 -> 35-38.5 ms, 5 rows 78-81 -> 71-74 (Zen 4 EPYC, min
// of 21 forwards, four alternating processes; its down projection 0.51 -> 0.37 ms a layer).
constexpr int64_t kPrefetchBytes = 4096;

// Whether a tile of `rows` rows of W prefetches inside its block loop rather than before it.
inline bool prefetch_in_loop(int rows, int64_t row_bytes) { return rows * row_bytes > kPrefetchBytes; }

// The in-loop prefetch of a tile of `rows` rows of W, the first at `row0`, each row_bytes long:
// the `bytes` at offset off + kPrefetchBytes / rows of each row (so that the tile as a whole reads
// kPrefetchBytes behind its requests), one request per 64 bytes; past a row's end the same row of
// the next tile. Near the end of W the addresses may lie past it: prefetches do not fault.
inline void prefetch_ahead(const uint8_t* row0, int rows, int64_t row_bytes, int64_t off, int64_t bytes) {
  const int64_t ahead = off + kPrefetchBytes / rows;
  const uint8_t* p = ahead < row_bytes ? row0 + ahead : row0 + rows * row_bytes + (ahead - row_bytes);
  for (int r = 0; r < rows; ++r)
    for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(p + r * row_bytes + b, 0, 2);
}

template <class T>
void run_tile(const T& tile, int32_t type) {
  switch (type) {
    case 12: tile.q4_k(); break;
    case 14: tile.q6_k(); break;
    case 8: tile.template legacy<8>(); break;
    case 6: tile.template legacy<6>(); break;
    default: tile.template legacy<3>(); break;
  }
}

// Rows [n_begin, n_end) of y (n_end - n_begin a multiple of V::kRows), all M rows of x.
template <template <class, int> class Tile, class V, int kMaxMB, class Args>
void tile_rows(int32_t type, const Args& a, int64_t M, int64_t n_begin, int64_t n_end) {
  static_assert(kMaxMB >= 1 && kMaxMB <= 8, "tiles of 1 to 8 rows of x are instantiated");
  const bool long_tiles = Tile<V, 1>::kPrefetchInLoop && prefetch_in_loop(V::kRows, a.row_bytes);
  for (int64_t n = n_begin; n < n_end; n += V::kRows) {
    // the lines of this tile's rows shifted by kPrefetchBytes, while they lie inside [n_begin, n_end)
    if (!long_tiles && (n + V::kRows) * a.row_bytes + kPrefetchBytes <= n_end * a.row_bytes) {
      const uint8_t* ahead = a.weight + n * a.row_bytes + kPrefetchBytes;
      for (int64_t b = 0; b < V::kRows * a.row_bytes; b += 64) __builtin_prefetch(ahead + b, 0, 2);
    }
    for (int64_t m0 = 0; m0 < M; m0 += kMaxMB) {
      switch (M - m0 >= kMaxMB ? kMaxMB : M - m0) {
        case 1: run_tile(Tile<V, 1>{a, n, m0}, type); break;
        case 2: if constexpr (kMaxMB >= 2) run_tile(Tile<V, 2>{a, n, m0}, type); break;
        case 3: if constexpr (kMaxMB >= 3) run_tile(Tile<V, 3>{a, n, m0}, type); break;
        case 4: if constexpr (kMaxMB >= 4) run_tile(Tile<V, 4>{a, n, m0}, type); break;
        case 5: if constexpr (kMaxMB >= 5) run_tile(Tile<V, 5>{a, n, m0}, type); break;
        case 6: if constexpr (kMaxMB >= 6) run_tile(Tile<V, 6>{a, n, m0}, type); break;
        case 7: if constexpr (kMaxMB >= 7) run_tile(Tile<V, 7>{a, n, m0}, type); break;
        default: if constexpr (kMaxMB >= 8) run_tile(Tile<V, 8>{a, n, m0}, type); break;
      }
    }
  }
}
