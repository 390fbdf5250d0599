// Programmatic dependent launch (Hopper): a kernel launched with it may start while the kernel
// before it on the stream is still finishing, and waits for that kernel's results only where it
// reads them. A decode step is ~300 short kernels whose boundaries (the previous kernel's last
// wave draining, the next one's launch and ramp) cost a few microseconds each; a kernel may load
// what no kernel writes (the norm's weights) before it waits. Used by the CUDA runner's kernels
// (model/cuda) and the sm80 attention kernels (AttentionRunOptions::programmatic_launch).
//
// The rule that keeps it correct: a kernel launched with `pdl` calls wait_for_producer() in every
// thread before it reads anything an earlier kernel wrote or writes anything an earlier kernel may
// still read, and before it exits (so that its own completion implies its producer's: a kernel
// after it may rely on that). Kernels that are not launched with it need nothing. On devices
// before sm_90 both calls compile to nothing and the host launches without the attribute.
#pragma once

#include <cuda_runtime.h>

namespace flashserve::pdl {

__device__ __forceinline__ void wait_for_producer() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the next kernel's blocks be scheduled as this grid's blocks retire (they still wait for
// this grid's completion before reading its output).
__device__ __forceinline__ void release_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;");
#endif
}

// The launch attribute that makes a launch programmatic (for launches that set other attributes
// too; launch() below is the plain case).
inline cudaLaunchAttribute attribute() {
  cudaLaunchAttribute a{};
  a.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  a.val.programmaticStreamSerializationAllowed = 1;
  return a;
}

// kernel<<<grid, block, smem, stream>>>(args...), with the programmatic-serialization attribute
// when `pdl` (the caller checks the device is sm_90 or later).
template <typename... Params, typename... Args>
cudaError_t launch(bool pdl, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                   cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attribute = pdl::attribute();
  config.attrs = &attribute;
  config.numAttrs = pdl ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, static_cast<Params>(args)...);
}

}  // namespace flashserve::pdl
