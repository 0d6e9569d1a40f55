// Cross-process waiting without burning a core: Linux futex on shared 32-bit words, clocks, and the
// peer liveness check used while waiting.
#pragma once

#include <atomic>
#include <cstdint>

#include "shm_common.h"

namespace halshm {

uint64_t now_ns();

// Sleep while *w == expected, at most timeout_ns (spurious returns allowed; callers re-check).
void futex_wait(std::atomic<uint32_t>* w, uint32_t expected, int64_t timeout_ns);
void futex_wake_all(std::atomic<uint32_t>* w);

// Store `value` and wake sleepers only if there are any (saves a syscall on the fast path).
inline void publish(Word& w, uint32_t value) {
  w.v.store(value, std::memory_order_seq_cst);
  if (w.waiters.load(std::memory_order_seq_cst) != 0) futex_wake_all(&w.v);
}

// Increment and wake sleepers if any.
inline void bump(Word& w) {
  w.v.fetch_add(1, std::memory_order_seq_cst);
  if (w.waiters.load(std::memory_order_seq_cst) != 0) futex_wake_all(&w.v);
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

// This process's pid and start time (clock ticks since boot), as peers will check them.
void self_identity(int* pid, uint64_t* starttime);
// False when the process is gone, a zombie, or the pid now belongs to another process.
bool process_alive(int pid, uint64_t starttime);

}  // namespace halshm
