// sm90_sweep's head-dim-64 tiles (sm90_sweep.h). The first of each mask is the default.
#include "sm90_sweep.h"

namespace flashserve::bench {

std::vector<Sm90Variant> sm90_variants_d64() {
  using attention::sm90::EpilogueTile;
  using attention::sm90::TileConfig;
  std::vector<Sm90Variant> v;
  // The library's tiles first (with the tile boundary, as run_fwd_tile_set launches them at up
  // to 1k keys), then the alternatives of session 38: more K/V stages, 64-key blocks.
  add_variant<EpilogueTile<TileConfig<64, 192, 128>>, false>(v, "d64 192x128 s2 epi");
  add_variant<EpilogueTile<TileConfig<64, 192, 128, 3>>, false>(v, "d64 192x128 s3 epi");
  add_variant<EpilogueTile<TileConfig<64, 128, 128, 3>>, false>(v, "d64 128x128 s3 epi");
  add_variant<EpilogueTile<TileConfig<64, 128, 128>>, true>(v, "d64 128x128 s2 epi");
  add_variant<EpilogueTile<TileConfig<64, 128, 128, 3>>, true>(v, "d64 128x128 s3 epi");
  add_variant<EpilogueTile<TileConfig<64, 128, 64, 4>>, true>(v, "d64 128x64 s4 epi");
  add_variant<EpilogueTile<TileConfig<64, 192, 128>>, true>(v, "d64 192x128 s2 epi");
  add_variant<TileConfig<64, 192, 128>, false>(v, "d64 192x128 s2");
  add_variant<TileConfig<64, 192, 128, 2, true>, false>(v, "d64 192x128 s2 lazy");
  add_variant<TileConfig<64, 192, 128, 2, false, true>, false>(v, "d64 192x128 s2 tma-o");
  add_variant<TileConfig<64, 128, 128>, false>(v, "d64 128x128 s2");
  add_variant<TileConfig<64, 192, 128>, true>(v, "d64 192x128 s2");
  add_variant<TileConfig<64, 192, 128, 2, true>, true>(v, "d64 192x128 s2 lazy");
  add_variant<TileConfig<64, 128, 128>, true>(v, "d64 128x128 s2");
  add_variant<TileConfig<64, 128, 128, 2, false, true>, true>(v, "d64 128x128 s2 tma-o");
  return v;
}

}  // namespace flashserve::bench
