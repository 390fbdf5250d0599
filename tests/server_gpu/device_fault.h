// A device fault on demand (device_fault.cu), for tests only.
#pragma once

namespace flashserve::testing {

// Enqueues on `stream` (a cudaStream_t) a kernel that stores through a null pointer: once it runs,
// the context has a sticky cudaErrorIllegalAddress. Errors of the launch itself are not reported
// (the fault is the point).
void launch_illegal_store(void* stream);

}  // namespace flashserve::testing
