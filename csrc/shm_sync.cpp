// futex wait/wake on shared words, monotonic clock, and /proc-based peer liveness.
#include "shm_sync.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstring>

namespace halshm {

uint64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ULL + uint64_t(ts.tv_nsec);
}

void futex_wait(std::atomic<uint32_t>* w, uint32_t expected, int64_t timeout_ns) {
  if (timeout_ns <= 0) return;
  timespec ts;
  ts.tv_sec = timeout_ns / 1000000000LL;
  ts.tv_nsec = timeout_ns % 1000000000LL;
  // Not FUTEX_PRIVATE_FLAG: the word lives in memory shared between processes.
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(w), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futex_wake_all(std::atomic<uint32_t>* w) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(w), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

// Reads state (field 3) and starttime (field 22) of /proc/<pid>/stat. The command name (field 2)
// may hold spaces and parentheses, so parsing starts after the last ')'.
static bool read_stat(int pid, char* state, uint64_t* starttime) {
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", pid);
  FILE* f = std::fopen(path, "r");
  if (!f) return false;
  char buf[1024];
  size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  char* p = std::strrchr(buf, ')');
  if (!p) return false;
  p += 2;  // ") " -> state
  *state = *p;
  // fields after state: 4..22; starttime is the 19th token after the state.
  int field = 3;
  while (*p && field < 22) {
    if (*p == ' ') {
      ++field;
      if (field == 22) {
        *starttime = std::strtoull(p + 1, nullptr, 10);
        return true;
      }
    }
    ++p;
  }
  return false;
}

void self_identity(int* pid, uint64_t* starttime) {
  *pid = int(getpid());
  char state = 0;
  *starttime = 0;
  read_stat(*pid, &state, starttime);
}

bool process_alive(int pid, uint64_t starttime) {
  if (pid <= 0) return true;  // not registered yet: nothing to judge
  char state = 0;
  uint64_t st = 0;
  if (!read_stat(pid, &state, &st)) return false;
  if (state == 'Z' || state == 'X' || state == 'x') return false;
  return starttime == 0 || st == starttime;
}

}  // namespace halshm
