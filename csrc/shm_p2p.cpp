// Point-to-point send/recv. Each ordered pair (src -> dst) owns a channel: a ring of slots in the
// segment, a head the sender advances and a tail the receiver advances. One engine thread per
// communicator moves every pending send and recv a slot at a time, so an isend/irecv pair in both
// directions cannot deadlock on a full ring. When nothing can move it sleeps on its rank's doorbell
// futex; a peer rings it after publishing or consuming a slot. Messages from one source are taken
// in order: a recv matches the head message whose tag equals its own, in the order recvs were posted.
#include <algorithm>
#include <cstdio>
#include <cstring>

#include "shm_comm.h"
#include "shm_sync.h"

namespace halshm {

ChanCtl* Comm::chan(int src, int dst) const {
  return reinterpret_cast<ChanCtl*>(base_ + p2p_off_ + (size_t(src) * world_ + dst) * chan_bytes_);
}

SlotHdr* Comm::chan_slot(int src, int dst, uint32_t i) const {
  char* c = reinterpret_cast<char*>(chan(src, dst)) + sizeof(ChanCtl);
  return reinterpret_cast<SlotHdr*>(c + size_t(i % uint32_t(cfg_.p2p_slots)) * slot_stride_);
}

uint64_t Comm::post(bool send, uintptr_t ptr, size_t nbytes, int peer, int tag) {
  const char* what = send ? "send" : "recv";
  if (peer < 0 || peer >= world_ || peer == rank_) {
    throw ShmFailure(kMismatch, std::string("shm ") + what + ": peer rank " + std::to_string(peer) +
                                    " is not another rank of this group (0.." + std::to_string(world_ - 1) +
                                    ", this is rank " + std::to_string(rank_) + ")", rank_, what, -1, peer);
  }
  std::unique_lock<std::mutex> lk(mu_);
  if (closed_ || !hdr_) throw ShmFailure(kAborted, std::string("shm ") + what + ": the group is closed", rank_, what);
  if (aborted()) {
    const std::string reason = abort_reason();
    throw ShmFailure(kAborted, std::string("shm ") + what + " to/from rank " + std::to_string(peer) +
                                   ": the group was aborted (" + reason + ")", rank_, what, -1,
                     hdr_->abort_peer >= 0 ? hdr_->abort_peer : hdr_->abort_rank);
  }
  auto op = std::make_shared<P2POp>();
  op->id = next_id_++;
  op->send = send;
  op->peer = peer;
  op->tag = tag;
  op->ptr = reinterpret_cast<char*>(ptr);
  op->bytes = nbytes;
  op->last_progress_ns = now_ns();
  ops_[op->id] = op;
  if (send) {
    op->seq = send_seq_[peer]++;
    sendq_[peer].push_back(op);
  } else {
    op->seq = recv_seq_[peer]++;
    recvq_[peer].push_back(op);
  }
  ++pending_;
  start_engine_locked();
  lk.unlock();
  bump(hdr_->doorbell[rank_]);
  return op->id;
}

uint64_t Comm::post_send(uintptr_t ptr, size_t nbytes, int dst, int tag) { return post(true, ptr, nbytes, dst, tag); }
uint64_t Comm::post_recv(uintptr_t ptr, size_t nbytes, int src, int tag) { return post(false, ptr, nbytes, src, tag); }

void Comm::start_engine_locked() {
  if (!engine_.joinable()) engine_ = std::thread([this] { engine_loop(); });
}

void Comm::finish_locked(const std::shared_ptr<P2POp>& op, int state, FailKind kind, const std::string& msg) {
  if (op->state != 0) return;
  op->state = state;
  op->fail_kind = kind;
  op->fail_msg = msg;
  --pending_;
}

bool Comm::progress_locked() {
  bool progressed = false;
  const uint32_t k = uint32_t(cfg_.p2p_slots);
  for (int dst = 0; dst < world_; ++dst) {
    auto& q = sendq_[dst];
    ChanCtl* ch = q.empty() ? nullptr : chan(rank_, dst);
    while (!q.empty()) {
      auto op = q.front();
      if (op->state != 0) { q.pop_front(); continue; }
      const uint32_t tail = ch->tail.load(std::memory_order_acquire);
      if (send_head_[dst] - tail >= k) break;  // ring full: the receiver has not drained yet
      SlotHdr* h = chan_slot(rank_, dst, send_head_[dst]);
      const size_t c = std::min(cfg_.p2p_slot_bytes, op->bytes - op->done);
      h->tag = op->tag;
      h->seq = op->seq;
      h->msg_bytes = op->bytes;
      h->offset = op->done;
      h->chunk = c;
      if (c) std::memcpy(reinterpret_cast<char*>(h) + sizeof(SlotHdr), op->ptr + op->done, c);
      ch->head.store(++send_head_[dst], std::memory_order_release);
      bump(hdr_->doorbell[dst]);
      op->done += c;
      op->started = true;
      op->last_progress_ns = now_ns();
      progressed = true;
      if (op->done == op->bytes) {
        finish_locked(op, 1, kTimeout, "");
        q.pop_front();
      }
    }
  }
  for (int src = 0; src < world_; ++src) {
    if (src == rank_) continue;
    ChanCtl* ch = chan(src, rank_);
    for (;;) {
      const uint32_t head = ch->head.load(std::memory_order_acquire);
      if (head == recv_tail_[src]) break;
      SlotHdr* h = chan_slot(src, rank_, recv_tail_[src]);
      auto& op = active_recv_[src];
      if (!op) {
        auto& rq = recvq_[src];
        auto it = std::find_if(rq.begin(), rq.end(), [&](const std::shared_ptr<P2POp>& o) {
          return o->state == 0 && o->tag == h->tag;
        });
        if (it == rq.end()) break;  // no recv posted for this message yet
        auto cand = *it;
        if (h->offset != 0 || cand->bytes != h->msg_bytes) {
          char msg[240];
          std::snprintf(msg, sizeof(msg),
                        "shm recv from rank %d (tag %d, recv #%lld): the message is %llu bytes but the recv "
                        "buffer holds %zu", src, cand->tag, (long long)cand->seq,
                        (unsigned long long)h->msg_bytes, cand->bytes);
          rq.erase(it);
          finish_locked(cand, 2, kMismatch, msg);
          abort(kMismatch, std::string("rank ") + std::to_string(rank_) + ": " + msg, src);
          return true;
        }
        rq.erase(it);
        op = cand;
      }
      if (h->chunk) std::memcpy(op->ptr + h->offset, reinterpret_cast<char*>(h) + sizeof(SlotHdr), h->chunk);
      op->done += h->chunk;
      op->started = true;
      op->last_progress_ns = now_ns();
      ch->tail.store(++recv_tail_[src], std::memory_order_release);
      bump(hdr_->doorbell[src]);
      progressed = true;
      if (op->done >= op->bytes) {
        finish_locked(op, 1, kTimeout, "");
        op.reset();
      }
    }
  }
  return progressed;
}

void Comm::check_p2p_failures_locked(uint64_t now) {
  if (pending_ == 0) return;
  const bool is_aborted = aborted();
  const std::string reason = is_aborted ? abort_reason() : "";
  const uint64_t timeout_ns = uint64_t(cfg_.timeout_ms) * 1000000ULL;
  const bool check_alive = now - last_liveness_ns_ > 50000000ULL;
  if (check_alive) last_liveness_ns_ = now;
  bool dead[kMaxRanks] = {};
  if (check_alive) {
    for (int r = 0; r < world_; ++r) {
      if (r != rank_) dead[r] = !process_alive(hdr_->ranks[r].pid, hdr_->ranks[r].starttime);
    }
  }
  for (auto& kv : ops_) {
    auto& op = kv.second;
    if (op->state != 0) continue;
    char what[160];
    std::snprintf(what, sizeof(what), "shm %s %s rank %d (tag %d, message #%lld, %zu of %zu bytes moved)",
                  op->send ? "send" : "recv", op->send ? "to" : "from", op->peer, op->tag, (long long)op->seq,
                  op->done, op->bytes);
    if (is_aborted) {
      finish_locked(op, 2, hdr_->abort_kind == kPeerDied ? kPeerDied : kAborted,
                    std::string(what) + ": the group was aborted (" + reason + ")");
    } else if (dead[op->peer]) {
      const std::string msg = std::string(what) + ": rank " + std::to_string(op->peer) + " (pid " +
                              std::to_string(hdr_->ranks[op->peer].pid) + ") died";
      finish_locked(op, 2, kPeerDied, msg);
      abort(kPeerDied, "rank " + std::to_string(rank_) + ": " + msg, op->peer);
    } else if (now - op->last_progress_ns > timeout_ns) {
      char msg[360];
      std::snprintf(msg, sizeof(msg), "%s: no progress within %.1f s (rank %d posted no matching %s)", what,
                    double(cfg_.timeout_ms) / 1000.0, op->peer, op->send ? "recv" : "send");
      finish_locked(op, 2, kTimeout, msg);
      abort(kTimeout, std::string("rank ") + std::to_string(rank_) + ": " + msg, op->peer);
    }
  }
}

void Comm::engine_loop() {
  Word& db = hdr_->doorbell[rank_];
  while (!stop_.load()) {
    const uint32_t seen = db.v.load(std::memory_order_acquire);
    bool progressed;
    {
      std::lock_guard<std::mutex> lk(mu_);
      progressed = progress_locked();
      check_p2p_failures_locked(now_ns());
    }
    cv_.notify_all();
    if (progressed) continue;
    // Nothing could move: sleep until a peer (or a post) rings, or the next liveness/deadline check.
    db.waiters.fetch_add(1, std::memory_order_seq_cst);
    if (db.v.load(std::memory_order_seq_cst) == seen && !stop_.load()) futex_wait(&db.v, seen, 50000000);
    db.waiters.fetch_sub(1, std::memory_order_seq_cst);
  }
}

void Comm::wait(uint64_t id) {
  std::unique_lock<std::mutex> lk(mu_);
  auto it = ops_.find(id);
  if (it == ops_.end()) return;  // already waited
  auto op = it->second;
  // The engine enforces the timeout; the margin here only guards against an engine that stopped.
  const auto limit = std::chrono::milliseconds(cfg_.timeout_ms + 10000);
  const auto give_up = std::chrono::steady_clock::now() + limit;
  while (op->state == 0) {
    if (closed_) {
      finish_locked(op, 2, kAborted, "shm p2p: the group was closed while the op was pending");
      break;
    }
    if (cv_.wait_until(lk, give_up) == std::cv_status::timeout && op->state == 0) {
      finish_locked(op, 2, kTimeout, "shm p2p: the engine made no progress and reported nothing");
    }
  }
  ops_.erase(id);
  if (op->state == 2) {
    throw ShmFailure(op->fail_kind, op->fail_msg, rank_, op->send ? "send" : "recv", op->seq, op->peer);
  }
}

bool Comm::test(uint64_t id) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = ops_.find(id);
  return it == ops_.end() || it->second->state != 0;
}

}  // namespace halshm
