// sm90_sweep's head-dim-128 tiles (sm90_sweep.h). The first of each mask is the default.
#include "sm90_sweep.h"

namespace flashserve::bench {

std::vector<Sm90Variant> sm90_variants_d128() {
  using attention::sm90::Multicast;
  using attention::sm90::TileConfig;
  std::vector<Sm90Variant> v;
  add_variant<TileConfig<128, 128, 176>, false>(v, "d128 128x176 s2");
  add_variant<Multicast<TileConfig<128, 128, 176>>, false>(v, "d128 128x176 s2 multicast");
  add_variant<TileConfig<128, 128, 128>, false>(v, "d128 128x128 s2");
  add_variant<Multicast<TileConfig<128, 128, 128>>, false>(v, "d128 128x128 s2 multicast");
  add_variant<TileConfig<128, 128, 128>, true>(v, "d128 128x128 s2");
  add_variant<TileConfig<128, 128, 176>, true>(v, "d128 128x176 s2");
  return v;
}

}  // namespace flashserve::bench
