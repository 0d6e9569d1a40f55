// Segment set-up and the collectives. Every data step is a "phase": each rank writes into its own
// slot of buffer (phase % 2), publishes the phase number on its futex word, waits until every peer
// published it, then reads peers' slots. A buffer is rewritten two phases later, which a rank can
// only reach after every peer arrived at the phase in between, i.e. finished reading: so one
// arrival per phase is the only synchronization needed.
#include "shm_comm.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "shm_reduce.h"
#include "shm_sync.h"

namespace halshm {

const char* op_name(int32_t op) {
  switch (op) {
    case kAllReduce: return "all_reduce";
    case kBroadcast: return "broadcast";
    case kAllGather: return "all_gather";
    case kReduceScatter: return "reduce_scatter";
    case kAllToAll: return "all_to_all";
    case kBarrier: return "barrier";
    case kSend: return "send";
    case kRecv: return "recv";
    default: return "?";
  }
}

const char* dtype_name(int32_t dt) {
  static const char* names[] = {"float32", "float16", "bfloat16", "float64", "int8", "uint8",
                                "int16", "int32", "int64", "bool", "bytes"};
  return (dt >= 0 && dt <= kBytes) ? names[dt] : "?";
}

const char* redop_name(int32_t op) {
  static const char* names[] = {"sum", "avg", "max", "min", "product", "band", "bor", "bxor"};
  return (op >= 0 && op <= kBxor) ? names[op] : "-";
}

size_t dtype_size(int32_t dt) {
  switch (dt) {
    case kF32: case kI32: return 4;
    case kF16: case kBF16: case kI16: return 2;
    case kF64: case kI64: return 8;
    default: return 1;
  }
}

static std::string sys_error(const char* what, const std::string& name) {
  return std::string(what) + "(" + name + "): " + std::strerror(errno);
}

size_t Comm::segment_size(int world, const Config& cfg) {
  const size_t hdr = round_up(sizeof(Header), 4096);
  const size_t coll = 2 * size_t(world) * cfg.slot_bytes;
  const size_t chan = round_up(sizeof(ChanCtl) + size_t(cfg.p2p_slots) * (sizeof(SlotHdr) + cfg.p2p_slot_bytes), 4096);
  return hdr + coll + size_t(world) * size_t(world) * chan;
}

Comm::Comm(const std::string& name, bool create, int rank, int world, const Config& cfg)
    : name_(name), rank_(rank), world_(world), cfg_(cfg) {
  if (world < 1 || world > kMaxRanks)
    throw ShmFailure(kSetup, "shm: world_size " + std::to_string(world) + " is outside 1.." + std::to_string(kMaxRanks), rank);
  if (rank < 0 || rank >= world)
    throw ShmFailure(kSetup, "shm: rank " + std::to_string(rank) + " is outside 0.." + std::to_string(world - 1), rank);
  if (cfg.slot_bytes < 4096 || cfg.slot_bytes % 64 != 0 || cfg.slot_bytes / size_t(world) < 64)
    throw ShmFailure(kSetup, "shm: slot_bytes " + std::to_string(cfg.slot_bytes) +
                                 " must be >= 4096, a multiple of 64, and >= 64 x world_size", rank);
  if (cfg.p2p_slot_bytes < 64 || cfg.p2p_slot_bytes % 64 != 0 || cfg.p2p_slots < 1)
    throw ShmFailure(kSetup, "shm: p2p_slot_bytes must be a multiple of 64 (>= 64) and p2p_slots >= 1", rank);
  coll_off_ = round_up(sizeof(Header), 4096);
  p2p_off_ = coll_off_ + 2 * size_t(world) * cfg.slot_bytes;
  slot_stride_ = sizeof(SlotHdr) + cfg.p2p_slot_bytes;
  chan_bytes_ = round_up(sizeof(ChanCtl) + size_t(cfg.p2p_slots) * slot_stride_, 4096);
  total_ = segment_size(world, cfg);

  int fd = create ? shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600) : shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) throw ShmFailure(kSetup, sys_error("shm_open", name), rank);
  if (create && ftruncate(fd, off_t(total_)) != 0) {
    std::string msg = sys_error("ftruncate", name);
    ::close(fd);
    shm_unlink(name.c_str());
    throw ShmFailure(kSetup, msg, rank);
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || size_t(st.st_size) != total_) {
    ::close(fd);
    throw ShmFailure(kSetup, "shm: segment " + name + " has " + std::to_string(size_t(st.st_size)) +
                                 " bytes, this rank expects " + std::to_string(total_) +
                                 " (ranks disagree on world_size or slot sizes)", rank);
  }
  void* p = mmap(nullptr, total_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);  // the mapping keeps the memory; the fd is not needed
  if (p == MAP_FAILED) {
    if (create) shm_unlink(name.c_str());
    throw ShmFailure(kSetup, sys_error("mmap", name), rank);
  }
  base_ = static_cast<char*>(p);
  hdr_ = reinterpret_cast<Header*>(base_);
  coll_ = base_ + coll_off_;
  if (create) {
    hdr_->version = kVersion;
    hdr_->world = uint32_t(world);
    hdr_->slot_bytes = cfg.slot_bytes;
    hdr_->p2p_slot_bytes = cfg.p2p_slot_bytes;
    hdr_->p2p_slots = uint64_t(cfg.p2p_slots);
    hdr_->total_bytes = total_;
    std::atomic_thread_fence(std::memory_order_release);
    reinterpret_cast<std::atomic<uint64_t>*>(&hdr_->magic)->store(kMagic, std::memory_order_release);
  } else {
    const uint64_t magic = reinterpret_cast<std::atomic<uint64_t>*>(&hdr_->magic)->load(std::memory_order_acquire);
    if (magic != kMagic || hdr_->version != kVersion || hdr_->world != uint32_t(world) ||
        hdr_->slot_bytes != cfg.slot_bytes || hdr_->p2p_slot_bytes != cfg.p2p_slot_bytes ||
        hdr_->p2p_slots != uint64_t(cfg.p2p_slots)) {
      munmap(base_, total_);
      base_ = nullptr;
      throw ShmFailure(kSetup, "shm: segment " + name + " was made for another configuration (world size, slot "
                               "sizes or version differ between ranks)", rank);
    }
  }
  int pid;
  uint64_t starttime;
  self_identity(&pid, &starttime);
  hdr_->ranks[rank].pid = pid;
  hdr_->ranks[rank].starttime = starttime;
  reinterpret_cast<std::atomic<int32_t>*>(&hdr_->ranks[rank].joined)->store(1, std::memory_order_release);
}

Comm::~Comm() { close(); }

void Comm::close() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (closed_) return;
    closed_ = true;
    stop_.store(true);
  }
  cv_.notify_all();
  if (engine_.joinable()) {
    bump(hdr_->doorbell[rank_]);
    engine_.join();
  }
  if (base_) {
    munmap(base_, total_);
    base_ = nullptr;
    hdr_ = nullptr;
  }
}

void Comm::unlink(const std::string& name) { shm_unlink(name.c_str()); }

// ---------------------------------------------------------------------------------------------
// abort and failures

bool Comm::aborted() const { return hdr_ && hdr_->abort_flag.load(std::memory_order_acquire) != 0; }

std::string Comm::abort_reason() const {
  if (!aborted()) return "";
  // 1 = being written, 2 = complete; the writer needs microseconds, bound the wait anyway.
  for (int i = 0; i < 100000 && hdr_->abort_flag.load(std::memory_order_acquire) != 2; ++i) cpu_relax();
  return std::string(hdr_->abort_msg, strnlen(hdr_->abort_msg, sizeof(hdr_->abort_msg)));
}

void Comm::abort(FailKind kind, const std::string& msg, int peer) {
  if (!hdr_) return;
  uint32_t expected = 0;
  if (hdr_->abort_flag.compare_exchange_strong(expected, 1)) {
    hdr_->abort_rank = rank_;
    hdr_->abort_kind = kind;
    hdr_->abort_peer = peer;
    std::snprintf(hdr_->abort_msg, sizeof(hdr_->abort_msg), "%s", msg.c_str());
    hdr_->abort_flag.store(2, std::memory_order_release);
  }
  // Wake everyone sleeping on any word so they notice the flag now, not at their next slice.
  for (int r = 0; r < world_; ++r) {
    futex_wake_all(&hdr_->phase[r].v);
    hdr_->doorbell[r].v.fetch_add(1);
    futex_wake_all(&hdr_->doorbell[r].v);
  }
  cv_.notify_all();
}

std::string Comm::describe(const Desc& d) const {
  char buf[256];
  if (d.op == kBarrier) {
    std::snprintf(buf, sizeof(buf), "shm barrier (seq %lld, rank %d of %d)", (long long)d.seq, rank_, world_);
  } else if (d.op == kAllReduce || d.op == kReduceScatter) {
    std::snprintf(buf, sizeof(buf), "shm %s (seq %lld, %s, %lld elements, op %s, rank %d of %d)", op_name(d.op),
                  (long long)d.seq, dtype_name(d.dtype), (long long)d.count, redop_name(d.redop), rank_, world_);
  } else if (d.op == kBroadcast) {
    std::snprintf(buf, sizeof(buf), "shm broadcast (seq %lld, %s, %lld bytes, root %d, rank %d of %d)",
                  (long long)d.seq, dtype_name(d.dtype), (long long)d.count, d.root, rank_, world_);
  } else {
    std::snprintf(buf, sizeof(buf), "shm %s (seq %lld, %s, %lld bytes, rank %d of %d)", op_name(d.op),
                  (long long)d.seq, dtype_name(d.dtype), (long long)d.count, rank_, world_);
  }
  return buf;
}

void Comm::fail(FailKind kind, const std::string& msg, int peer, const Desc* d) {
  const std::string full = (d ? describe(*d) + ": " : std::string()) + msg;
  abort(kind, "rank " + std::to_string(rank_) + ": " + full, peer);
  throw ShmFailure(kind, full, rank_, d ? op_name(d->op) : "", d ? d->seq : -1, peer);
}

void Comm::throw_aborted(const Desc* d) const {
  const std::string reason = abort_reason();  // waits until the aborting rank wrote every field
  const int by = hdr_->abort_peer >= 0 ? hdr_->abort_peer : hdr_->abort_rank;
  std::string msg = (d ? describe(*d) + ": " : std::string()) + "the group was aborted (" + reason + ")";
  FailKind kind = kAborted;
  // Same root cause as the rank that aborted, when it was a dead peer: raise the same type.
  if (hdr_->abort_kind == kPeerDied) kind = kPeerDied;
  throw ShmFailure(kind, msg, rank_, d ? op_name(d->op) : "", d ? d->seq : -1, by);
}

void Comm::check_open(const Desc& d) const {
  if (!hdr_) throw ShmFailure(kAborted, describe(d) + ": the group is closed", rank_, op_name(d.op), d.seq);
  if (aborted()) throw_aborted(&d);
}

// ---------------------------------------------------------------------------------------------
// phases

void Comm::post_desc(int parity, int32_t op, int32_t dtype, int32_t redop, int32_t root, int64_t count,
                     int64_t seq) {
  cur_ = Desc{seq, op, dtype, redop, root, count};
  check_open(cur_);
  hdr_->desc[parity][rank_] = cur_;
}

void Comm::wait_word(Word& w, uint32_t target, int peer, const Desc& d) {
  auto reached = [target](uint32_t v) { return int32_t(v - target) >= 0; };
  if (reached(w.v.load(std::memory_order_acquire))) return;
  const uint64_t t0 = now_ns();
  // Bounded spin: a peer on another core usually arrives within microseconds; after that, sleep.
  if (cfg_.spin_ns > 0) {
    uint64_t spun = 0;
    do {
      for (int i = 0; i < 32; ++i) {
        cpu_relax();
        if (reached(w.v.load(std::memory_order_acquire))) return;
      }
      spun = now_ns() - t0;
      // Past the first couple of microseconds the peer is probably not running: if it waits for
      // this core, let it have it (a no-op when nothing else is runnable here).
      if (spun > 2000) sched_yield();
    } while (spun < uint64_t(cfg_.spin_ns));
  }
  const uint64_t timeout_ns = uint64_t(cfg_.timeout_ms) * 1000000ULL;
  const uint64_t deadline = t0 + timeout_ns;
  const int64_t slice = 50000000;  // 50 ms between liveness checks
  for (;;) {
    if (hdr_->abort_flag.load(std::memory_order_acquire)) throw_aborted(&d);
    const uint64_t now = now_ns();
    if (now >= deadline) {
      char msg[200];
      std::snprintf(msg, sizeof(msg), "rank %d did not arrive within %.1f s (it may be stuck, or calling a different collective)",
                    peer, double(cfg_.timeout_ms) / 1000.0);
      fail(kTimeout, msg, peer, &d);
    }
    w.waiters.fetch_add(1, std::memory_order_seq_cst);
    const uint32_t v = w.v.load(std::memory_order_seq_cst);
    if (!reached(v)) futex_wait(&w.v, v, std::min<int64_t>(slice, int64_t(deadline - now)));
    w.waiters.fetch_sub(1, std::memory_order_seq_cst);
    if (reached(w.v.load(std::memory_order_acquire))) return;
    const RankInfo& ri = hdr_->ranks[peer];
    if (!process_alive(ri.pid, ri.starttime)) {
      fail(kPeerDied, "rank " + std::to_string(peer) + " (pid " + std::to_string(ri.pid) + ") died", peer, &d);
    }
  }
}

void Comm::arrive_and_wait(const Desc& d) {
  const uint32_t target = phase_ + 1;
  publish(hdr_->phase[rank_], target);
  for (int k = 1; k < world_; ++k) {
    const int p = (rank_ + k) % world_;
    wait_word(hdr_->phase[p], target, p, d);
  }
  phase_ = target;
}

void Comm::check_descs(int parity) {
  const Desc& me = hdr_->desc[parity][rank_];
  for (int p = 0; p < world_; ++p) {
    if (p == rank_) continue;
    const Desc& o = hdr_->desc[parity][p];
    const bool same = o.seq == me.seq && o.op == me.op && o.dtype == me.dtype && o.redop == me.redop &&
                      o.root == me.root && o.count == me.count;
    if (!same) {
      char msg[400];
      std::snprintf(msg, sizeof(msg),
                    "ranks called different collectives: rank %d has %s seq %lld (%s, count %lld, op %s, root %d), "
                    "rank %d has %s seq %lld (%s, count %lld, op %s, root %d)",
                    rank_, op_name(me.op), (long long)me.seq, dtype_name(me.dtype), (long long)me.count,
                    redop_name(me.redop), me.root, p, op_name(o.op), (long long)o.seq, dtype_name(o.dtype),
                    (long long)o.count, redop_name(o.redop), o.root);
      Desc d = me;
      fail(kMismatch, msg, p, &d);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// collectives

void Comm::barrier(int64_t seq) {
  std::lock_guard<std::mutex> serial(coll_mu_);
  const int par = next_parity();
  post_desc(par, kBarrier, kBytes, kNoOp, -1, 0, seq);
  arrive_and_wait(cur_);
  check_descs(par);
}

void Comm::allreduce(uintptr_t ptr, size_t count, int32_t dtype, int32_t redop, int64_t seq) {
  std::lock_guard<std::mutex> serial(coll_mu_);
  const size_t es = dtype_size(dtype);
  char* data = reinterpret_cast<char*>(ptr);
  const int n = world_;
  if (!reduce_supported(dtype, redop)) {
    throw ShmFailure(kUnsupported, std::string("shm all_reduce: op ") + redop_name(redop) +
                                       " is not supported for dtype " + dtype_name(dtype), rank_, "all_reduce", seq);
  }
  std::vector<const void*> srcs(n);
  const size_t bytes = count * es;
  if (bytes <= cfg_.small_bytes && bytes <= cfg_.slot_bytes) {
    // One phase: everyone publishes its whole input, everyone reduces everything (tiny sizes:
    // a second synchronization would cost more than the duplicated arithmetic).
    const int par = next_parity();
    post_desc(par, kAllReduce, dtype, redop, -1, int64_t(count), seq);
    std::memcpy(buf(par, rank_), data, bytes);
    arrive_and_wait(cur_);
    check_descs(par);
    for (int r = 0; r < n; ++r) srcs[r] = buf(par, r);
    reduce_n(data, nullptr, srcs.data(), n, count, dtype, redop);
    return;
  }
  // Per chunk, two phases: (A) publish the parts of my chunk that other ranks reduce; reduce my
  // share (rank order, my own part read from my tensor) into my slot of the other buffer and my
  // tensor; (B) copy every other rank's reduced share out of its slot.
  const size_t chunk = cfg_.slot_bytes / es;
  const size_t align = std::max<size_t>(1, 64 / es);
  bool first = true;
  for (size_t off = 0; off < count; off += chunk) {
    const size_t c = std::min(chunk, count - off);
    const size_t per = round_up((c + n - 1) / n, align);
    auto lo = [&](int j) { return std::min(c, size_t(j) * per); };
    const int par_a = next_parity();
    if (first) post_desc(par_a, kAllReduce, dtype, redop, -1, int64_t(count), seq);
    char* mine = buf(par_a, rank_);
    for (int j = 0; j < n; ++j) {
      if (j == rank_) continue;
      std::memcpy(mine + lo(j) * es, data + (off + lo(j)) * es, (lo(j + 1) - lo(j)) * es);
    }
    arrive_and_wait(cur_);
    if (first) check_descs(par_a);
    first = false;
    const int par_b = par_a ^ 1;
    const size_t a = lo(rank_), b = lo(rank_ + 1);
    if (b > a) {
      for (int r = 0; r < n; ++r) srcs[r] = r == rank_ ? data + (off + a) * es : buf(par_a, r) + a * es;
      reduce_n(buf(par_b, rank_) + a * es, data + (off + a) * es, srcs.data(), n, b - a, dtype, redop);
    }
    arrive_and_wait(cur_);
    for (int r = 0; r < n; ++r) {
      if (r == rank_) continue;
      std::memcpy(data + (off + lo(r)) * es, buf(par_b, r) + lo(r) * es, (lo(r + 1) - lo(r)) * es);
    }
  }
}

void Comm::broadcast(uintptr_t ptr, size_t nbytes, int root, int32_t dtype, int64_t seq) {
  std::lock_guard<std::mutex> serial(coll_mu_);
  if (root < 0 || root >= world_)
    throw ShmFailure(kMismatch, "shm broadcast: root " + std::to_string(root) + " is outside 0.." +
                                    std::to_string(world_ - 1), rank_, "broadcast", seq);
  char* data = reinterpret_cast<char*>(ptr);
  // The root may use the whole buffer (all ranks' slots of one parity are contiguous).
  const size_t chunk = size_t(world_) * cfg_.slot_bytes;
  size_t off = 0;
  bool first = true;
  do {
    const size_t c = std::min(chunk, nbytes - off);
    const int par = next_parity();
    if (first) post_desc(par, kBroadcast, dtype, kNoOp, root, int64_t(nbytes), seq);
    if (rank_ == root && c) std::memcpy(buf(par, 0), data + off, c);
    arrive_and_wait(cur_);
    if (first) check_descs(par);
    first = false;
    if (rank_ != root && c) std::memcpy(data + off, buf(par, 0), c);
    off += c;
  } while (off < nbytes);
}

void Comm::allgather(const std::vector<uintptr_t>& outs, uintptr_t in, size_t nbytes, int32_t dtype, int64_t seq) {
  std::lock_guard<std::mutex> serial(coll_mu_);
  if (int(outs.size()) != world_)
    throw ShmFailure(kMismatch, "shm all_gather: " + std::to_string(outs.size()) + " outputs for " +
                                    std::to_string(world_) + " ranks", rank_, "all_gather", seq);
  const char* src = reinterpret_cast<const char*>(in);
  const size_t chunk = cfg_.slot_bytes;
  size_t off = 0;
  bool first = true;
  do {
    const size_t c = std::min(chunk, nbytes - off);
    const int par = next_parity();
    if (first) post_desc(par, kAllGather, dtype, kNoOp, -1, int64_t(nbytes), seq);
    if (c) std::memcpy(buf(par, rank_), src + off, c);
    arrive_and_wait(cur_);
    if (first) check_descs(par);
    first = false;
    for (int r = 0; r < world_; ++r) {
      char* dst = reinterpret_cast<char*>(outs[r]) + off;
      if (!c) continue;
      if (r == rank_) {
        if (dst != src + off) std::memmove(dst, src + off, c);
      } else {
        std::memcpy(dst, buf(par, r), c);
      }
    }
    off += c;
  } while (off < nbytes);
}

void Comm::reduce_scatter(uintptr_t out, const std::vector<uintptr_t>& ins, size_t count, int32_t dtype,
                          int32_t redop, int64_t seq) {
  std::lock_guard<std::mutex> serial(coll_mu_);
  const int n = world_;
  if (int(ins.size()) != n)
    throw ShmFailure(kMismatch, "shm reduce_scatter: " + std::to_string(ins.size()) + " inputs for " +
                                    std::to_string(n) + " ranks", rank_, "reduce_scatter", seq);
  if (!reduce_supported(dtype, redop)) {
    throw ShmFailure(kUnsupported, std::string("shm reduce_scatter: op ") + redop_name(redop) +
                                       " is not supported for dtype " + dtype_name(dtype), rank_, "reduce_scatter", seq);
  }
  const size_t es = dtype_size(dtype);
  // My slot holds one sub-slot per destination rank.
  const size_t sub = cfg_.slot_bytes / size_t(n) / 64 * 64;
  const size_t chunk = sub / es;
  char* dst = reinterpret_cast<char*>(out);
  std::vector<const void*> srcs(n);
  size_t off = 0;
  bool first = true;
  do {
    const size_t c = std::min(chunk, count - off);
    const int par = next_parity();
    if (first) post_desc(par, kReduceScatter, dtype, redop, -1, int64_t(count), seq);
    char* mine = buf(par, rank_);
    for (int j = 0; j < n; ++j) {
      if (j != rank_ && c) std::memcpy(mine + j * sub, reinterpret_cast<const char*>(ins[j]) + off * es, c * es);
    }
    arrive_and_wait(cur_);
    if (first) check_descs(par);
    first = false;
    if (c) {
      for (int r = 0; r < n; ++r)
        srcs[r] = r == rank_ ? reinterpret_cast<const char*>(ins[rank_]) + off * es : buf(par, r) + rank_ * sub;
      reduce_n(dst + off * es, nullptr, srcs.data(), n, c, dtype, redop);
    }
    off += c;
  } while (off < count);
}

void Comm::alltoall(const std::vector<uintptr_t>& outs, const std::vector<int64_t>& out_bytes,
                    const std::vector<uintptr_t>& ins, const std::vector<int64_t>& in_bytes, int32_t dtype,
                    int64_t seq) {
  std::lock_guard<std::mutex> serial(coll_mu_);
  const int n = world_;
  if (int(outs.size()) != n || int(ins.size()) != n || int(out_bytes.size()) != n || int(in_bytes.size()) != n)
    throw ShmFailure(kMismatch, "shm all_to_all: expected " + std::to_string(n) + " inputs and outputs", rank_,
                     "all_to_all", seq);
  const size_t sub = cfg_.slot_bytes / size_t(n) / 64 * 64;
  const int par0 = next_parity();
  post_desc(par0, kAllToAll, dtype, kNoOp, -1, -1, seq);
  // Publish what I send to and expect from everyone, so every rank can check the whole matrix.
  for (int j = 0; j < n; ++j) {
    hdr_->a2a_bytes[par0][rank_][j] = in_bytes[j];
  }
  char* mine = buf(par0, rank_);
  for (int j = 0; j < n; ++j) {
    if (j == rank_) continue;
    const size_t c = std::min<size_t>(sub, size_t(std::max<int64_t>(0, in_bytes[j])));
    if (c) std::memcpy(mine + j * sub, reinterpret_cast<const char*>(ins[j]), c);
  }
  arrive_and_wait(cur_);
  check_descs(par0);
  // Each rank checks that what every peer sends it matches what it expects; a mismatch anywhere
  // aborts the group, so ranks that saw no mismatch raise on their next wait.
  for (int q = 0; q < n; ++q) {
    const int64_t sent = hdr_->a2a_bytes[par0][q][rank_];
    if (sent != out_bytes[q]) {
      char msg[200];
      std::snprintf(msg, sizeof(msg), "rank %d sends %lld bytes to rank %d, which expects %lld (split sizes disagree)",
                    q, (long long)sent, rank_, (long long)out_bytes[q]);
      fail(kMismatch, msg, q, &cur_);
    }
  }
  int64_t most = 0;
  for (int q = 0; q < n; ++q)
    for (int r = 0; r < n; ++r)
      if (q != r) most = std::max(most, hdr_->a2a_bytes[par0][q][r]);
  const size_t rounds = std::max<size_t>(1, (size_t(most) + sub - 1) / sub);
  auto read_round = [&](int par, size_t k) {
    for (int q = 0; q < n; ++q) {
      if (q == rank_) continue;
      const size_t o = k * sub;
      if (o < size_t(out_bytes[q]))
        std::memcpy(reinterpret_cast<char*>(outs[q]) + o, buf(par, q) + rank_ * sub,
                    std::min(sub, size_t(out_bytes[q]) - o));
    }
  };
  read_round(par0, 0);
  if (in_bytes[rank_] != out_bytes[rank_]) {
    fail(kMismatch, "rank " + std::to_string(rank_) + " sends itself " + std::to_string(in_bytes[rank_]) +
                        " bytes but expects " + std::to_string(out_bytes[rank_]), rank_, &cur_);
  }
  if (in_bytes[rank_] > 0 && outs[rank_] != ins[rank_])
    std::memmove(reinterpret_cast<char*>(outs[rank_]), reinterpret_cast<const char*>(ins[rank_]), size_t(in_bytes[rank_]));
  for (size_t k = 1; k < rounds; ++k) {
    const int par = next_parity();
    char* m = buf(par, rank_);
    for (int j = 0; j < n; ++j) {
      if (j == rank_) continue;
      const size_t o = k * sub;
      if (o < size_t(in_bytes[j]))
        std::memcpy(m + j * sub, reinterpret_cast<const char*>(ins[j]) + o, std::min(sub, size_t(in_bytes[j]) - o));
    }
    arrive_and_wait(cur_);
    read_round(par, k);
  }
}

}  // namespace halshm
