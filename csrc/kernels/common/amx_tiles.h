// The AMX tile configuration both AMX kernels load (skinny_linear/packed_amx.cpp, gguf/bf16_amx.cpp):
// the 64-byte block LDTILECFG reads, palette 1. Plain data: no intrinsics, so it needs no target.
#pragma once

#include <cstdint>

namespace specdec {

struct alignas(64) AmxTileConfig {
  uint8_t palette_id = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};  // bytes per row of tile register t
  uint8_t rows[16] = {};    // rows of tile register t

  // Tile registers 0 .. count - 1 of 16 rows of 64 bytes each (the GGUF tile kernels' one shape).
  static AmxTileConfig full(int count = 8) {
    AmxTileConfig c;
    for (int t = 0; t < count; ++t) {
      c.rows[t] = 16;
      c.colsb[t] = 64;
    }
    return c;
  }
};

}  // namespace specdec
