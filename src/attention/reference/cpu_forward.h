// The production CPU attention path (cpu_forward, declared in backends.h): tiled online softmax.
//
// Work is cut into tiles: one sequence, one KV head, a block of queries and (with split-KV) one
// split of the keys. A tile holds the queries of every query head that shares the KV head (GQA), so
// each block of keys and values is read (and converted to float32) once for the whole group. The
// tile walks the key blocks its mask lets it see (blocks wholly outside the mask are never
// touched, which halves causal work), and per block:
//   S^T = K_block Q_tile^T   (block_gemm; key-major, so float32 keys are read in place)
//   block_softmax: mask, running max m and sum l per row in log2 units, P = exp2(S - m)
//   acc = acc * corr + P V_block   (block_gemm, P read column-wise from S^T)
// Memory is O(tile) per worker (about 0.5 MiB at head dim 128, within L2); split-KV adds the
// partials (see combine.h) of a chunk of rows at a time, at most 32 MiB (or one query block),
// never O(num_splits * all rows) and never O(N^2). What was tried: docs/cpu-path.md.
#pragma once

#include <cstddef>
#include <cstdint>

#include "attention/problem.h"

namespace flashserve::attention {

struct CpuTiling {
  // Keys per block: the S^T block (256 x 128 floats), a converted K and V block and the tile's
  // queries stay in L2 (2 MiB on the Xeons we target); longer blocks amortise each row's
  // running-max update and acc rescale over more keys.
  static constexpr int64_t kBlockK = 256;
  // Query rows (queries x heads of a group) per tile: each K/V element loaded feeds this many rows
  // in the block products; 128 keeps 8 tiles per head and 1k queries for the threads.
  static constexpr int64_t kTileRows = 128;
  // Queries per tile for a GQA group of `group` query heads per KV head.
  static int64_t block_q(int64_t group) { return group >= kTileRows ? 1 : kTileRows / group; }
  // Rows of a tile (its queries times the group's heads): what each worker's buffers hold.
  static int64_t tile_rows(int64_t group) { return block_q(group) * group; }
};

// bf16 inputs without AMX: block products in bf16 pairs (AVX512-BF16 vdpbf16ps) instead of
// converting the blocks to float32. Off by default: on the Xeon measured (docs/cpu-path.md)
// vdpbf16ps ran at 0.6x the float32 FMA kernel's FLOP rate, so converting is faster there. The
// environment variable FLASHSERVE_CPU_BF16_PAIRS=1 turns it on at start (bench_cpu_attn
// --bf16-pairs measures both).
void cpu_use_bf16_pairs(bool on);
bool cpu_bf16_pairs();

// bf16 inputs with head dims multiples of 32: block products on AMX tiles (cpu_amx.h), P rounded
// to bf16, where the CPU and OS have AMX-BF16 (2-2.5x the converted path per core on the build
// machine). On by default; FLASHSERVE_CPU_AMX=0 at start, or this call, turns it off, as does
// forcing the ISA below kAvx512Bf16. Takes precedence over bf16 pairs. cpu_amx(): enabled and
// available on this machine.
void cpu_use_amx(bool on);
bool cpu_amx();

// The number of key splits cpu_forward uses for this problem with `workers` threads: num_splits
// when it is positive; for 0 (automatic), more than one only when the unsplit tiles are fewer
// than the workers and the keys are long enough for each split to get several blocks.
int32_t cpu_num_splits(const Problem& problem, int workers);

// Bytes of heap scratch cpu_forward allocates for this problem with `workers` threads (per-worker
// tile buffers plus, when split, the partials). Independent of the sequence lengths when unsplit.
size_t cpu_scratch_bytes(const Problem& problem, int64_t total_q_rows, int workers);

}  // namespace flashserve::attention
