// sm90_sweep's head-dim-256 tiles (sm90_sweep.h). The first of each mask is the default.
#include "sm90_sweep.h"

namespace flashserve::bench {

std::vector<Sm90Variant> sm90_variants_d256() {
  using attention::sm90::Multicast;
  using attention::sm90::TileConfig;
  std::vector<Sm90Variant> v;
  add_variant<TileConfig<256, 128, 80, 2, true>, false>(v, "d256 128x80 s2 lazy");
  add_variant<Multicast<TileConfig<256, 128, 80, 2, true>>, false>(v,
                                                                   "d256 128x80 s2 lazy multicast");
  add_variant<TileConfig<256, 128, 80>, false>(v, "d256 128x80 s2 eager");
  add_variant<TileConfig<256, 128, 80, 2, true>, true>(v, "d256 128x80 s2 lazy");
  add_variant<TileConfig<256, 128, 80>, true>(v, "d256 128x80 s2 eager");
  return v;
}

}  // namespace flashserve::bench
