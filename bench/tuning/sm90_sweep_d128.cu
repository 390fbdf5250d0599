// sm90_sweep's head-dim-128 tiles (sm90_sweep.h). The first of each mask is the default.
#include "sm90_sweep.h"

namespace flashserve::bench {

std::vector<Sm90Variant> sm90_variants_d128() {
  using attention::sm90::EpilogueTile;
  using attention::sm90::Multicast;
  using attention::sm90::TileConfig;
  std::vector<Sm90Variant> v;
  // The library's short tiles first (with the tile boundary and, non-causal, multicast: as
  // run_fwd_tile_set launches them at up to 1k keys), then session 38's 64-key blocks.
  add_variant<Multicast<EpilogueTile<TileConfig<128, 128, 128>>>, false>(v,
                                                                         "d128 128x128 s2 epi mc");
  add_variant<Multicast<EpilogueTile<TileConfig<128, 128, 64, 4>>>, false>(v,
                                                                           "d128 128x64 s4 epi mc");
  add_variant<EpilogueTile<TileConfig<128, 128, 128>>, true>(v, "d128 128x128 s2 epi");
  add_variant<EpilogueTile<TileConfig<128, 128, 64, 4>>, true>(v, "d128 128x64 s4 epi");
  add_variant<EpilogueTile<TileConfig<128, 128, 96>>, true>(v, "d128 128x96 s2 epi");
  add_variant<TileConfig<128, 128, 176>, false>(v, "d128 128x176 s2");
  add_variant<Multicast<TileConfig<128, 128, 176>>, false>(v, "d128 128x176 s2 multicast");
  add_variant<TileConfig<128, 128, 128>, false>(v, "d128 128x128 s2");
  add_variant<Multicast<TileConfig<128, 128, 128>>, false>(v, "d128 128x128 s2 multicast");
  add_variant<TileConfig<128, 128, 128>, true>(v, "d128 128x128 s2");
  add_variant<TileConfig<128, 128, 176>, true>(v, "d128 128x176 s2");
  return v;
}

}  // namespace flashserve::bench
