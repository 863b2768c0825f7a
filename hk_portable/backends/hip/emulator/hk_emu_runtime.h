// hk_emu_runtime.h -- the wave64 emulator's runtime. emulator/build.py compiles it once (per
// content hash) into libhk_emu_rt-<hash>.so; kernel modules link against it.
//
// Model: each OS worker thread runs whole workgroups, one at a time, on its own copy of the kernel
// module (so a module's static __shared__ section is that worker's LDS). Inside a workgroup every
// work-item is a fiber with its own stack. The lanes of one wave run one after another until each
// reaches a wave-level operation (cross-lane builtin, MFMA, s_barrier, soft sync point) or ends;
// then the wave's operation is resolved for all lanes at once -- which requires that all live lanes
// stand at the same call site (divergence is an error, never a hang). Waves run one after another
// until each reaches s_barrier or ends; the barrier then releases them all. So waves interleave
// only at barriers, and lanes only at wave-level operations.
//
// Errors (out-of-bounds global or LDS access, LDS races between barriers, divergent wave
// operations, barrier deadlock, traps) abort the launch with a report naming the kernel, block,
// wave, lane and address; the process survives (SIGSEGV & co. are caught and siglongjmp'd out).
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "hk_emu_common.h"

#include <dlfcn.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#define HK_EXPORT extern "C" __attribute__((visibility("default")))

// ---------------------------------------------------------------------------------------------
// Fiber context switch (x86-64 System V): save the callee-saved registers on the current stack, store
// sp, load the other sp, restore, return into the other context. MXCSR and the x87 control word are not
// switched: all fibers of a worker share the thread's floating-point environment, which device code
// cannot change.
// ---------------------------------------------------------------------------------------------
extern "C" void hk_emu_swap(void** save_sp, void* new_sp);
extern "C" void hk_emu_lane_start(void);
extern "C" void hk_emu_lane_main(void);
asm(R"(
  .text
  .globl hk_emu_swap
  .hidden hk_emu_swap
  .type hk_emu_swap,@function
  .p2align 4
hk_emu_swap:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size hk_emu_swap, .-hk_emu_swap

  .globl hk_emu_lane_start
  .hidden hk_emu_lane_start
  .type hk_emu_lane_start,@function
  .p2align 4
hk_emu_lane_start:
  andq $-16, %rsp
  call hk_emu_lane_main
  ud2
  .size hk_emu_lane_start, .-hk_emu_lane_start
)");

namespace {

constexpr int MAX_LANES = 1024;
constexpr int MAX_WAVES = MAX_LANES / 64;
constexpr size_t PAGE = 4096;
constexpr size_t STACK_GUARD = 64 * 1024;  // below each lane stack (modules use -fstack-clash-protection too)
constexpr uint8_t MULTI = 0xff;

enum : uint8_t { L_READY, L_BLOCKED, L_EXITED };
enum : uint8_t { W_RUN, W_BARRIER, W_DONE };

struct Lane {
  void* sp;
  uint8_t state;
  int op;
  uint64_t site;
  const char* file;
  int line;
  int32_t imm[8];
  uint32_t in_bytes, out_bytes;
  alignas(16) unsigned char in[144];   // the largest: a 32x32x64 f8f6f4 MFMA (A, B, C, two scale words)
  alignas(16) unsigned char out[64];
  hk_emu_lane_info info;
  char* stack_lo;
  char* stack_hi;
};

struct Wave {
  int first, n;          // its lanes: [first, first + n) of the block
  uint8_t state;
  uint32_t sync;         // wave-level sync epoch (bumped at every resolved wave operation)
  uint32_t barriers;     // s_barriers passed
  const char* bfile;
  int bline;
  // Direct-to-LDS loads in flight, oldest first (sequence numbers of the worker's dma_seq); they
  // complete in order at an s_waitcnt whose vmcnt leaves fewer outstanding (vmcnt counts up to 63).
  uint32_t dma_q[64];
  uint8_t dma_head, dma_n;
  uint32_t dma_done;     // every load of this wave with a sequence number <= dma_done has landed
};

// Per LDS byte: who last wrote / read it, in which barrier generation and wave sync epoch.
struct Shadow {
  uint32_t w_gen, r_gen, w_sync, r_sync;
  uint8_t w_wave, w_lane, r_wave, r_lane;
  int32_t w_line, r_line;
  const char* w_file;
  const char* r_file;
  uint32_t dma_seq;      // the direct-to-LDS load that last wrote the byte (0: none) and its wave
  uint8_t dma_wave;
};

struct Worker {
  int index = 0;
  void* sched_sp = nullptr;
  Lane* lanes = nullptr;
  char* stack_mem = nullptr;
  size_t stack_size = 0;       // usable bytes per lane stack
  Wave waves[MAX_WAVES];
  int nwaves = 0, nthreads = 0;
  Lane* cur = nullptr;         // lane running, or lane an operation is being applied for
  bool in_lane = false;
  const hk_emu_launch* L = nullptr;
  void (*entry)(void**) = nullptr;
  char* s_lo = nullptr;        // static LDS (the module copy's "hk_lds" section)
  uint32_t s_size = 0;
  char* g_lo = nullptr;        // guard pages around the static LDS
  char* g_hi = nullptr;
  char* d_lo = nullptr;        // dynamic LDS window
  uint32_t d_size = 0;
  uint64_t d_cap = 0;
  Shadow* shadow = nullptr;
  size_t shadow_cap = 0;
  uint32_t gen = 0;            // barrier generation; never reused, so old blocks never match
  uint32_t dma_seq = 0;        // direct-to-LDS loads issued; never reused, so old blocks never match
  uint32_t bid[3] = {0, 0, 0};
  uint64_t deadline_ns = 0;
  uint32_t tick = 0;
  alignas(16) unsigned char dispatch[64];
  alignas(16) unsigned char implicit[256];
  sigjmp_buf jb;
  volatile int in_block = 0;
  bool aborted = false;        // this block was stopped because another block failed
  pthread_t thread;            // the OS thread serving this worker during a launch
  bool alive = false;          // guarded by g_wd_mutex
  char err[8192];
  char* altstack = nullptr;
  uint64_t st_xlane = 0, st_switch = 0, st_lds = 0, st_barrier = 0, st_blocks = 0;
};

thread_local Worker* tl_worker = nullptr;

std::mutex g_launch_mutex;
std::vector<Worker*> g_workers;
std::atomic<uint64_t> g_next_block{0};
std::atomic<bool> g_abort{false};
std::mutex g_err_mutex;
std::atomic<bool> g_timed_out{false};
std::mutex g_wd_mutex;       // the watchdog signals only workers that are alive under this lock
const int WATCHDOG_SIG = SIGXCPU;  // sent to workers that stay in a lane past the deadline
uint64_t g_err_block = ~0ull;
std::vector<char> g_err;
struct sigaction g_old_sa[65];
const int g_sigs[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGXCPU};

size_t lane_stack_bytes() {
  static size_t v = [] {
    const char* e = getenv("HK_EMU_STACK_KB");
    long kb = e ? atol(e) : 256;
    if (kb < 32) kb = 32;
    return (size_t)kb * 1024;
  }();
  return v;
}

uint64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

Worker* make_worker(int index) {
  Worker* w = new Worker();
  w->index = index;
  w->lanes = new Lane[MAX_LANES];
  w->stack_size = lane_stack_bytes();
  size_t per = w->stack_size + STACK_GUARD;
  w->stack_mem = (char*)mmap(nullptr, per * MAX_LANES, PROT_READ | PROT_WRITE,
                             MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (w->stack_mem == MAP_FAILED) { fprintf(stderr, "hk_emu: cannot map lane stacks\n"); abort(); }
  for (int i = 0; i < MAX_LANES; ++i) {
    char* g = w->stack_mem + (size_t)i * per;   // guard pages at the low end of each stack
    mprotect(g, STACK_GUARD, PROT_NONE);
    w->lanes[i].stack_lo = g + STACK_GUARD;
    w->lanes[i].stack_hi = g + per;
  }
  w->shadow_cap = 160 * 1024 + 64;
  w->shadow = (Shadow*)mmap(nullptr, w->shadow_cap * sizeof(Shadow), PROT_READ | PROT_WRITE,
                            MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (w->shadow == MAP_FAILED) { fprintf(stderr, "hk_emu: cannot map LDS shadow\n"); abort(); }
  size_t alt = 256 * 1024;
  w->altstack = (char*)mmap(nullptr, alt, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return w;
}

// ---------------------------------------------------------------------------------------------
// Error reporting
// ---------------------------------------------------------------------------------------------
int describe_lane(const Lane* l, char* buf, size_t n) {
  const hk_emu_lane_info& i = l->info;
  return snprintf(buf, n, "wave %u lane %u (work-item (%u,%u,%u), flat id %u)", i.wave, i.lane, i.tid[0],
                  i.tid[1], i.tid[2], i.flat);
}

int prefix(Worker* w, char* buf, size_t n) {
  return snprintf(buf, n, "kernel '%s' block (%u,%u,%u): ", w->L && w->L->kernel ? w->L->kernel : "?",
                  w->bid[0], w->bid[1], w->bid[2]);
}

__attribute__((noreturn, format(printf, 2, 3))) void failf(Worker* w, const char* fmt, ...) {
  int k = prefix(w, w->err, sizeof w->err);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(w->err + k, sizeof w->err - (size_t)k, fmt, ap);
  va_end(ap);
  siglongjmp(w->jb, 1);
}

const char* op_name(int op) {
  static const char* names[] = {"?", "s_barrier", "s_waitcnt/fence/wave_barrier", "ds_bpermute",
                                "ds_permute", "ds_swizzle", "DPP mov", "readlane", "readfirstlane",
                                "writelane", "ballot", "read_exec", "permlane16_swap", "permlane32_swap",
                                "MFMA", "direct-to-LDS load", "ds_read_tr16_b64", "permlane64"};
  return (op > 0 && op < HK_EMU_OP__COUNT) ? names[op] : "?";
}

// ---------------------------------------------------------------------------------------------
// Fibers
// ---------------------------------------------------------------------------------------------
inline void switch_to(Worker* w, Lane* l) {
  w->cur = l;
  w->in_lane = true;
  ++w->st_switch;
  hk_emu_swap(&w->sched_sp, l->sp);
  w->in_lane = false;
  w->cur = nullptr;
}

inline void yield_lane(Worker* w, Lane* l) { hk_emu_swap(&l->sp, w->sched_sp); }

void init_stack(Lane* l) {
  uint64_t* sp = (uint64_t*)(((uintptr_t)l->stack_hi) & ~(uintptr_t)15);
  *--sp = 0;                                // alignment slot
  *--sp = (uint64_t)&hk_emu_lane_start;     // "return address" of the first swap
  *--sp = 0;                                // rbp = 0 ends frame-pointer walks
  *--sp = 0;                                // rbx
  *--sp = 0;                                // r12
  *--sp = 0;                                // r13
  *--sp = 0;                                // r14
  *--sp = 0;                                // r15
  l->sp = sp;
}

// The call site of a wave-level operation: a hash of the return addresses on the lane's stack
// (frame-pointer chain), so two calls of the same inline helper from different places differ.
uint64_t site_hash(const Lane* l, int op) {
  uint64_t h = 1469598103934665603ull ^ (uint64_t)op;
  void** fp = (void**)__builtin_frame_address(0);
  for (int d = 0; d < 64 && fp; ++d) {
    if ((char*)fp < l->stack_lo || (char*)fp + 16 > l->stack_hi) break;
    h = (h ^ (uint64_t)(uintptr_t)fp[1]) * 1099511628211ull;
    void** next = (void**)fp[0];
    if (next <= fp) break;
    fp = next;
  }
  return h;
}

// ---------------------------------------------------------------------------------------------
// LDS accesses: bounds, alignment and races
// ---------------------------------------------------------------------------------------------
void lds_where(Worker* w, const char* p, char* buf, size_t n) {
  if (p >= w->s_lo && p < w->s_lo + w->s_size)
    snprintf(buf, n, "LDS byte %lu (static __shared__ storage, %u bytes)", (unsigned long)(p - w->s_lo), w->s_size);
  else if (p >= w->d_lo && p < w->d_lo + w->d_size)
    snprintf(buf, n, "LDS byte %lu (dynamic LDS byte %lu of %u)", (unsigned long)(w->s_size + (p - w->d_lo)),
             (unsigned long)(p - w->d_lo), w->d_size);
  else
    snprintf(buf, n, "address %p", (const void*)p);
}

// The shadow index of n LDS bytes at p, or NO_SHADOW when they are not all inside the LDS.
constexpr size_t NO_SHADOW = ~(size_t)0;
size_t lds_index(const Worker* w, const char* p, uint32_t n) {
  if (p >= w->s_lo && p + n <= w->s_lo + w->s_size) return (size_t)(p - w->s_lo);
  if (p >= w->d_lo && p + n <= w->d_lo + w->d_size) return w->s_size + (size_t)(p - w->d_lo);
  return NO_SHADOW;
}

// The LDS byte an inline-asm LDS-DMA's M0 (+ instruction offset) addresses. The device's M0 holds an LDS
// byte address (the 32-bit value of an address_space(3) pointer); in the emulator an LDS pointer is a host
// address and its 32-bit value the low half of it, which names one byte of the workgroup's static or dynamic
// LDS (each spans far less than 4 GiB). A value that names none is an error: the load would write LDS the
// kernel does not own, or M0 was not computed from an LDS pointer.
const char* lds_from_m0(Worker* w, uint32_t m0, int inst_off, const Lane* f) {
  const uint32_t a = m0 + (uint32_t)inst_off;
  const uint32_t ds = a - (uint32_t)(uintptr_t)w->s_lo, dd = a - (uint32_t)(uintptr_t)w->d_lo;
  if (w->s_size && ds < w->s_size) return w->s_lo + ds;
  if (w->d_size && dd < w->d_size) return w->d_lo + dd;
  failf(w, "inline asm LDS-DMA at %s:%d (wave %d): M0 = %#x + offset %d = %#x is not an LDS address of this "
           "workgroup (static LDS: %u bytes at %#x, dynamic LDS: %u bytes at %#x, as 32-bit LDS pointer values)",
        f->file, f->line, (int)f->info.wave, m0, inst_off, a, w->s_size, (uint32_t)(uintptr_t)w->s_lo,
        w->d_size, (uint32_t)(uintptr_t)w->d_lo);
}

// A byte a direct-to-LDS load is still writing (no s_waitcnt covering the load has run in its wave).
__attribute__((noreturn)) void missing_wait(Worker* w, const Lane* l, const char* p, bool wr, const Shadow& sh,
                                            const char* file, int line) {
  char me[160], where[160];
  describe_lane(l, me, sizeof me);
  lds_where(w, p, where, sizeof where);
  failf(w,
        "missing s_waitcnt: %s %s %s at %s:%d, which a direct-to-LDS load of wave %d (at %s:%d) may still be "
        "writing: the load is asynchronous and lands only when wave %d waits for it (s_waitcnt with a "
        "vmcnt that covers it; before an s_barrier when other waves read the data)",
        me, wr ? "writes" : "reads", where, file, line, (int)sh.dma_wave, sh.w_file ? sh.w_file : "?",
        sh.w_file ? sh.w_line : 0, (int)sh.dma_wave);
}

// Direct-to-LDS loads of a wave land in issue order; the s_waitcnt its lanes wait at lets at most
// vmcnt of them stay in flight (the emulator counts only these loads: other vector memory operations
// complete at once, so a wait by count that relies on later loads draining earlier ones is not seen).
void complete_dma(Wave& wv, const Lane* lanes) {
  int vmcnt = 64;
  for (int i = 0; i < wv.n; ++i)
    if (lanes[i].state == L_BLOCKED && lanes[i].op == HK_EMU_OP_SOFT && lanes[i].imm[0] == 1 &&
        lanes[i].imm[1] < vmcnt)
      vmcnt = lanes[i].imm[1];
  while (wv.dma_n > vmcnt) {
    wv.dma_done = wv.dma_q[wv.dma_head];
    wv.dma_head = (uint8_t)((wv.dma_head + 1) % 64);
    --wv.dma_n;
  }
}

uint32_t issue_dma(Worker* w, Wave& wv) {
  if (wv.dma_n == 64) {           // vmcnt saturates: the hardware stalls until the oldest lands
    wv.dma_done = wv.dma_q[wv.dma_head];
    wv.dma_head = (uint8_t)((wv.dma_head + 1) % 64);
    --wv.dma_n;
  }
  const uint32_t seq = ++w->dma_seq;
  wv.dma_q[(wv.dma_head + wv.dma_n) % 64] = seq;
  ++wv.dma_n;
  return seq;
}

__attribute__((noreturn)) void lds_race(Worker* w, const Lane* l, const char* p, bool wr, const char* kind,
                                        int o_wave, int o_lane, const char* o_file, int o_line,
                                        const char* file, int line, bool intra) {
  char me[160], where[160], other[160];
  describe_lane(l, me, sizeof me);
  lds_where(w, p, where, sizeof where);
  if (o_wave == MULTI) snprintf(other, sizeof other, "several waves");
  else if (o_lane == MULTI) snprintf(other, sizeof other, "wave %d (several lanes)", o_wave);
  else snprintf(other, sizeof other, "wave %d lane %d", o_wave, o_lane);
  if (!intra)
    failf(w, "LDS race: %s %s %s at %s:%d, which %s %s at %s:%d with no s_barrier in between (%s)", me,
          wr ? "writes" : "reads", where, file, line, other, kind, o_file ? o_file : "?", o_line,
          wr ? "write after access" : "read after write");
  failf(w,
        "intra-wave LDS exchange without a wave-level sync point: %s %s %s at %s:%d, which %s %s at "
        "%s:%d since the wave's last sync point. Lanes of a wave run one after another between "
        "sync points in the emulator, so the order is undefined here; put __builtin_amdgcn_wave_barrier() "
        "(or s_waitcnt / a fence / s_barrier / any cross-lane builtin) between the write and the read",
        me, wr ? "writes" : "reads", where, file, line, other, kind, o_file ? o_file : "?", o_line);
}

void lds_access(Worker* w, const Lane* l, const char* p, uint32_t n, uint32_t align, bool wr,
                const char* file, int line) {
  ++w->st_lds;
  size_t base;
  if (p >= w->s_lo && p + n <= w->s_lo + w->s_size) {
    base = (size_t)(p - w->s_lo);
  } else if (p >= w->d_lo && p + n <= w->d_lo + w->d_size) {
    base = w->s_size + (size_t)(p - w->d_lo);
  } else {
    char me[160];
    describe_lane(l, me, sizeof me);
    const char* what;
    long off;
    if (w->d_lo && p >= w->d_lo && p < w->d_lo + w->d_cap) {
      what = "dynamic LDS";
      off = (long)(p - w->d_lo);
      failf(w,
            "LDS out of bounds: %s %s %u bytes at dynamic LDS byte %ld at %s:%d; the launch has %u bytes "
            "of dynamic LDS (shared_bytes) and %u bytes of static __shared__ storage",
            me, wr ? "writes" : "reads", n, off, file, line, w->d_size, w->s_size);
    }
    if (w->s_lo && p + n > w->s_lo && p < w->s_lo + w->s_size + 65536) {
      what = "static LDS";
      off = (long)(p - w->s_lo);
      failf(w,
            "LDS out of bounds: %s %s %u bytes at %s byte %ld at %s:%d; the kernel has %u bytes of static "
            "__shared__ storage and %u bytes of dynamic LDS",
            me, wr ? "writes" : "reads", n, what, off, file, line, w->s_size, w->d_size);
    }
    if (w->s_lo && p < w->s_lo && p + 65536 > w->s_lo)
      failf(w, "LDS out of bounds: %s %s %u bytes %ld bytes before the start of static LDS at %s:%d", me,
            wr ? "writes" : "reads", n, (long)(w->s_lo - p), file, line);
    failf(w,
          "LDS access to a non-LDS address: %s %s %u bytes at %p at %s:%d through HK_LDS_* / an LDS "
          "builtin, but the address is in neither the static __shared__ storage (%u bytes) nor the "
          "dynamic LDS (%u bytes)",
          me, wr ? "writes" : "reads", n, (const void*)p, file, line, w->s_size, w->d_size);
  }
  if (align > 1 && ((uintptr_t)p % align) != 0) {
    char me[160], where[160];
    describe_lane(l, me, sizeof me);
    lds_where(w, p, where, sizeof where);
    failf(w, "misaligned LDS access: %s %s %u bytes at %s at %s:%d, which is not %u-byte aligned", me,
          wr ? "writes" : "reads", n, where, file, line, align);
  }
  for (uint32_t i = 0; i < n; ++i) {
    const Shadow& sh = w->shadow[base + i];
    if (sh.dma_seq && sh.dma_seq > w->waves[sh.dma_wave].dma_done) missing_wait(w, l, p + i, wr, sh, file, line);
  }
  if (w->L->flags & HK_EMU_F_NO_RACE_CHECK) return;
  const uint32_t g = w->gen;
  const uint8_t mw = (uint8_t)l->info.wave, ml = (uint8_t)l->info.lane;
  const uint32_t s = w->waves[mw].sync;
  for (uint32_t i = 0; i < n; ++i) {
    Shadow& sh = w->shadow[base + i];
    if (wr) {
      if (sh.w_gen == g && sh.w_wave != mw)
        lds_race(w, l, p + i, true, "wrote it", sh.w_wave, sh.w_lane, sh.w_file, sh.w_line, file, line, false);
      if (sh.r_gen == g) {
        if (sh.r_wave != mw)
          lds_race(w, l, p + i, true, "read it", sh.r_wave, sh.r_lane, sh.r_file, sh.r_line, file, line, false);
        if (sh.r_sync == s && sh.r_lane != ml)
          lds_race(w, l, p + i, true, "read it", sh.r_wave, sh.r_lane, sh.r_file, sh.r_line, file, line, true);
      }
      sh.w_gen = g;
      sh.w_wave = mw;
      sh.w_lane = ml;
      sh.w_sync = s;
      sh.w_file = file;
      sh.w_line = line;
    } else {
      if (sh.w_gen == g) {
        if (sh.w_wave != mw)
          lds_race(w, l, p + i, false, "wrote it", sh.w_wave, sh.w_lane, sh.w_file, sh.w_line, file, line, false);
        if (sh.w_sync == s && sh.w_lane != ml)
          lds_race(w, l, p + i, false, "wrote it", sh.w_wave, sh.w_lane, sh.w_file, sh.w_line, file, line, true);
      }
      if (sh.r_gen != g) {
        sh.r_gen = g;
        sh.r_wave = mw;
        sh.r_lane = ml;
        sh.r_sync = s;
      } else if (sh.r_wave != mw) {
        sh.r_wave = MULTI;
      } else if (sh.r_sync != s) {
        sh.r_sync = s;
        sh.r_lane = ml;
      } else if (sh.r_lane != ml) {
        sh.r_lane = MULTI;
      }
      sh.r_file = file;
      sh.r_line = line;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Wave-level operations
// ---------------------------------------------------------------------------------------------
enum ElemT { T_BF16, T_F16, T_F32, T_FP8, T_BF8, T_I8 };
struct MfmaInfo {
  const char* name;
  int M, N, K, kp;   // kp: A (and B) elements per lane
  int ta, tb;
  int arch_min;      // 942 or 950
  // f8f6f4: a lane's kp fp8 values are runs of 16 consecutive k, the runs K/2 apart (lane l: k = 16*(l/M) + s
  // for s < 16, K/2 + 16*(l/M) + s - 16 after; AMD's CDNA4 layout for fp8 operands, tests/emulator/data/
  // cdna4_f8f6f4_layouts.json); the operand types come from cbsz / blgp, the scale bytes follow C in the payload
  bool f8f6f4 = false;
};
const MfmaInfo kMfma[HK_EMU_MFMA__COUNT] = {
    {"v_mfma_f32_16x16x16_bf16", 16, 16, 16, 4, T_BF16, T_BF16, 942},
    {"v_mfma_f32_32x32x8_bf16", 32, 32, 8, 4, T_BF16, T_BF16, 942},
    {"v_mfma_f32_16x16x16_f16", 16, 16, 16, 4, T_F16, T_F16, 942},
    {"v_mfma_f32_32x32x8_f16", 32, 32, 8, 4, T_F16, T_F16, 942},
    {"v_mfma_f32_16x16x32_bf16", 16, 16, 32, 8, T_BF16, T_BF16, 950},
    {"v_mfma_f32_32x32x16_bf16", 32, 32, 16, 8, T_BF16, T_BF16, 950},
    {"v_mfma_f32_16x16x32_f16", 16, 16, 32, 8, T_F16, T_F16, 950},
    {"v_mfma_f32_32x32x16_f16", 32, 32, 16, 8, T_F16, T_F16, 950},
    {"v_mfma_f32_16x16x32_fp8_fp8", 16, 16, 32, 8, T_FP8, T_FP8, 942},
    {"v_mfma_f32_16x16x32_fp8_bf8", 16, 16, 32, 8, T_FP8, T_BF8, 942},
    {"v_mfma_f32_16x16x32_bf8_fp8", 16, 16, 32, 8, T_BF8, T_FP8, 942},
    {"v_mfma_f32_16x16x32_bf8_bf8", 16, 16, 32, 8, T_BF8, T_BF8, 942},
    {"v_mfma_f32_32x32x16_fp8_fp8", 32, 32, 16, 8, T_FP8, T_FP8, 942},
    {"v_mfma_f32_32x32x16_fp8_bf8", 32, 32, 16, 8, T_FP8, T_BF8, 942},
    {"v_mfma_f32_32x32x16_bf8_fp8", 32, 32, 16, 8, T_BF8, T_FP8, 942},
    {"v_mfma_f32_32x32x16_bf8_bf8", 32, 32, 16, 8, T_BF8, T_BF8, 942},
    {"v_mfma_f32_16x16x4_f32", 16, 16, 4, 1, T_F32, T_F32, 942},
    {"v_mfma_f32_32x32x2_f32", 32, 32, 2, 1, T_F32, T_F32, 942},
    {"v_mfma_i32_16x16x32_i8", 16, 16, 32, 8, T_I8, T_I8, 942},
    {"v_mfma_i32_32x32x16_i8", 32, 32, 16, 8, T_I8, T_I8, 942},
    {"v_mfma_scale_f32_16x16x128_f8f6f4", 16, 16, 128, 32, T_FP8, T_FP8, 950, true},
    {"v_mfma_scale_f32_32x32x64_f8f6f4", 32, 32, 64, 32, T_FP8, T_FP8, 950, true},
};
// k of slot s of lane ln's A (or B) operand
inline int mfma_k(const MfmaInfo& mi, int ln, int s) {
  if (mi.f8f6f4) return 16 * (ln / mi.M) + (s / 16) * (mi.K / 2) + s % 16;
  return (ln / mi.M) * mi.kp + s;
}
int elem_bytes(int t) { return (t == T_BF16 || t == T_F16) ? 2 : (t == T_F32 ? 4 : 1); }
double decode(int t, const unsigned char* p, int s, uint32_t arch) {
  using namespace hk_emu_num;
  switch (t) {
    case T_BF16: { uint16_t v; memcpy(&v, p + 2 * s, 2); return bf16_to_f32(v); }
    case T_F16: { uint16_t v; memcpy(&v, p + 2 * s, 2); return f16_to_f32(v); }
    case T_F32: { float v; memcpy(&v, p + 4 * s, 4); return v; }
    case T_FP8: return fp8_to_f32(p[s], arch == 942 ? E4M3_FNUZ : E4M3_FN);
    case T_BF8: return fp8_to_f32(p[s], arch == 942 ? E5M2_FNUZ : E5M2);
    default: return (double)(int8_t)p[s];
  }
}

// Row of D held by lane `ln`, register r (the accumulator layout of AMD's MFMA: a lane holds a
// column j = ln % N and consecutive groups of 4 rows).
inline int d_row(int M, int N, int ln, int r) {
  (void)M;
  int G = 64 / N;
  return 4 * G * (r / 4) + 4 * (ln / N) + (r % 4);
}

void do_mfma(Worker* w, Lane** lanes) {
  const Lane* f = nullptr;
  for (int i = 0; i < 64; ++i)
    if (lanes[i]) { f = lanes[i]; break; }
  int v = f->imm[0];
  if (v < 0 || v >= HK_EMU_MFMA__COUNT) failf(w, "unknown MFMA variant %d", v);
  const MfmaInfo& mi = kMfma[v];
  for (int i = 0; i < 64; ++i)
    if (!lanes[i])
      failf(w, "%s at %s:%d executed by a partial wave (lane %d is inactive or absent): MFMA needs all 64 lanes",
            mi.name, f->file, f->line, i);
  int ta = mi.ta, tb = mi.tb;
  double scale = 1.0;   // the f8f6f4 forms' E8M0 scales, applied to the products' sum before C is added
  if (mi.f8f6f4) {
    if (f->imm[1] < 0 || f->imm[1] > 1 || f->imm[3] < 0 || f->imm[3] > 1)
      failf(w, "%s at %s:%d takes A format %d, B format %d: only fp8 (0, e4m3) and bf8 (1, e5m2) operands are "
               "emulated, not FP6 / FP4 (2-4)", mi.name, f->file, f->line, f->imm[1], f->imm[3]);
    ta = f->imm[1] ? T_BF8 : T_FP8;
    tb = f->imm[3] ? T_BF8 : T_FP8;
    // The scale bytes opsel picked, after A, B and C in each lane's payload. Each lane passes a scale for its row
    // or column and a block of 32 k; which block a lane's scale covers is not in the sources cited for fp8
    // operands, so only one scale per operand (all lanes equal) is modeled.
    const int so = 64 + mi.M * mi.N / 16;
    const unsigned char sa = f->in[so], sb = f->in[so + 1];
    for (int i = 0; i < 64; ++i)
      if (lanes[i]->in[so] != sa || lanes[i]->in[so + 1] != sb)
        failf(w, "%s at %s:%d: lanes pass different E8M0 scales (lane 0: %d/%d, lane %d: %d/%d); only one scale "
                 "per operand for the whole wave is emulated", mi.name, f->file, f->line, sa, sb, i,
              lanes[i]->in[so], lanes[i]->in[so + 1]);
    // E8M0: 2^(e - 127); 0xFF is NaN
    scale = (sa == 0xFF || sb == 0xFF) ? NAN : ldexp(1.0, sa + sb - 254);
  } else if (f->imm[1] || f->imm[2] || f->imm[3]) {
    failf(w, "%s at %s:%d uses cbsz=%d abid=%d blgp=%d: the broadcast modifiers are not emulated (use 0, 0, 0)",
          mi.name, f->file, f->line, f->imm[1], f->imm[2], f->imm[3]);
  }
  uint32_t arch = w->L->arch;
  if ((int)arch < mi.arch_min) failf(w, "%s is not available on gfx%u", mi.name, arch);
  const int M = mi.M, N = mi.N, K = mi.K, kp = mi.kp;
  const int ab = kp * elem_bytes(ta);
  const int creg = M * N / 64;
  if (f->imm[4] != ab || f->imm[5] != creg * 4)
    failf(w, "%s: operand sizes %d/%d bytes, expected %d/%d", mi.name, f->imm[4], f->imm[5], ab, creg * 4);
  static thread_local double A[32][128], B[128][32];
  for (int ln = 0; ln < 64; ++ln) {
    const unsigned char* in = lanes[ln]->in;
    for (int s = 0; s < kp; ++s) {
      int k = mfma_k(mi, ln, s);
      A[ln % M][k] = decode(ta, in, s, arch);
      B[k][ln % N] = decode(tb, in + ab, s, arch);
    }
  }
  for (int ln = 0; ln < 64; ++ln) {
    Lane* l = lanes[ln];
    const unsigned char* cin = l->in + 2 * ab;
    int j = ln % N;
    for (int r = 0; r < creg; ++r) {
      int i = d_row(M, N, ln, r);
      if (mi.ta == T_I8) {
        int32_t c;
        memcpy(&c, cin + 4 * r, 4);
        int64_t acc = c;
        for (int k = 0; k < K; ++k) acc += (int64_t)A[i][k] * (int64_t)B[k][j];
        int32_t d = (int32_t)(uint32_t)(uint64_t)acc;
        memcpy(l->out + 4 * r, &d, 4);
      } else {
        float c;
        memcpy(&c, cin + 4 * r, 4);
        // the scaled forms scale the products' sum before adding C; the others sum onto C (unchanged order)
        double acc = mi.f8f6f4 ? 0.0 : (double)c;
        for (int k = 0; k < K; ++k) acc += A[i][k] * B[k][j];
        float d = (float)(mi.f8f6f4 ? (double)c + acc * scale : acc);
        memcpy(l->out + 4 * r, &d, 4);
      }
    }
  }
}

uint32_t rd32(const Lane* l, int off) { uint32_t v; memcpy(&v, l->in + off, 4); return v; }
uint64_t rdw(const Lane* l, int off, int width) {
  uint64_t v = 0;
  memcpy(&v, l->in + off, (size_t)width);
  return v;
}
void wrw(Lane* l, int off, uint64_t v, int width) { memcpy(l->out + off, &v, (size_t)width); }

// DPP source lane for lane i, or -1 if the control makes it invalid.
int dpp_src(Worker* w, int ctrl, int i, const Lane* f) {
  int r = i & 15;
  if (ctrl >= 0 && ctrl <= 0xff) return (i & ~3) | ((ctrl >> (2 * (i & 3))) & 3);
  if (ctrl >= 0x101 && ctrl <= 0x10f) { int n = ctrl - 0x100; return r + n < 16 ? i + n : -1; }
  if (ctrl >= 0x111 && ctrl <= 0x11f) { int n = ctrl - 0x110; return r >= n ? i - n : -1; }
  if (ctrl >= 0x121 && ctrl <= 0x12f) { int n = ctrl - 0x120; return (i & ~15) | ((r - n) & 15); }
  switch (ctrl) {
    case 0x130: return i < 63 ? i + 1 : -1;           // wave_shl:1
    case 0x134: return (i + 1) & 63;                  // wave_rol:1
    case 0x138: return i > 0 ? i - 1 : -1;            // wave_shr:1
    case 0x13c: return (i + 63) & 63;                 // wave_ror:1
    case 0x140: return (i & ~15) | (15 - r);          // row_mirror
    case 0x141: return (i & ~7) | (7 - (i & 7));      // row_half_mirror
    case 0x142: return i >= 16 ? (i & ~15) - 1 : -1;  // row_bcast:15
    case 0x143: return i >= 32 ? 31 : -1;             // row_bcast:31
  }
  failf(w, "DPP control 0x%x at %s:%d is not emulated (GFX9 quad_perm, row_shl/shr/ror, wave_shl/rol/shr/ror, "
           "row_mirror, row_half_mirror, row_bcast:15/31 are)", ctrl, f->file, f->line);
}

const uint64_t POISON = 0xffbadbadffbadbadull;  // a NaN as f32 and as f64

void resolve(Worker* w, Wave& wv, Lane** lanes, int op) {
  const Lane* f = nullptr;
  uint64_t act = 0;
  for (int i = 0; i < 64; ++i)
    if (lanes[i]) { act |= 1ull << i; if (!f) f = lanes[i]; }
  for (int i = 0; i < 64; ++i)
    if (lanes[i] && memcmp(lanes[i]->imm, f->imm, sizeof f->imm) != 0)
      failf(w, "%s at %s:%d: lanes %d and %d pass different immediate operands (they must be constants)",
            op_name(op), f->file, f->line, (int)f->info.lane, i);
  switch (op) {
    case HK_EMU_OP_BPERMUTE:
      for (int i = 0; i < 64; ++i)
        if (lanes[i]) {
          int src = (int)((rd32(lanes[i], 0) >> 2) & 63);
          uint32_t v = lanes[src] ? rd32(lanes[src], 4) : 0;
          wrw(lanes[i], 0, v, 4);
        }
      break;
    case HK_EMU_OP_PERMUTE: {
      uint32_t tmp[64] = {0};
      for (int i = 0; i < 64; ++i)
        if (lanes[i]) tmp[(rd32(lanes[i], 0) >> 2) & 63] = rd32(lanes[i], 4);
      for (int i = 0; i < 64; ++i)
        if (lanes[i]) wrw(lanes[i], 0, tmp[i], 4);
      break;
    }
    case HK_EMU_OP_SWIZZLE: {
      int pat = f->imm[0] & 0xffff;
      for (int i = 0; i < 64; ++i) {
        if (!lanes[i]) continue;
        int j;
        if (pat & 0x8000) {
          j = (i & ~3) | ((pat >> (2 * (i & 3))) & 3);
        } else {
          int andm = pat & 31, orm = (pat >> 5) & 31, xorm = (pat >> 10) & 31;
          j = (i & 32) | ((((i & 31) & andm) | orm) ^ xorm);
        }
        wrw(lanes[i], 0, lanes[j] ? rd32(lanes[j], 0) : 0, 4);
      }
      break;
    }
    case HK_EMU_OP_DPP: {
      int ctrl = f->imm[0], row_mask = f->imm[1], bank_mask = f->imm[2], bound = f->imm[3], mov = f->imm[4];
      int width = f->imm[5];
      for (int i = 0; i < 64; ++i) {
        if (!lanes[i]) continue;
        uint64_t old = mov ? (POISON & (width == 8 ? ~0ull : 0xffffffffull)) : rdw(lanes[i], 0, width);
        int row = i >> 4, bank = (i & 15) >> 2;
        uint64_t v;
        if (!((row_mask >> row) & 1) || !((bank_mask >> bank) & 1)) {
          v = old;
        } else {
          int s = dpp_src(w, ctrl, i, f);
          if (s >= 0 && lanes[s]) v = rdw(lanes[s], width, width);
          else v = bound ? 0 : old;
        }
        wrw(lanes[i], 0, v, width);
      }
      break;
    }
    case HK_EMU_OP_READLANE: {
      int width = (int)(f->in_bytes / 2);
      uint32_t idx = rd32(f, width);
      for (int i = 0; i < 64; ++i)
        if (lanes[i] && rd32(lanes[i], width) != idx)
          failf(w, "readlane at %s:%d: the lane index must be wave-uniform (lane %d asks for %u, lane %d for %u)",
                f->file, f->line, (int)f->info.lane, idx, i, rd32(lanes[i], width));
      idx &= 63;
      if (!lanes[idx]) failf(w, "readlane at %s:%d reads lane %u, which is inactive", f->file, f->line, idx);
      uint64_t v = rdw(lanes[idx], 0, width);
      for (int i = 0; i < 64; ++i)
        if (lanes[i]) wrw(lanes[i], 0, v, width);
      break;
    }
    case HK_EMU_OP_READFIRSTLANE: {
      int width = (int)(f->in_bytes / 2);
      uint64_t v = rdw(f, 0, width);
      for (int i = 0; i < 64; ++i)
        if (lanes[i]) wrw(lanes[i], 0, v, width);
      break;
    }
    case HK_EMU_OP_WRITELANE: {
      int width = f->imm[0];
      uint64_t idx = rdw(f, 16, 8);
      uint64_t val = rdw(f, 0, width);
      for (int i = 0; i < 64; ++i) {
        if (!lanes[i]) continue;
        if (rdw(lanes[i], 16, 8) != idx || rdw(lanes[i], 0, width) != val)
          failf(w, "writelane at %s:%d: the value and lane index must be wave-uniform", f->file, f->line);
        wrw(lanes[i], 0, (uint64_t)i == (idx & 63) ? val : rdw(lanes[i], 8, width), width);
      }
      break;
    }
    case HK_EMU_OP_BALLOT: {
      uint64_t m = 0;
      for (int i = 0; i < 64; ++i)
        if (lanes[i] && rd32(lanes[i], 0)) m |= 1ull << i;
      for (int i = 0; i < 64; ++i)
        if (lanes[i]) wrw(lanes[i], 0, m, 8);
      break;
    }
    case HK_EMU_OP_READ_EXEC:
      for (int i = 0; i < 64; ++i)
        if (lanes[i]) wrw(lanes[i], 0, act, 8);
      break;
    case HK_EMU_OP_PERMLANE16_SWAP:
    case HK_EMU_OP_PERMLANE32_SWAP: {
      if (w->L->arch < 950) failf(w, "%s is gfx950-only", op_name(op));
      int d = op == HK_EMU_OP_PERMLANE16_SWAP ? 16 : 32;
      for (int i = 0; i < 64; ++i) {
        if (!lanes[i]) continue;
        bool upper = (i & d) != 0;  // odd rows (16) / rows 2-3 (32)
        int p = upper ? i - d : i + d;
        uint32_t nd = rd32(lanes[i], 0), ns = rd32(lanes[i], 4);
        if (upper) { if (lanes[p]) nd = rd32(lanes[p], 4); }
        else { if (lanes[p]) ns = rd32(lanes[p], 0); }
        wrw(lanes[i], 0, nd, 4);
        wrw(lanes[i], 4, ns, 4);
      }
      break;
    }
    case HK_EMU_OP_MFMA:
      do_mfma(w, lanes);
      break;
    case HK_EMU_OP_LOAD_LDS: {
      int size = f->imm[0], off = f->imm[1];
      const bool by_m0 = f->imm[2] != 0;   // inline asm: the 32-bit M0 value, not a pointer
      uint64_t base = rdw(f, 0, 8);
      for (int i = 0; i < 64; ++i)
        if (lanes[i] && rdw(lanes[i], 0, 8) != base)
          failf(w, "direct-to-LDS load at %s:%d: the LDS base %s must be wave-uniform (lane %d: %#lx, "
                   "lane %d: %#lx)", f->file, f->line, by_m0 ? "(M0)" : "pointer", (int)f->info.lane,
                (unsigned long)base, i, (unsigned long)rdw(lanes[i], 0, 8));
      if (by_m0) {   // the LDS address M0 + inst_offset, 32-bit as the hardware adds it; the lane's slot follows
        base = (uint64_t)(uintptr_t)lds_from_m0(w, (uint32_t)base, off, f);
        off = 0;
      }
      int stride = size <= 4 ? 4 : 16;
      const int wave = (int)f->info.wave;
      const uint32_t seq = issue_dma(w, w->waves[wave]);
      for (int i = 0; i < 64; ++i) {
        if (!lanes[i]) continue;
        char* dst = (char*)(uintptr_t)(base + (uint64_t)(int64_t)off + (uint64_t)(i * stride));
        w->cur = lanes[i];
        const size_t at = lds_index(w, dst, (uint32_t)size);
        for (int b = 0; at != NO_SHADOW && b < size; ++b)    // this wave's earlier loads land first
          if (w->shadow[at + b].dma_wave == wave) w->shadow[at + b].dma_seq = 0;
        lds_access(w, lanes[i], dst, (uint32_t)size, size >= 4 ? 4 : (uint32_t)size, true, f->file, f->line);
        memcpy(dst, lanes[i]->in + 8, (size_t)size);
        for (int b = 0; at != NO_SHADOW && b < size; ++b) {
          w->shadow[at + b].dma_seq = seq;
          w->shadow[at + b].dma_wave = (uint8_t)wave;
          w->shadow[at + b].w_file = f->file;          // the load's site, for the report
          w->shadow[at + b].w_line = f->line;
        }
      }
      w->cur = nullptr;
      break;
    }
    case HK_EMU_OP_DS_READ_TR16: {
      if (w->L->arch < 950) failf(w, "ds_read_b64_tr_b16 is gfx950-only");
      uint16_t R[64][4];
      memset(R, 0, sizeof R);
      for (int i = 0; i < 64; ++i) {
        if (!lanes[i]) continue;
        const char* a = (const char*)(uintptr_t)rdw(lanes[i], 0, 8);
        w->cur = lanes[i];
        lds_access(w, lanes[i], a, 8, 8, false, f->file, f->line);
        memcpy(R[i], a, 8);
      }
      w->cur = nullptr;
      for (int i = 0; i < 64; ++i) {
        if (!lanes[i]) continue;
        int b = i & ~15, li = i & 15;
        uint16_t o[4];
        for (int e = 0; e < 4; ++e) o[e] = R[b + 4 * e + li / 4][li % 4];
        memcpy(lanes[i]->out, o, 8);
      }
      break;
    }
    default:
      failf(w, "unknown wave operation %d at %s:%d", op, f->file, f->line);
  }
  (void)wv;
}

bool op_allows_inactive(int op) {
  return op == HK_EMU_OP_BALLOT || op == HK_EMU_OP_READ_EXEC || op == HK_EMU_OP_READFIRSTLANE;
}

void check_timeout(Worker* w) {
  if (!w->deadline_ns || (++w->tick & 255)) return;
  if (now_ns() > w->deadline_ns || g_timed_out.load(std::memory_order_relaxed))
    failf(w, "timeout: the launch ran longer than %u ms (HK_EMU_TIMEOUT_MS / launch(timeout=))", w->L->timeout_ms);
  if (g_abort.load(std::memory_order_relaxed)) {
    w->aborted = true;
    failf(w, "aborted (another block failed)");
  }
}

// Run the lanes of one wave until the wave waits at s_barrier or all its lanes have ended.
void run_wave(Worker* w, Wave& wv) {
  Lane* lanes = w->lanes + wv.first;
  for (;;) {
    for (int i = 0; i < wv.n; ++i)
      if (lanes[i].state == L_READY) switch_to(w, &lanes[i]);
    check_timeout(w);
    int nblk = 0, nexit = 0, nsoft = 0;
    Lane* f = nullptr;
    for (int i = 0; i < wv.n; ++i) {
      Lane& l = lanes[i];
      if (l.state == L_BLOCKED) {
        ++nblk;
        if (l.op == HK_EMU_OP_SOFT) ++nsoft;
        else if (!f) f = &l;
      } else if (l.state == L_EXITED) {
        ++nexit;
      }
    }
    if (nblk == 0) {
      wv.state = W_DONE;
      return;
    }
    if (nsoft == nblk) {          // every live lane at a soft sync point: the wave is ordered here
      ++wv.sync;
      complete_dma(wv, lanes);
      for (int i = 0; i < wv.n; ++i)
        if (lanes[i].state == L_BLOCKED) lanes[i].state = L_READY;
      continue;
    }
    if (nsoft > 0) {              // let lanes at soft points catch up with the others
      complete_dma(wv, lanes);
      for (int i = 0; i < wv.n; ++i)
        if (lanes[i].state == L_BLOCKED && lanes[i].op == HK_EMU_OP_SOFT) lanes[i].state = L_READY;
      continue;
    }
    // Partial EXEC: lanes at one uniformity operation (readfirstlane, readlane, ballot, read_exec) while
    // every other live lane of the wave waits at s_barrier. The waiting lanes have left the divergent
    // region and cannot reach this instance again without passing the barrier, so the operation runs
    // for the lanes that are here, as on the device (e.g. `if (lane < 16) x[wave()] = ...; barrier`).
    {
      Lane* u = nullptr;
      bool partial = true;
      int nu = 0;
      for (int i = 0; i < wv.n && partial; ++i) {
        Lane& l = lanes[i];
        if (l.state != L_BLOCKED || l.op == HK_EMU_OP_BARRIER) continue;
        if (!op_allows_inactive(l.op) && l.op != HK_EMU_OP_READLANE) partial = false;
        else if (!u) u = &l;
        else if (l.op != u->op || l.site != u->site) partial = false;
        if (partial) ++nu;
      }
      if (partial && u && nu < nblk) {
        Lane* by_lane[64] = {nullptr};
        for (int i = 0; i < wv.n; ++i)
          if (lanes[i].state == L_BLOCKED && lanes[i].op == u->op) by_lane[lanes[i].info.lane] = &lanes[i];
        ++w->st_xlane;
        resolve(w, wv, by_lane, u->op);
        ++wv.sync;
        for (int i = 0; i < wv.n; ++i)
          if (lanes[i].state == L_BLOCKED && lanes[i].op == u->op) lanes[i].state = L_READY;
        continue;
      }
    }
    for (int i = 0; i < wv.n; ++i) {
      Lane& l = lanes[i];
      if (l.state == L_BLOCKED && (l.op != f->op || l.site != f->site)) {
        char a[160], b[160];
        describe_lane(f, a, sizeof a);
        describe_lane(&l, b, sizeof b);
        const char* hint = "";
        if (f->op == HK_EMU_OP_READFIRSTLANE || l.op == HK_EMU_OP_READFIRSTLANE || f->op == HK_EMU_OP_BALLOT ||
            l.op == HK_EMU_OP_BALLOT)
          hint = " (a readfirstlane/ballot inside a branch that only some lanes take runs with a partial EXEC "
                 "on the device; the emulator accepts that only while the other lanes wait at s_barrier or have "
                 "returned -- compute it before the branch)";
        failf(w,
              "divergent wave operation in wave %u: %s is at %s (%s:%d) while %s is at %s (%s:%d); all live "
              "lanes of a wave must reach the same wave-level operation (cross-lane builtin, MFMA, s_barrier) "
              "together%s",
              f->info.wave, a, op_name(f->op), f->file, f->line, b, op_name(l.op), l.file, l.line, hint);
      }
    }
    if (f->op == HK_EMU_OP_BARRIER) {
      wv.state = W_BARRIER;
      wv.bfile = f->file;
      wv.bline = f->line;
      return;
    }
    if (nexit > 0 && !op_allows_inactive(f->op)) {
      int ex = -1;
      for (int i = 0; i < wv.n; ++i)
        if (lanes[i].state == L_EXITED) { ex = i; break; }
      failf(w,
            "%s at %s:%d reached by wave %u after %d of its lanes returned (first: lane %d): cross-lane "
            "operations need every lane of the wave (only ballot, read_exec and readfirstlane accept "
            "lanes that have ended)",
            op_name(f->op), f->file, f->line, f->info.wave, nexit, lanes[ex].info.lane);
    }
    Lane* by_lane[64] = {nullptr};
    for (int i = 0; i < wv.n; ++i)
      if (lanes[i].state == L_BLOCKED) by_lane[lanes[i].info.lane] = &lanes[i];
    ++w->st_xlane;
    resolve(w, wv, by_lane, f->op);
    ++wv.sync;
    for (int i = 0; i < wv.n; ++i)
      if (lanes[i].state == L_BLOCKED) lanes[i].state = L_READY;
  }
}

void schedule(Worker* w) {
  for (;;) {
    for (int i = 0; i < w->nwaves; ++i)
      if (w->waves[i].state == W_RUN) run_wave(w, w->waves[i]);
    int nb = 0, nd = 0;
    for (int i = 0; i < w->nwaves; ++i) {
      if (w->waves[i].state == W_BARRIER) ++nb;
      else if (w->waves[i].state == W_DONE) ++nd;
    }
    if (nb == 0) return;
    if (nd > 0) {
      char waiting[512] = "", ended[512] = "";
      size_t a = 0, b = 0;
      const Wave* ww = nullptr;
      for (int i = 0; i < w->nwaves; ++i) {
        const Wave& v = w->waves[i];
        if (v.state == W_BARRIER) {
          if (!ww) ww = &v;
          if (a < sizeof waiting - 32) a += (size_t)snprintf(waiting + a, sizeof waiting - a, "%s%d", a ? "," : "", i);
        } else if (b < sizeof ended - 32) {
          b += (size_t)snprintf(ended + b, sizeof ended - b, "%s%d (after %u barriers)", b ? ", " : "", i, v.barriers);
        }
      }
      failf(w,
            "barrier deadlock: waves %s wait at s_barrier #%u (%s:%d) but waves %s have ended; the waves of "
            "the block execute different numbers of barriers (on AMD hardware ended waves drop out of the "
            "barrier, on NVIDIA this hangs; either way the kernel's barriers are unbalanced)",
            waiting, ww->barriers + 1, ww->bfile, ww->bline, ended);
    }
    ++w->gen;  // a new barrier generation: LDS accesses before and after are ordered
    ++w->st_barrier;
    check_timeout(w);
    for (int i = 0; i < w->nwaves; ++i) {
      Wave& v = w->waves[i];
      v.state = W_RUN;
      ++v.barriers;
      ++v.sync;
      for (int j = 0; j < v.n; ++j)
        if (w->lanes[v.first + j].state == L_BLOCKED) w->lanes[v.first + j].state = L_READY;
    }
  }
}

void fill_packets(Worker* w) {
  const hk_emu_launch* L = w->L;
  memset(w->dispatch, 0, sizeof w->dispatch);
  memset(w->implicit, 0, sizeof w->implicit);
  // hsa_kernel_dispatch_packet_t: workgroup_size_{x,y,z} u16 at 4, 6, 8; grid_size_{x,y,z} u32 at 12, 16, 20
  for (int d = 0; d < 3; ++d) {
    uint16_t ws = (uint16_t)L->block[d];
    uint32_t gs = L->grid[d] * L->block[d];
    memcpy(w->dispatch + 4 + 2 * d, &ws, 2);
    memcpy(w->dispatch + 12 + 4 * d, &gs, 4);
  }
  uint16_t dims = (uint16_t)((L->grid[2] * L->block[2] > 1) ? 3 : (L->grid[1] * L->block[1] > 1 ? 2 : 1));
  memcpy(w->dispatch + 2, &dims, 2);
  // code object v5 implicit arguments: block_count_{x,y,z} u32 at 0, 4, 8; group_size_{x,y,z} u16 at
  // 12, 14, 16; remainder_{x,y,z} u16 at 18, 20, 22 (0: uniform work-group size); grid_dims u16 at 64;
  // dynamic_lds_size u32 at 120
  for (int d = 0; d < 3; ++d) {
    uint32_t bc = L->grid[d];
    uint16_t gs = (uint16_t)L->block[d];
    memcpy(w->implicit + 4 * d, &bc, 4);
    memcpy(w->implicit + 12 + 2 * d, &gs, 2);
  }
  memcpy(w->implicit + 64, &dims, 2);
  memcpy(w->implicit + 120, &L->dyn_lds, 4);
}

bool run_block(Worker* w, uint64_t b) {
  const hk_emu_launch* L = w->L;
  uint32_t gx = L->grid[0], gy = L->grid[1];
  w->bid[0] = (uint32_t)(b % gx);
  w->bid[1] = (uint32_t)((b / gx) % gy);
  w->bid[2] = (uint32_t)(b / ((uint64_t)gx * gy));
  const uint32_t bx = L->block[0], by = L->block[1], bz = L->block[2];
  const int n = (int)(bx * by * bz);
  if (!(L->flags & HK_EMU_F_NO_POISON)) {
    if (w->s_size) memset(w->s_lo, 0xff, w->s_size);
    if (w->d_size) memset(w->d_lo, 0xff, w->d_size);
  }
  w->gen += 2;
  w->nthreads = n;
  w->nwaves = (n + 63) / 64;
  for (int i = 0; i < n; ++i) {
    Lane& l = w->lanes[i];
    l.state = L_READY;
    l.op = 0;
    hk_emu_lane_info& in = l.info;
    in.tid[0] = (uint32_t)i % bx;
    in.tid[1] = ((uint32_t)i / bx) % by;
    in.tid[2] = (uint32_t)i / (bx * by);
    for (int d = 0; d < 3; ++d) {
      in.bid[d] = w->bid[d];
      in.bdim[d] = L->block[d];
      in.gdim[d] = L->grid[d];
    }
    in.lane = (uint32_t)(i & 63);
    in.wave = (uint32_t)(i >> 6);
    in.flat = (uint32_t)i;
    in.arch = L->arch;
    in.static_lds = w->s_size;
    in.dyn_lds = w->d_size;
    in.dispatch = w->dispatch;
    in.implicit = w->implicit;
    init_stack(&l);
  }
  // Loads of earlier blocks (or of a launch an error stopped, whatever module it ran) count as landed:
  // no direct-to-LDS tag survives into this block (a planted-bug launch left some, CI 2026-12-03).
  for (size_t i = 0, n_sh = (size_t)w->s_size + w->d_size; i < n_sh && i < w->shadow_cap; ++i) w->shadow[i].dma_seq = 0;
  for (int i = 0; i < w->nwaves; ++i) {
    Wave& v = w->waves[i];
    v.first = i * 64;
    v.n = (n - i * 64) < 64 ? n - i * 64 : 64;
    v.state = W_RUN;
    v.sync = 0;
    v.barriers = 0;
    v.bfile = nullptr;
    v.bline = 0;
    v.dma_head = v.dma_n = 0;
    v.dma_done = w->dma_seq;     // loads of earlier blocks count as landed
  }
  if (sigsetjmp(w->jb, 1)) {
    w->in_block = 0;
    w->in_lane = false;
    w->cur = nullptr;
    return false;
  }
  w->in_block = 1;
  schedule(w);
  w->in_block = 0;
  ++w->st_blocks;
  return true;
}

// ---------------------------------------------------------------------------------------------
// Faults
// ---------------------------------------------------------------------------------------------
void describe_fault(Worker* w, int sig, siginfo_t* si, void* uc) {
  char* e = w->err;
  size_t cap = sizeof w->err;
  int k = prefix(w, e, cap);
  const char* sname = sig == SIGSEGV ? "SIGSEGV" : sig == SIGBUS ? "SIGBUS" : sig == SIGFPE ? "SIGFPE"
                    : sig == SIGILL ? "SIGILL" : "SIGTRAP";
  char who[200] = "the emulator's scheduler (internal error)";
  if (w->cur) {
    char d[160];
    describe_lane(w->cur, d, sizeof d);
    snprintf(who, sizeof who, w->in_lane ? "%s" : "%s (in a wave operation applied for it)", d);
  }
  char pcdesc[256] = "";
  ucontext_t* u = (ucontext_t*)uc;
  void* pc = u ? (void*)(uintptr_t)u->uc_mcontext.gregs[REG_RIP] : nullptr;
  Dl_info di;
  if (pc && dladdr(pc, &di) && di.dli_fname)
    snprintf(pcdesc, sizeof pcdesc, " [pc %s+%#lx]", di.dli_fname,
             (unsigned long)((char*)pc - (char*)di.dli_fbase));
  if (sig == SIGFPE) {
    snprintf(e + k, cap - (size_t)k,
             "%s: integer division by zero or overflow in %s%s (x86 traps here; AMD GPUs do not trap and "
             "return an unspecified value)", sname, who, pcdesc);
    return;
  }
  if (sig == SIGILL || sig == SIGTRAP) {
    snprintf(e + k, cap - (size_t)k, "%s: %s executed a trap (__builtin_trap, assert, or unreachable code)%s",
             sname, who, pcdesc);
    return;
  }
  char* a = (char*)si->si_addr;
  char what[512];
  const hk_emu_launch* L = w->L;
  bool found = false;
  for (uint32_t r = 0; r < L->nregions && !found; ++r) {
    const hk_emu_region& g = L->regions[r];
    if ((uint64_t)(uintptr_t)a >= g.map_lo && (uint64_t)(uintptr_t)a < g.map_hi) {
      found = true;
      uint64_t x = (uint64_t)(uintptr_t)a;
      if (x >= g.hi)
        snprintf(what, sizeof what, "out-of-bounds global access at %p: %lu bytes past the end of %s (%lu bytes)",
                 (void*)a, (unsigned long)(x - g.hi), g.name, (unsigned long)(g.hi - g.lo));
      else if (x < g.lo)
        snprintf(what, sizeof what, "out-of-bounds global access at %p: %lu bytes before the start of %s (%lu bytes)",
                 (void*)a, (unsigned long)(g.lo - x), g.name, (unsigned long)(g.hi - g.lo));
      else
        snprintf(what, sizeof what, "invalid access at %p inside %s", (void*)a, g.name);
    }
  }
  if (!found && w->g_hi && a >= w->g_hi && a < w->g_hi + PAGE) {
    found = true;
    snprintf(what, sizeof what,
             "LDS out of bounds at %p: %ld bytes past the end of the kernel's %u bytes of static __shared__ storage",
             (void*)a, (long)(a - (w->s_lo + w->s_size)), w->s_size);
  }
  if (!found && w->g_lo && a >= w->g_lo && a < w->g_lo + PAGE) {
    found = true;
    snprintf(what, sizeof what, "LDS out of bounds at %p: %ld bytes before the start of the static __shared__ storage",
             (void*)a, (long)(w->s_lo - a));
  }
  if (!found && w->d_lo && a >= w->d_lo && a < w->d_lo + w->d_cap) {
    found = true;
    snprintf(what, sizeof what,
             "LDS out of bounds at %p: dynamic LDS byte %lu, but the launch has %u bytes of dynamic LDS (shared_bytes)",
             (void*)a, (unsigned long)(a - w->d_lo), w->d_size);
  }
  if (!found && w->cur && a < w->cur->stack_lo && a >= w->cur->stack_lo - STACK_GUARD) {
    found = true;
    snprintf(what, sizeof what, "stack overflow of the lane (%zu KiB per lane; set HK_EMU_STACK_KB)",
             w->stack_size / 1024);
  }
  if (!found && sig == SIGSEGV && si->si_code == SI_KERNEL) {
    found = true;
    snprintf(what, sizeof what,
             "general protection fault (no faulting address): most likely a vector load/store through a pointer "
             "that is not aligned to the vector's size (x86 requires it for 16-byte vectors; AMD tolerates "
             "unaligned global accesses) or a non-canonical address");
  }
  if (!found && (uintptr_t)a < PAGE) {
    found = true;
    snprintf(what, sizeof what, "null pointer dereference (address %p)", (void*)a);
  }
  if (!found)
    snprintf(what, sizeof what,
             "invalid access at %p, which is in no tensor argument of this launch (a wild or stale pointer, or "
             "memory the kernel was not given)", (void*)a);
  snprintf(e + k, cap - (size_t)k, "%s by %s%s", what, who, pcdesc);
  (void)sname;
}

void on_fault(int sig, siginfo_t* si, void* uc) {
  Worker* w = tl_worker;
  if (sig == WATCHDOG_SIG && si->si_code == SI_TKILL && g_timed_out.load()) {
    if (!w || !w->in_block || !w->in_lane) return;  // the scheduler notices the deadline itself
    int k = prefix(w, w->err, sizeof w->err);
    char d[160] = "?";
    if (w->cur) describe_lane(w->cur, d, sizeof d);
    char pcdesc[256] = "";
    ucontext_t* u = (ucontext_t*)uc;
    void* pc = u ? (void*)(uintptr_t)u->uc_mcontext.gregs[REG_RIP] : nullptr;
    Dl_info di;
    if (pc && dladdr(pc, &di) && di.dli_fname)
      snprintf(pcdesc, sizeof pcdesc, " [pc %s+%#lx]", di.dli_fname, (unsigned long)((char*)pc - (char*)di.dli_fbase));
    snprintf(w->err + k, sizeof w->err - (size_t)k,
             "timeout: the launch ran longer than %u ms; %s was still running without reaching a wave-level "
             "operation (an endless loop?)%s", w->L->timeout_ms, d, pcdesc);
    siglongjmp(w->jb, 3);
  }
  if (w && w->in_block) {
    describe_fault(w, sig, si, uc);
    siglongjmp(w->jb, 2);
  }
  // Not ours: hand the signal to whoever had it before.
  struct sigaction* o = &g_old_sa[sig];
  if (o->sa_flags & SA_SIGINFO) {
    if (o->sa_sigaction) { o->sa_sigaction(sig, si, uc); return; }
  } else if (o->sa_handler == SIG_IGN) {
    return;
  } else if (o->sa_handler != SIG_DFL && o->sa_handler) {
    o->sa_handler(sig);
    return;
  }
  signal(sig, SIG_DFL);  // default action: returning re-executes the fault, which now kills
}

void install_handlers() {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_fault;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  for (int s : g_sigs) sigaction(s, &sa, &g_old_sa[s]);
}

void restore_handlers() {
  for (int s : g_sigs) {
    struct sigaction cur;
    sigaction(s, nullptr, &cur);
    if ((cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == on_fault) sigaction(s, &g_old_sa[s], nullptr);
  }
}

void worker_main(int idx, hk_emu_launch* L) {
  Worker* w = g_workers[(size_t)idx];
  tl_worker = w;
  {
    std::lock_guard<std::mutex> g(g_wd_mutex);
    w->thread = pthread_self();
    w->alive = true;
  }
  stack_t ss, old_ss;
  ss.ss_sp = w->altstack;
  ss.ss_size = 256 * 1024;
  ss.ss_flags = 0;
  sigaltstack(&ss, &old_ss);
  w->L = L;
  w->entry = (void (*)(void**))L->entries[idx];
  const hk_emu_module_info* mod = L->mods[idx];
  w->s_lo = mod->lds_lo;
  w->s_size = mod->lds_lo ? (uint32_t)(mod->lds_hi - mod->lds_lo) : 0;
  w->g_lo = mod->guard_lo;
  w->g_hi = mod->guard_hi;
  w->d_lo = mod->dyn;
  w->d_cap = mod->dyn_cap;
  w->d_size = L->dyn_lds;
  w->deadline_ns = L->timeout_ms ? now_ns() + (uint64_t)L->timeout_ms * 1000000ull : 0;
  w->st_xlane = w->st_switch = w->st_lds = w->st_barrier = w->st_blocks = 0;
  size_t usable = (w->d_size + PAGE - 1) & ~(PAGE - 1);
  if (usable) mprotect(w->d_lo, usable, PROT_READ | PROT_WRITE);
  if (usable < w->d_cap) mprotect(w->d_lo + usable, w->d_cap - usable, PROT_NONE);
  fill_packets(w);
  const uint64_t total = (uint64_t)L->grid[0] * L->grid[1] * L->grid[2];
  for (;;) {
    if (g_abort.load()) break;
    uint64_t b = g_next_block.fetch_add(1);
    if (b >= total) break;
    w->aborted = false;
    if (!run_block(w, b)) {
      if (w->aborted) break;
      std::lock_guard<std::mutex> g(g_err_mutex);
      if (b < g_err_block) {
        g_err_block = b;
        g_err.assign(w->err, w->err + strlen(w->err) + 1);
      }
      g_abort.store(true);
      break;
    }
  }
  mprotect(w->d_lo, w->d_cap, PROT_READ | PROT_WRITE);
  {
    std::lock_guard<std::mutex> g(g_wd_mutex);
    w->alive = false;
  }
  sigaltstack(&old_ss, nullptr);
  tl_worker = nullptr;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Entry points for kernel modules (device side)
// ---------------------------------------------------------------------------------------------
HK_EXPORT const hk_emu_lane_info* hk_emu_cur(void) { return &tl_worker->cur->info; }

extern "C" __attribute__((visibility("hidden"), noreturn, used)) void hk_emu_lane_main(void) {
  Worker* w = tl_worker;
  w->entry(w->L->params);
  Lane* l = w->cur;
  l->state = L_EXITED;
  yield_lane(w, l);
  __builtin_trap();
}

HK_EXPORT __attribute__((noreturn)) void hk_emu_exit_lane(void) {
  Worker* w = tl_worker;
  Lane* l = w->cur;
  l->state = L_EXITED;
  yield_lane(w, l);
  __builtin_trap();
}

HK_EXPORT __attribute__((noinline)) void hk_emu_xlane(int op, const void* in, uint32_t in_bytes, void* out,
                                                      uint32_t out_bytes, const int32_t* imm, const char* file,
                                                      int line) {
  Worker* w = tl_worker;
  Lane* l = w->cur;
  if (in_bytes > sizeof l->in || out_bytes > sizeof l->out) failf(w, "wave operation payload too large");
  memcpy(l->in, in, in_bytes);
  l->in_bytes = in_bytes;
  l->out_bytes = out_bytes;
  if (imm) memcpy(l->imm, imm, sizeof l->imm);
  else memset(l->imm, 0, sizeof l->imm);
  l->op = op;
  l->file = file;
  l->line = line;
  l->site = site_hash(l, op);
  l->state = L_BLOCKED;
  yield_lane(w, l);
  if (out_bytes) memcpy(out, l->out, out_bytes);
}

HK_EXPORT __attribute__((noinline)) void hk_emu_point(int op, const char* file, int line) {
  Worker* w = tl_worker;
  Lane* l = w->cur;
  l->op = op;
  l->file = file;
  l->line = line;
  l->site = site_hash(l, op);
  memset(l->imm, 0, sizeof l->imm);
  l->state = L_BLOCKED;
  yield_lane(w, l);
}

HK_EXPORT __attribute__((noinline)) void hk_emu_waitcnt(int imm, const char* file, int line) {
  Worker* w = tl_worker;
  Lane* l = w->cur;
  l->op = HK_EMU_OP_SOFT;
  l->file = file;
  l->line = line;
  l->site = site_hash(l, HK_EMU_OP_SOFT);
  memset(l->imm, 0, sizeof l->imm);
  l->imm[0] = 1;                                  // a waitcnt, not a fence or wave_barrier
  l->imm[1] = (imm & 0xf) | ((imm >> 10) & 0x30); // gfx9 vmcnt: bits 3:0 and 15:14
  l->state = L_BLOCKED;
  yield_lane(w, l);
}

HK_EXPORT void hk_emu_lds_check(const void* p, uint32_t n, uint32_t align, int is_write, const char* file,
                                int line) {
  Worker* w = tl_worker;
  lds_access(w, w->cur, (const char*)p, n, align, is_write != 0, file, line);
}

HK_EXPORT int hk_emu_is_lds(const void* p) {
  Worker* w = tl_worker;
  const char* c = (const char*)p;
  return (c >= w->s_lo && c < w->s_lo + w->s_size) || (c >= w->d_lo && c < w->d_lo + w->d_size);
}

HK_EXPORT __attribute__((noreturn)) void hk_emu_fail(const char* file, int line, const char* fmt, ...) {
  Worker* w = tl_worker;
  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  char who[160] = "?";
  if (w->cur) describe_lane(w->cur, who, sizeof who);
  failf(w, "%s (%s, at %s:%d)", msg, who, file, line);
}

// ---------------------------------------------------------------------------------------------
// Entry points for the Python side
// ---------------------------------------------------------------------------------------------
HK_EXPORT int hk_emu_abi(void) { return HK_EMU_ABI; }

// float/double -> bf16 helpers the x86 backend calls when it legalizes bf16 values (also for plain
// copies of bf16 vector elements). libgcc gained them only in GCC 13; kernel modules link against this
// runtime, so they find them here. Round to nearest even; NaN stays NaN (quiet, sign kept).
HK_EXPORT __bf16 __truncsfbf2(float f) {
  uint16_t h = hk_emu_num::f32_to_bf16_rne(f);
  __bf16 r;
  memcpy(&r, &h, 2);
  return r;
}
HK_EXPORT __bf16 __truncdfbf2(double d) {
  uint16_t h;
  if (d != d) {
    h = (uint16_t)((signbit(d) ? 0x8000u : 0u) | 0x7fc0u);
  } else {
    double a = fabs(d);
    uint16_t sign = signbit(d) ? 0x8000 : 0;
    if (isinf(a) || a >= 0x1.ff8p+127) {          // rounds past the largest finite (0x1.fep127)
      h = (uint16_t)(sign | 0x7f80);
    } else if (a == 0.0) {
      h = sign;
    } else {
      int e;
      frexp(a, &e);
      e -= 1;                                     // a = 1.x * 2^e
      int q = e < -126 ? -126 : e;                // subnormals share the exponent of the smallest normal
      double quantum = ldexp(1.0, q - 7);
      double r = nearbyint(a / quantum) * quantum;  // exact scaling, one rounding
      float rf = (float)r;                        // r has at most 8 significant bits: exact in float
      uint32_t u;
      memcpy(&u, &rf, 4);
      h = (uint16_t)(sign | (u >> 16));
    }
  }
  __bf16 r;
  memcpy(&r, &h, 2);
  return r;
}

// A guarded region for one tensor argument: [PROT_NONE page][... data][PROT_NONE page], the data's end
// (rounded up to 16 bytes, for alignment) abutting the trailing guard page.
HK_EXPORT void* hk_emu_region_alloc(uint64_t nbytes, uint64_t* data_off, uint64_t* map_len) {
  uint64_t data = (nbytes + 15) & ~15ull;
  if (data == 0) data = 16;
  uint64_t body = (data + PAGE - 1) & ~(uint64_t)(PAGE - 1);
  uint64_t len = PAGE + body + PAGE;
  char* base = (char*)mmap(nullptr, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED) return nullptr;
  if (mprotect(base + PAGE, body, PROT_READ | PROT_WRITE) != 0) {
    munmap(base, len);
    return nullptr;
  }
  *data_off = PAGE + body - data;
  *map_len = len;
  return base;
}

HK_EXPORT void hk_emu_region_free(void* base, uint64_t map_len) { munmap(base, map_len); }

HK_EXPORT int hk_emu_launch_kernel(hk_emu_launch* L) {
  std::lock_guard<std::mutex> guard(g_launch_mutex);
  auto fail = [&](const char* fmt, auto... args) {
    if (L->err && L->errcap) snprintf(L->err, L->errcap, fmt, args...);
    return 1;
  };
  if (L->abi != HK_EMU_ABI) return fail("ABI mismatch: launch %u, runtime %u", L->abi, (unsigned)HK_EMU_ABI);
  uint64_t nthreads = (uint64_t)L->block[0] * L->block[1] * L->block[2];
  uint64_t nblocks = (uint64_t)L->grid[0] * L->grid[1] * L->grid[2];
  if (nthreads == 0 || nthreads > MAX_LANES)
    return fail("kernel '%s': block (%u,%u,%u) has %lu work-items; AMD allows 1..1024", L->kernel, L->block[0],
                L->block[1], L->block[2], (unsigned long)nthreads);
  if (nblocks == 0) return 0;
  if (L->nworkers == 0 || L->nworkers > 256) return fail("bad worker count %u", L->nworkers);
  for (uint32_t i = 0; i < L->nworkers; ++i) {
    const hk_emu_module_info* m = L->mods[i];
    uint64_t s = m->lds_lo ? (uint64_t)(m->lds_hi - m->lds_lo) : 0;
    if (s + L->dyn_lds > L->lds_limit)
      return fail("kernel '%s' needs %lu bytes of static LDS + %u bytes of dynamic LDS = %lu bytes, more than the "
                  "%u bytes of LDS a workgroup can have on gfx%u",
                  L->kernel, (unsigned long)s, L->dyn_lds, (unsigned long)(s + L->dyn_lds), L->lds_limit, L->arch);
    if (L->dyn_lds + PAGE > m->dyn_cap) return fail("dynamic LDS of %u bytes exceeds the emulator's window", L->dyn_lds);
  }
  while (g_workers.size() < L->nworkers) g_workers.push_back(make_worker((int)g_workers.size()));
  uint32_t nw = L->nworkers;
  if (nw > nblocks) nw = (uint32_t)nblocks;
  g_next_block.store(0);
  g_abort.store(false);
  g_err_block = ~0ull;
  g_err.clear();
  uint64_t t0 = now_ns();
  g_timed_out.store(false);
  install_handlers();
  std::vector<std::thread> threads;
  for (uint32_t i = 1; i < nw; ++i) threads.emplace_back(worker_main, (int)i, L);
  // Watchdog: at the deadline, interrupt workers stuck inside a lane (loops without sync points).
  std::mutex wd_m;
  std::condition_variable wd_cv;
  bool finished = false;
  std::thread watchdog;
  if (L->timeout_ms) {
    watchdog = std::thread([&] {
      std::unique_lock<std::mutex> lk(wd_m);
      if (wd_cv.wait_for(lk, std::chrono::milliseconds(L->timeout_ms), [&] { return finished; })) return;
      g_timed_out.store(true);
      while (!finished) {
        {
          std::lock_guard<std::mutex> g(g_wd_mutex);
          for (uint32_t i = 0; i < nw; ++i)
            if (g_workers[i]->alive) pthread_kill(g_workers[i]->thread, WATCHDOG_SIG);
        }
        wd_cv.wait_for(lk, std::chrono::milliseconds(50), [&] { return finished; });
      }
    });
  }
  worker_main(0, L);
  for (auto& t : threads) t.join();
  if (watchdog.joinable()) {
    {
      std::lock_guard<std::mutex> lk(wd_m);
      finished = true;
    }
    wd_cv.notify_all();
    watchdog.join();
  }
  restore_handlers();
  memset(L->stats, 0, sizeof L->stats);
  for (uint32_t i = 0; i < nw; ++i) {
    Worker* w = g_workers[i];
    L->stats[HK_EMU_S_BLOCKS] += w->st_blocks;
    L->stats[HK_EMU_S_XLANE] += w->st_xlane;
    L->stats[HK_EMU_S_BARRIERS] += w->st_barrier;
    L->stats[HK_EMU_S_SWITCHES] += w->st_switch;
    L->stats[HK_EMU_S_LDS_ACCESSES] += w->st_lds;
  }
  L->stats[HK_EMU_S_NS] = now_ns() - t0;
  if (g_abort.load()) {
    if (L->err && L->errcap) {
      size_t n = g_err.size() < L->errcap ? g_err.size() : L->errcap;
      memcpy(L->err, g_err.data(), n);
      L->err[L->errcap - 1] = 0;
    }
    return 2;
  }
  return 0;
}
