// The communicator: one shared segment per process group, collectives over it, and the
// point-to-point engine (a background thread that moves send/recv data through per-pair channels).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "shm_common.h"

namespace halshm {

struct Config {
  size_t slot_bytes = 1 << 20;        // per rank per buffer of the collective area
  size_t p2p_slot_bytes = 256 << 10;  // payload of one channel slot
  int p2p_slots = 2;                  // slots per channel
  int64_t timeout_ms = 1800000;       // longest any single wait may last
  int64_t spin_ns = 20000;            // bounded spin before sleeping on the futex
  size_t small_bytes = 32 << 10;      // all_reduce up to this size: one phase, every rank reduces all
};

struct P2POp {
  uint64_t id = 0;
  bool send = false;
  int peer = -1;
  int tag = 0;
  char* ptr = nullptr;
  size_t bytes = 0;
  size_t done = 0;
  bool started = false;
  int state = 0;  // 0 pending, 1 done, 2 failed
  int64_t seq = -1;
  uint64_t last_progress_ns = 0;
  FailKind fail_kind = kTimeout;
  std::string fail_msg;
};

class Comm {
 public:
  Comm(const std::string& name, bool create, int rank, int world, const Config& cfg);
  ~Comm();
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  static size_t segment_size(int world, const Config& cfg);
  static void unlink(const std::string& name);

  int rank() const { return rank_; }
  int world() const { return world_; }
  size_t segment_bytes() const { return total_; }
  const Config& config() const { return cfg_; }
  void set_timeout_ms(int64_t ms) { cfg_.timeout_ms = ms; }

  void allreduce(uintptr_t ptr, size_t count, int32_t dtype, int32_t redop, int64_t seq);
  void broadcast(uintptr_t ptr, size_t nbytes, int root, int32_t dtype, int64_t seq);
  void allgather(const std::vector<uintptr_t>& outs, uintptr_t in, size_t nbytes, int32_t dtype, int64_t seq);
  void reduce_scatter(uintptr_t out, const std::vector<uintptr_t>& ins, size_t count, int32_t dtype,
                      int32_t redop, int64_t seq);
  void alltoall(const std::vector<uintptr_t>& outs, const std::vector<int64_t>& out_bytes,
                const std::vector<uintptr_t>& ins, const std::vector<int64_t>& in_bytes, int32_t dtype,
                int64_t seq);
  void barrier(int64_t seq);

  uint64_t post_send(uintptr_t ptr, size_t nbytes, int dst, int tag);
  uint64_t post_recv(uintptr_t ptr, size_t nbytes, int src, int tag);
  void wait(uint64_t id);   // blocks until the op finished; throws its failure
  bool test(uint64_t id);   // finished (either way)?

  // Mark the group broken for every rank (first reason wins) and wake every sleeper.
  void abort(FailKind kind, const std::string& msg, int peer = -1);
  bool aborted() const;
  std::string abort_reason() const;
  void close();

 private:
  // ---- segment layout ----
  char* buf(int parity, int r) const { return coll_ + (size_t(parity) * world_ + r) * cfg_.slot_bytes; }
  ChanCtl* chan(int src, int dst) const;
  SlotHdr* chan_slot(int src, int dst, uint32_t i) const;

  // ---- phases: every data step is a phase; buffers alternate by phase parity ----
  int next_parity() const { return int((phase_ + 1) & 1u); }
  void post_desc(int parity, int32_t op, int32_t dtype, int32_t redop, int32_t root, int64_t count, int64_t seq);
  void arrive_and_wait(const Desc& d);
  void check_descs(int parity);
  void wait_word(Word& w, uint32_t target, int peer, const Desc& d);
  [[noreturn]] void fail(FailKind kind, const std::string& msg, int peer, const Desc* d);
  [[noreturn]] void throw_aborted(const Desc* d) const;
  void check_open(const Desc& d) const;
  std::string describe(const Desc& d) const;

  // ---- point-to-point engine ----
  void start_engine_locked();
  void engine_loop();
  bool progress_locked();
  void check_p2p_failures_locked(uint64_t now);
  void finish_locked(const std::shared_ptr<P2POp>& op, int state, FailKind kind, const std::string& msg);
  uint64_t post(bool send, uintptr_t ptr, size_t nbytes, int peer, int tag);

  std::string name_;
  int rank_, world_;
  Config cfg_;
  size_t total_ = 0, coll_off_ = 0, p2p_off_ = 0, chan_bytes_ = 0, slot_stride_ = 0;
  char* base_ = nullptr;
  Header* hdr_ = nullptr;
  char* coll_ = nullptr;
  uint32_t phase_ = 0;
  Desc cur_{};
  bool closed_ = false;
  // Serializes collectives issued from several threads of one process (e.g. DDP's autograd thread
  // and the main thread): phases must not interleave. p2p has its own lock (mu_).
  std::mutex coll_mu_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, std::shared_ptr<P2POp>> ops_;
  std::deque<std::shared_ptr<P2POp>> sendq_[kMaxRanks];
  std::vector<std::shared_ptr<P2POp>> recvq_[kMaxRanks];
  std::shared_ptr<P2POp> active_recv_[kMaxRanks];
  uint32_t send_head_[kMaxRanks] = {};
  uint32_t recv_tail_[kMaxRanks] = {};
  int64_t send_seq_[kMaxRanks] = {};
  int64_t recv_seq_[kMaxRanks] = {};
  uint64_t next_id_ = 1;
  size_t pending_ = 0;
  std::thread engine_;
  std::atomic<bool> stop_{false};
  uint64_t last_liveness_ns_ = 0;
};

}  // namespace halshm
