// Shared definitions of the shared-memory fabric: dtype/op codes, the typed failure that Python turns
// into hal.emulation.shm errors, and the layout of the segment every rank maps.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace halshm {

constexpr int kMaxRanks = 64;            // header arrays are sized for this many ranks
constexpr uint64_t kMagic = 0x68616c73686d3031ULL;  // "halshm01"
constexpr uint32_t kVersion = 1;

// Element types the reduce kernels know. kBytes: any other dtype, movable but not reducible.
enum DType : int32_t { kF32 = 0, kF16, kBF16, kF64, kI8, kU8, kI16, kI32, kI64, kBool, kBytes };
enum RedOp : int32_t { kSum = 0, kAvg, kMax, kMin, kProd, kBand, kBor, kBxor, kNoOp = -1 };
enum OpCode : int32_t { kAllReduce = 1, kBroadcast, kAllGather, kReduceScatter, kAllToAll, kBarrier,
                        kSend, kRecv };

// What went wrong; each kind maps to one Python class in hal/emulation/shm/errors.py.
enum FailKind : int32_t { kTimeout = 1, kPeerDied, kMismatch, kAborted, kSetup, kUnsupported };

const char* op_name(int32_t op);
const char* dtype_name(int32_t dt);
const char* redop_name(int32_t op);
size_t dtype_size(int32_t dt);

// Thrown by the C++ side; the pybind11 translator builds the matching hal.emulation.shm error with these fields.
struct ShmFailure : public std::runtime_error {
  ShmFailure(FailKind kind_, const std::string& msg, int rank_ = -1, const std::string& op_ = "",
             int64_t seq_ = -1, int peer_ = -1)
      : std::runtime_error(msg), kind(kind_), rank(rank_), op(op_), seq(seq_), peer(peer_) {}
  FailKind kind;
  int rank;
  std::string op;
  int64_t seq;
  int peer;
};

// One futex word per cache line, with a count of sleepers so the writer skips the wake syscall
// when nobody sleeps.
struct alignas(64) Word {
  std::atomic<uint32_t> v;
  std::atomic<uint32_t> waiters;
};

struct alignas(64) RankInfo {
  int32_t pid;
  int32_t joined;
  uint64_t starttime;  // /proc/<pid>/stat field 22: tells a live peer from a recycled pid
};

// What a rank is about to do; peers compare these to catch mismatched calls before moving data.
struct alignas(64) Desc {
  int64_t seq;
  int32_t op;
  int32_t dtype;
  int32_t redop;
  int32_t root;
  int64_t count;
};

struct Header {
  uint64_t magic;
  uint32_t version;
  uint32_t world;
  uint64_t slot_bytes;      // per rank per buffer of the collective area
  uint64_t p2p_slot_bytes;  // payload bytes of one slot of a point-to-point channel
  uint64_t p2p_slots;       // slots per channel
  uint64_t total_bytes;
  alignas(64) std::atomic<uint32_t> abort_flag;
  int32_t abort_rank;  // who aborted
  int32_t abort_kind;
  int32_t abort_peer;  // the rank at fault (dead, late, mismatched), -1 if none
  char abort_msg[476];
  RankInfo ranks[kMaxRanks];
  Word phase[kMaxRanks];     // collective arrivals: rank r has finished phase `phase[r]`
  Word doorbell[kMaxRanks];  // point-to-point: "something changed for you"
  Desc desc[2][kMaxRanks];   // indexed by phase parity (see Comm::post_desc)
  int64_t a2a_bytes[2][kMaxRanks][kMaxRanks];  // all_to_all: [parity][sender][receiver] bytes
};

// Control words of a point-to-point channel (src -> dst), each on its own cache line.
struct ChanCtl {
  alignas(64) std::atomic<uint32_t> head;  // slots published by the sender
  alignas(64) std::atomic<uint32_t> tail;  // slots consumed by the receiver
};

struct alignas(64) SlotHdr {
  int32_t tag;
  int32_t pad;
  int64_t seq;        // message number on this channel
  uint64_t msg_bytes; // whole message
  uint64_t offset;    // of this chunk in the message
  uint64_t chunk;     // bytes in this slot
};

inline size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

}  // namespace halshm
