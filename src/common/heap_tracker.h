// Counts the heap bytes a program holds, to measure (not estimate) the extra memory of a call: the
// `flashserve demo` table and the memory test use it. It works by replacing the global operator
// new/delete, which C++ allows once per program: exactly one source file of an executable defines
// FLASHSERVE_DEFINE_HEAP_TRACKER before including this header. What is counted: every allocation
// through operator new (std::vector, std::string, ... in any thread). Not counted: malloc called
// directly, over-aligned new, thread stacks, and the 16-byte size header added to each block.
#pragma once

#include <atomic>
#include <cstdint>

namespace flashserve::heap {

inline std::atomic<int64_t> g_current{0};
inline std::atomic<int64_t> g_peak{0};

inline int64_t current_bytes() {
  return g_current.load(std::memory_order_relaxed);
}
inline int64_t peak_bytes() {
  return g_peak.load(std::memory_order_relaxed);
}
// Starts a new measurement: the peak becomes the bytes held now.
inline void reset_peak() {
  g_peak.store(current_bytes(), std::memory_order_relaxed);
}

inline void note_alloc(int64_t n) {
  const int64_t now = g_current.fetch_add(n, std::memory_order_relaxed) + n;
  int64_t peak = g_peak.load(std::memory_order_relaxed);
  while (now > peak && !g_peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}
inline void note_free(int64_t n) {
  g_current.fetch_sub(n, std::memory_order_relaxed);
}

}  // namespace flashserve::heap

#if defined(FLASHSERVE_DEFINE_HEAP_TRACKER)
#include <cstdlib>
#include <new>

namespace flashserve::heap {
constexpr std::size_t kHeader = 16;  // keeps the 16-byte alignment malloc gives
inline void* tracked_alloc(std::size_t n) noexcept {
  void* p = std::malloc(n + kHeader);
  if (!p) return nullptr;
  *static_cast<std::size_t*>(p) = n;
  note_alloc(static_cast<int64_t>(n));
  return static_cast<char*>(p) + kHeader;
}
inline void tracked_free(void* p) noexcept {
  if (!p) return;
  void* base = static_cast<char*>(p) - kHeader;
  note_free(static_cast<int64_t>(*static_cast<std::size_t*>(base)));
  std::free(base);
}
inline void* tracked_alloc_or_throw(std::size_t n) {
  void* p = tracked_alloc(n);
  if (!p) throw std::bad_alloc();
  return p;
}
}  // namespace flashserve::heap

void* operator new(std::size_t n) {
  return flashserve::heap::tracked_alloc_or_throw(n);
}
void* operator new[](std::size_t n) {
  return flashserve::heap::tracked_alloc_or_throw(n);
}
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  return flashserve::heap::tracked_alloc(n);
}
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept {
  return flashserve::heap::tracked_alloc(n);
}
void operator delete(void* p) noexcept {
  flashserve::heap::tracked_free(p);
}
void operator delete[](void* p) noexcept {
  flashserve::heap::tracked_free(p);
}
void operator delete(void* p, std::size_t) noexcept {
  flashserve::heap::tracked_free(p);
}
void operator delete[](void* p, std::size_t) noexcept {
  flashserve::heap::tracked_free(p);
}
void operator delete(void* p, const std::nothrow_t&) noexcept {
  flashserve::heap::tracked_free(p);
}
void operator delete[](void* p, const std::nothrow_t&) noexcept {
  flashserve::heap::tracked_free(p);
}
#endif
