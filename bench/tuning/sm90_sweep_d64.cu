// sm90_sweep's head-dim-64 tiles (sm90_sweep.h). The first of each mask is the default.
#include "sm90_sweep.h"

namespace flashserve::bench {

std::vector<Sm90Variant> sm90_variants_d64() {
  using attention::sm90::TileConfig;
  std::vector<Sm90Variant> v;
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
