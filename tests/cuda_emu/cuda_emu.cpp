// The CUDA emulator's runtime (interface and schedules: cuda_emu.h). What it checks, each a fault
// that fails the launch (cudaErrorLaunchFailure from cudaGetLastError, cudaDeviceSynchronize and
// cudaMemcpy until clear_fault(), like a device's sticky error) with a message on stderr:
//   - __syncthreads: every live thread of the block waits at the same call site; one that waits at
//     another site, or has exited, is named with both source lines;
//   - __shfl*_sync / __syncwarp: the calling lane is in the mask, every lane of the mask exists and
//     arrives at the same call site with the same mask, kind and width; a lane that reads a lane
//     outside the mask is an error;
//   - launch configuration: block <= 1024 threads (1024 x 1024 x 64), grid <= 2^31-1 x 65535 x
//     65535 (cudaErrorInvalidConfiguration); dynamic shared memory <= 48 KiB unless the kernel
//     opted in with cudaFuncSetAttribute(MaxDynamicSharedMemorySize) up to the ceiling
//     (cudaErrorInvalidValue);
//   - memory: dynamic shared memory and cudaMalloc buffers are exact-size (rounded up to 16 and 256
//     bytes, their alignment) and end at an inaccessible page, so an access past the end stops the
//     process with a message naming the kernel, block and thread (SIGSEGV); the rounding slack is a
//     canary checked after each block and launch; both are filled with 0xff bytes (NaN in fp32,
//     fp16 and bf16), so a read before a write shows; cudaMemcpy checks that its device side lies
//     inside one cudaMalloc buffer.
// The thread engine (POSENC_CUDA_EMU_SCHEDULE=threads): one OS thread per CUDA thread of the block,
// started per launch and reused for its blocks. Every synchronization goes through one lock of the
// block that holds the same state the fiber engine's scheduler keeps (each thread's wait, call
// site, mask, value), so the same settle functions check and complete barriers and warp rendezvous;
// a thread sleeps on its own semaphore until released; a fault wakes every thread, which
// leaves the kernel by an exception (BlockStopped) at its next synchronization point. For
// ThreadSanitizer the lock gives no happens-before (its sync and accesses are ignored through the
// TSan annotations, looked up as weak symbols so an uninstrumented binary needs nothing); the
// edges a GPU gives are made explicitly instead: a barrier releases into one of two alternating
// objects at arrival and acquires it after, a warp rendezvous the same with two objects per warp
// (acquiring both: never an edge missing, at worst one a fast lane added early), and blocks follow
// one another (the launching thread releases each block's start and acquires its end). So removing
// a __syncthreads leaves accesses of two warps unordered, which TSan reports.
// Fibers: each CUDA thread starts on its own stack through makecontext/setcontext (glibc
// ucontext); afterwards they switch with _setjmp/_longjmp, which unlike swapcontext do not save the
// signal mask with a system call (50x faster here). _FORTIFY_SOURCE would turn _longjmp into
// __longjmp_chk, which refuses to jump to another stack: it is off in this file.
#undef _FORTIFY_SOURCE
#include "cuda_emu.h"

#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <semaphore>
#include <sstream>
#include <thread>

// ThreadSanitizer's interface (libtsan; null when the binary is not linked with -fsanitize=thread)
extern "C" {
void __tsan_acquire(void* address) __attribute__((weak));
void __tsan_release(void* address) __attribute__((weak));
void AnnotateIgnoreSyncBegin(const char* file, int line) __attribute__((weak));
void AnnotateIgnoreSyncEnd(const char* file, int line) __attribute__((weak));
void AnnotateIgnoreReadsBegin(const char* file, int line) __attribute__((weak));
void AnnotateIgnoreReadsEnd(const char* file, int line) __attribute__((weak));
void AnnotateIgnoreWritesBegin(const char* file, int line) __attribute__((weak));
void AnnotateIgnoreWritesEnd(const char* file, int line) __attribute__((weak));
}

namespace posenc::cuda_emu {

namespace detail {
thread_local const ThreadCoordinates* current = nullptr;
}

namespace {

constexpr unsigned char kFill = 0xff;    // NaN in every float format
constexpr unsigned char kCanary = 0xa5;  // the rounding slack past an allocation's end
constexpr size_t kStackBytes = 256 * 1024;
constexpr int kWarpSize = 32;

enum class Schedule { kLockstep, kWarpSerial, kReverse, kLockstepReverse, kThreads };
enum class Wait { kReady, kBarrier, kShuffle, kSyncwarp, kDone, kFaulted };

[[noreturn]] void die(const std::string& message) {
  std::fprintf(stderr, "posenc cuda_emu: %s\n", message.c_str());
  std::abort();
}

size_t page_size() {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

size_t round_up(size_t x, size_t to) { return (x + to - 1) / to * to; }

// A region whose usable part [user, user + bytes) ends at an inaccessible page.
struct GuardedRegion {
  char* map = nullptr;
  size_t map_bytes = 0;
  char* user = nullptr;
  size_t bytes = 0;    // requested
  size_t rounded = 0;  // bytes rounded up to the alignment; [bytes, rounded) is the canary
  char* guard() const { return map + map_bytes - page_size(); }
};

GuardedRegion map_guarded(size_t bytes, size_t alignment) {
  GuardedRegion r;
  r.bytes = bytes;
  r.rounded = round_up(bytes, alignment);
  r.map_bytes = round_up(r.rounded, page_size()) + page_size();
  void* p = mmap(nullptr, r.map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return GuardedRegion{};
  r.map = static_cast<char*>(p);
  if (mprotect(r.guard(), page_size(), PROT_NONE) != 0) die("mprotect failed");
  r.user = r.guard() - r.rounded;
  std::memset(r.user, kFill, r.bytes);
  std::memset(r.user + r.bytes, kCanary, r.rounded - r.bytes);
  return r;
}

void unmap(GuardedRegion& r) {
  if (r.map != nullptr) munmap(r.map, r.map_bytes);
  r = GuardedRegion{};
}

// The first byte of the slack that is not the canary, or -1.
int64_t broken_canary(const GuardedRegion& r) {
  for (size_t i = r.bytes; i < r.rounded; ++i)
    if (static_cast<unsigned char>(r.user[i]) != kCanary) return static_cast<int64_t>(i);
  return -1;
}

struct Fiber {
  ThreadCoordinates coordinates{};
  int linear = 0, warp = 0, lane = 0;
  jmp_buf context;
  ucontext_t boot;
  bool started = false;
  Wait wait = Wait::kReady;
  const char* file = nullptr;
  int line = 0;
  ShuffleKind kind = ShuffleKind::kIndex;
  unsigned mask = 0;
  int operand = 0, width = 32;
  uint64_t value = 0, result = 0;
  int barriers = 0, warp_operations = 0;  // passed in this block (the thread engine's TSan edges)
  bool parked = false;                    // the thread engine: it sleeps until posted
};

struct Stack {
  char* map = nullptr;  // [guard page | kStackBytes]
};

// ---- the emulator's state (one OS thread runs kernels at a time) --------------------------------
struct State {
  std::vector<Stack> stacks;
  std::vector<Fiber> fibers;
  int warps = 0, threads = 0;
  jmp_buf scheduler;
  void (*body)(void*) = nullptr;
  void* body_context = nullptr;
  const LaunchSite* site = nullptr;
  uint3 block{};
  std::string block_fault;  // set by a fiber or the scheduler: the block stops
  GuardedRegion shared;
  std::map<uintptr_t, GuardedRegion> allocations;  // by user pointer
  std::map<const void*, int> max_dynamic_shared;   // cudaFuncSetAttribute
  std::map<std::string, int64_t> launched;
  cudaError_t last_error = cudaSuccess;  // launch errors: returned once by cudaGetLastError
  cudaError_t fault = cudaSuccess;       // kernel faults: sticky until clear_fault()
  std::string fault_message;
  bool handlers_installed = false;
  // the thread engine
  bool threads_engine = false;  // this launch runs on it
  std::mutex mutex;             // every field of the block's fibers, block_fault and the below
  struct Wake {
    std::binary_semaphore semaphore{0};
  };
  std::unique_ptr<Wake[]> wake;  // one per CUDA thread: posted once for each release
  std::condition_variable block_finished;
  int finished = 0;  // threads done with the current block
  bool stop = false;
  // TSan's happens-before objects (addresses only)
  char barrier_edges[2] = {}, warp_edges[32][2] = {}, block_start = 0, block_end = 0;
};

// The OS thread's CUDA thread (fiber engine: the fiber that runs now; null outside a kernel).
thread_local Fiber* running = nullptr;

State& state() {
  static State s;
  return s;
}

std::string where(const char* file, int line) {
  const char* slash = std::strrchr(file, '/');
  return std::string(slash != nullptr ? slash + 1 : file) + ":" + std::to_string(line);
}

std::string describe(const Fiber& f) {
  std::ostringstream o;
  o << "thread " << f.linear << " (warp " << f.warp << ", lane " << f.lane << ")";
  return o.str();
}

std::string describe_wait(const Fiber& f) {
  switch (f.wait) {
    case Wait::kBarrier:
      return "waits at __syncthreads " + where(f.file, f.line);
    case Wait::kShuffle:
      return "waits at a warp shuffle " + where(f.file, f.line);
    case Wait::kSyncwarp:
      return "waits at __syncwarp " + where(f.file, f.line);
    case Wait::kDone:
      return "has exited";
    default:
      return "is running";
  }
}

// ---- SIGSEGV/SIGBUS: name the kernel, block and thread, and which guard page was hit ------------
void on_fault_signal(int signal, siginfo_t* info, void*) {
  State& s = state();
  const char* address = static_cast<const char*>(info->si_addr);
  const char* what = "an address the kernel does not own";
  if (s.shared.map != nullptr && address >= s.shared.guard() &&
      address < s.shared.guard() + page_size())
    what = "past the end of the block's dynamic shared memory";
  for (const auto& [user, r] : s.allocations)
    if (address >= r.guard() && address < r.guard() + page_size())
      what = "past the end of a cudaMalloc buffer";
  char line[512];
  const Fiber* f = running;
  const int n = std::snprintf(
      line, sizeof line,
      "posenc cuda_emu: signal %d: access %s (address %p) in kernel %s launched at %s:%d, "
      "block (%u, %u, %u), thread %d\n",
      signal, what, info->si_addr, s.site != nullptr ? s.site->name : "(none)",
      s.site != nullptr ? s.site->file : "", s.site != nullptr ? s.site->line : 0, s.block.x,
      s.block.y, s.block.z, f != nullptr ? f->linear : -1);
  if (n > 0) (void)!write(2, line, static_cast<size_t>(std::min<int>(n, sizeof line - 1)));
  ::signal(signal, SIG_DFL);
  raise(signal);
}

void install_handlers(State& s) {
  if (s.handlers_installed) return;
  s.handlers_installed = true;
  static std::vector<char> alternate(256 * 1024);
  stack_t st{};
  st.ss_sp = alternate.data();
  st.ss_size = alternate.size();
  sigaltstack(&st, nullptr);
  struct sigaction sa {};
  sa.sa_sigaction = on_fault_signal;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGSEGV, &sa, nullptr);
  sigaction(SIGBUS, &sa, nullptr);
}

// ---- fibers
// --------------------------------------------------------------------------------------
void fiber_entry() {
  State& s = state();
  s.body(s.body_context);
  running->wait = Wait::kDone;
  _longjmp(s.scheduler, 1);
}

// Runs `f` until it waits, exits or faults.
void resume(Fiber& f) {
  State& s = state();
  running = &f;
  detail::current = &f.coordinates;
  if (_setjmp(s.scheduler) == 0) {
    if (!f.started) {
      f.started = true;
      setcontext(&f.boot);
    }
    _longjmp(f.context, 1);
  }
  detail::current = nullptr;
  running = nullptr;
}

// Called on a fiber: back to the scheduler until released.
void yield(Fiber& f) {
  if (_setjmp(f.context) == 0) _longjmp(state().scheduler, 1);
  detail::current = &f.coordinates;
}

Fiber& running_fiber(const char* what, const char* file, int line) {
  Fiber* f = running;
  if (f == nullptr) die(std::string(what) + " outside a kernel at " + where(file, line));
  return *f;
}

// The thread engine's way out of a kernel once its block faulted (caught by the thread's loop).
struct BlockStopped {};

// The thread engine's own synchronization, which TSan does not see: no happens-before from it, no
// reports on its state (the edges a GPU gives are made with tsan_release/tsan_acquire).
struct IgnoreForTsan {
  IgnoreForTsan() {
    if (AnnotateIgnoreSyncBegin == nullptr) return;
    AnnotateIgnoreSyncBegin(__FILE__, __LINE__);
    AnnotateIgnoreReadsBegin(__FILE__, __LINE__);
    AnnotateIgnoreWritesBegin(__FILE__, __LINE__);
  }
  ~IgnoreForTsan() {
    if (AnnotateIgnoreSyncEnd == nullptr) return;
    AnnotateIgnoreWritesEnd(__FILE__, __LINE__);
    AnnotateIgnoreReadsEnd(__FILE__, __LINE__);
    AnnotateIgnoreSyncEnd(__FILE__, __LINE__);
  }
};

// The block's lock (the ignoring constructed before it is taken, ended after it is released).
class EngineLock {
 public:
  explicit EngineLock(State& s) : ignore_(), lock_(s.mutex) {}
  std::unique_lock<std::mutex>& lock() { return lock_; }

 private:
  IgnoreForTsan ignore_;
  std::unique_lock<std::mutex> lock_;
};

// Threads to post after the lock is released (a woken thread then need not wait for the lock).
struct ToWake {
  int count = 0;
  int linear[1024];
};

void tsan_release(void* address) {
  if (__tsan_release != nullptr) __tsan_release(address);
}
void tsan_acquire(void* address) {
  if (__tsan_acquire != nullptr) __tsan_acquire(address);
}

// Thread engine, under the lock: the parked threads that may proceed (all of them after a fault).
void collect_released(State& s, ToWake& to_wake) {
  const bool fault = !s.block_fault.empty();
  for (Fiber& g : s.fibers) {
    if (g.parked && (fault || g.wait == Wait::kReady)) {
      g.parked = false;
      to_wake.linear[to_wake.count++] = g.linear;
    }
  }
}

// After the lock is released.
void post(State& s, const ToWake& to_wake) {
  IgnoreForTsan ignore;
  for (int i = 0; i < to_wake.count; ++i) s.wake[to_wake.linear[i]].semaphore.release();
}

// A fault found on a fiber: the block stops at once.
[[noreturn]] void fiber_fault(Fiber& f, const std::string& message) {
  State& s = state();
  if (s.threads_engine) {
    ToWake to_wake;
    {
      EngineLock lock(s);
      if (s.block_fault.empty()) s.block_fault = message;
      f.wait = Wait::kFaulted;
      collect_released(s, to_wake);
    }
    post(s, to_wake);
    throw BlockStopped{};
  }
  s.block_fault = message;
  f.wait = Wait::kFaulted;
  _longjmp(s.scheduler, 1);
}

int warp_size_of(const State& s, int warp) {
  return std::min(kWarpSize, s.threads - warp * kWarpSize);
}

// After `f` stopped: completes the warp rendezvous it waits at once no lane of the mask can still
// arrive, or records why the rendezvous can never complete.
void settle_warp(State& s, const Fiber& f) {
  Fiber* warp = &s.fibers[static_cast<size_t>(f.warp) * kWarpSize];
  const int lanes = warp_size_of(s, f.warp);
  auto check_group = [&](const Fiber& first) {
    for (int l = 0; l < lanes; ++l)
      if ((first.mask >> l & 1u) && warp[l].wait == Wait::kReady) return;  // not yet
    const char* name = first.wait == Wait::kShuffle ? "warp shuffle" : "__syncwarp";
    for (int l = 0; l < lanes; ++l) {
      if (!(first.mask >> l & 1u)) continue;
      const Fiber& g = warp[l];
      if (g.wait != first.wait || g.file != first.file || g.line != first.line) {
        s.block_fault = std::string("divergent ") + name + ": " + describe(first) + " waits at " +
                        where(first.file, first.line) + ", " + describe(g) + " (in its mask) " +
                        describe_wait(g);
        return;
      }
      if (g.mask != first.mask || g.kind != first.kind || g.width != first.width) {
        std::ostringstream o;
        o << name << " at " << where(first.file, first.line) << ": " << describe(first)
          << " has mask 0x" << std::hex << first.mask << ", " << describe(g) << " 0x" << g.mask
          << std::dec << " (kind or width may differ too)";
        s.block_fault = o.str();
        return;
      }
    }
    for (int l = 0; l < lanes; ++l) {
      if (!(first.mask >> l & 1u)) continue;
      Fiber& g = warp[l];
      if (g.wait == Wait::kShuffle) {
        const int w = g.width, segment = l / w * w;
        int source = l;
        switch (g.kind) {
          case ShuffleKind::kIndex:
            source = segment + ((g.operand % w) + w) % w;
            break;
          case ShuffleKind::kXor:
            source = l ^ g.operand;
            if (source >= kWarpSize || source / w > l / w) source = l;
            break;
          case ShuffleKind::kUp:
            source = l % w >= g.operand ? l - g.operand : l;
            break;
          case ShuffleKind::kDown:
            source = l % w + g.operand < w ? l + g.operand : l;
            break;
        }
        if (source < 0 || source >= lanes || !(first.mask >> source & 1u)) {
          s.block_fault = "warp shuffle at " + where(g.file, g.line) + ": " + describe(g) +
                          " reads lane " + std::to_string(source) + ", which is not in the mask";
          return;
        }
        g.result = warp[source].value;
      }
    }
    for (int l = 0; l < lanes; ++l)
      if (first.mask >> l & 1u) warp[l].wait = Wait::kReady;
  };
  if (f.wait == Wait::kShuffle || f.wait == Wait::kSyncwarp) {
    check_group(f);
    return;
  }
  // f waits at a barrier or exited: a rendezvous of its warp that includes it can never complete
  for (int l = 0; l < lanes && s.block_fault.empty(); ++l) {
    const Fiber& g = warp[l];
    if ((g.wait == Wait::kShuffle || g.wait == Wait::kSyncwarp) && (g.mask >> f.lane & 1u))
      check_group(g);
  }
}

// Nothing can run: every live thread waits at a barrier. Release it, or record the divergence.
void settle_barrier(State& s) {
  const Fiber* waiting = nullptr;
  const Fiber* exited = nullptr;
  for (const Fiber& f : s.fibers) {
    if (f.wait == Wait::kDone) {
      exited = exited != nullptr ? exited : &f;
      continue;
    }
    if (f.wait != Wait::kBarrier) {
      s.block_fault = "deadlock: " + describe(f) + " " + describe_wait(f);
      return;
    }
    if (waiting == nullptr) {
      waiting = &f;
    } else if (f.file != waiting->file || f.line != waiting->line) {
      s.block_fault = "divergent __syncthreads: " + describe(*waiting) + " waits at " +
                      where(waiting->file, waiting->line) + ", " + describe(f) + " at " +
                      where(f.file, f.line);
      return;
    }
  }
  if (waiting == nullptr) return;  // all exited
  if (exited != nullptr) {
    s.block_fault = "divergent __syncthreads: " + describe(*waiting) + " waits at " +
                    where(waiting->file, waiting->line) + ", " + describe(*exited) +
                    " has exited without reaching it";
    return;
  }
  for (Fiber& f : s.fibers) f.wait = Wait::kReady;
}

// ---- the thread engine --------------------------------------------------------------------------

// Under the lock, after `f` stopped (waits, exited): completes what its arrival completes, as the
// fiber scheduler does after each step, and collects the parked threads that may proceed.
void settle_after(State& s, const Fiber& f, ToWake& to_wake) {
  if (s.block_fault.empty()) settle_warp(s, f);
  if (s.block_fault.empty()) {
    bool any_running = false;
    for (const Fiber& g : s.fibers) any_running = any_running || g.wait == Wait::kReady;
    if (!any_running) settle_barrier(s);  // every live thread waits: a barrier, or a divergence
  }
  collect_released(s, to_wake);
}

// `f` arrives at a barrier (barrier) or a warp rendezvous with its fields set by `arrive` (under
// the lock) and sleeps until released; returns its shuffle result. TSan: released into this
// rendezvous's object before, acquired after (see the top of this file).
template <typename Arrive>
uint64_t thread_rendezvous(Fiber& f, bool barrier, Arrive&& arrive) {
  State& s = state();
  char* const edges = barrier ? s.barrier_edges : s.warp_edges[f.warp];
  tsan_release(edges + ((barrier ? f.barriers : f.warp_operations) & 1));
  ToWake to_wake;
  bool parked = false, stopped = false;
  uint64_t result = 0;
  {
    EngineLock lock(s);
    arrive();
    settle_after(s, f, to_wake);
    parked = f.parked = f.wait != Wait::kReady && s.block_fault.empty();
    stopped = f.wait != Wait::kReady;  // unless parked: a fault
    result = f.result;
  }
  post(s, to_wake);
  if (parked) {
    IgnoreForTsan ignore;
    s.wake[f.linear].semaphore.acquire();
    // whoever posted set these before (a fault leaves f waiting); nothing else writes them now
    stopped = f.wait != Wait::kReady;
    result = f.result;
  }
  if (stopped) throw BlockStopped{};
  if (barrier) {
    tsan_acquire(edges + (f.barriers++ & 1));
  } else {
    tsan_acquire(edges);
    tsan_acquire(edges + 1);
    ++f.warp_operations;
  }
  return result;
}

// One OS thread: runs CUDA thread `linear` of each block of the launch as the launching thread
// starts it, until told to stop.
void thread_main(int linear) {
  State& s = state();
  Fiber& f = s.fibers[static_cast<size_t>(linear)];
  running = &f;
  detail::current = &f.coordinates;
  for (;;) {
    {
      IgnoreForTsan ignore;
      s.wake[linear].semaphore.acquire();  // posted by the launching thread: a block, or stop
      if (s.stop) break;
    }
    tsan_acquire(&s.block_start);
    bool stopped = false;
    try {
      s.body(s.body_context);
    } catch (const BlockStopped&) {
      stopped = true;
    }
    tsan_release(&s.block_end);
    ToWake to_wake;
    {
      EngineLock lock(s);
      if (!stopped) {
        f.wait = Wait::kDone;
        settle_after(s, f, to_wake);
      }
      if (++s.finished == s.threads) s.block_finished.notify_one();
    }
    post(s, to_wake);
  }
  running = nullptr;
  detail::current = nullptr;
}

// Runs one block on the launch's threads (started by run_blocks_on_threads); false on a fault.
bool run_block_on_threads(State& s) {
  for (Fiber& f : s.fibers) {
    f.wait = Wait::kReady;
    f.barriers = f.warp_operations = 0;
    f.parked = false;
  }
  s.finished = 0;
  tsan_release(&s.block_start);
  {
    IgnoreForTsan ignore;
    for (int t = 0; t < s.threads; ++t) s.wake[t].semaphore.release();
  }
  bool ok = false;
  {
    EngineLock lock(s);
    while (s.finished < s.threads) s.block_finished.wait(lock.lock());
    ok = s.block_fault.empty();
  }
  tsan_acquire(&s.block_end);
  return ok;
}

Schedule schedule_from_environment() {
  const char* v = std::getenv("POSENC_CUDA_EMU_SCHEDULE");
  if (v == nullptr || *v == '\0' || std::strcmp(v, "lockstep") == 0) return Schedule::kLockstep;
  if (std::strcmp(v, "warp-serial") == 0) return Schedule::kWarpSerial;
  if (std::strcmp(v, "reverse") == 0) return Schedule::kReverse;
  if (std::strcmp(v, "lockstep-reverse") == 0) return Schedule::kLockstepReverse;
  if (std::strcmp(v, "threads") == 0) return Schedule::kThreads;
  die(std::string("POSENC_CUDA_EMU_SCHEDULE=") + v +
      ": expected lockstep, warp-serial, reverse, lockstep-reverse or threads");
}

// Runs one block to its end; returns false on a fault (in s.block_fault).
bool run_block(State& s, Schedule schedule) {
  static ucontext_t boot_template;
  static bool have_template = false;
  if (!have_template) {
    getcontext(&boot_template);
    have_template = true;
  }
  for (Fiber& f : s.fibers) {
    f.started = false;
    f.wait = Wait::kReady;
    f.boot = boot_template;
    f.boot.uc_stack.ss_sp = s.stacks[static_cast<size_t>(f.linear)].map + page_size();
    f.boot.uc_stack.ss_size = kStackBytes;
    f.boot.uc_link = nullptr;
    makecontext(&f.boot, fiber_entry, 0);
  }
  const bool reversed = schedule == Schedule::kReverse || schedule == Schedule::kLockstepReverse;
  const bool warp_serial = schedule == Schedule::kWarpSerial || schedule == Schedule::kReverse;
  auto step = [&](Fiber& f) {
    resume(f);
    if (!s.block_fault.empty()) return false;
    if (f.wait != Wait::kReady) settle_warp(s, f);
    return s.block_fault.empty();
  };
  for (;;) {
    bool ran = false;
    if (warp_serial) {
      for (int wi = 0; wi < s.warps; ++wi) {
        const int w = reversed ? s.warps - 1 - wi : wi;
        const int lanes = warp_size_of(s, w);
        for (bool again = true; again;) {
          again = false;
          for (int li = 0; li < lanes; ++li) {
            Fiber& f =
                s.fibers[static_cast<size_t>(w * kWarpSize + (reversed ? lanes - 1 - li : li))];
            if (f.wait != Wait::kReady) continue;
            again = ran = true;
            if (!step(f)) return false;
          }
        }
      }
    } else {
      for (int ti = 0; ti < s.threads; ++ti) {
        Fiber& f = s.fibers[static_cast<size_t>(reversed ? s.threads - 1 - ti : ti)];
        if (f.wait != Wait::kReady) continue;
        ran = true;
        if (!step(f)) return false;
      }
    }
    if (ran) continue;
    bool all_done = true;
    for (const Fiber& f : s.fibers) all_done = all_done && f.wait == Wait::kDone;
    if (all_done) return true;
    settle_barrier(s);
    if (!s.block_fault.empty()) return false;
  }
}

void record_fault(State& s, const std::string& message) {
  s.fault = cudaErrorLaunchFailure;
  s.fault_message = message;
  std::fprintf(stderr, "posenc cuda_emu: %s\n", message.c_str());
}

std::string launch_description(const LaunchSite& site, uint3 block) {
  std::ostringstream o;
  o << site.name << " (launched at " << where(site.file, site.line) << "), block (" << block.x
    << ", " << block.y << ", " << block.z << ")";
  return o.str();
}

void check_canaries(State& s, const LaunchSite& site) {
  for (const auto& [user, r] : s.allocations) {
    const int64_t at = broken_canary(r);
    if (at >= 0 && s.fault == cudaSuccess)
      record_fault(s, site.name + std::string(": wrote byte ") + std::to_string(at) +
                          " of a cudaMalloc buffer of " + std::to_string(r.bytes) + " bytes");
  }
}

const GuardedRegion* find_allocation(const State& s, const void* p, size_t bytes) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  auto it = s.allocations.upper_bound(address);
  if (it == s.allocations.begin()) return nullptr;
  --it;
  const GuardedRegion& r = it->second;
  return address + bytes <= it->first + r.bytes ? &r : nullptr;
}

}  // namespace

const ThreadCoordinates& detail::outside_kernel() {
  die("threadIdx/blockIdx/blockDim/gridDim read outside a kernel");
}

// ---- synchronization ---------------------------------------------------------------------------
void syncthreads(const char* file, int line) {
  Fiber& f = running_fiber("__syncthreads", file, line);
  auto arrive = [&] {
    f.wait = Wait::kBarrier;
    f.file = file;
    f.line = line;
  };
  if (state().threads_engine) {
    thread_rendezvous(f, true, arrive);
    return;
  }
  arrive();
  yield(f);
}

void syncwarp(const char* file, int line, unsigned mask) {
  Fiber& f = running_fiber("__syncwarp", file, line);
  if (!(mask >> f.lane & 1u))
    fiber_fault(
        f, "__syncwarp at " + where(file, line) + ": " + describe(f) + " is not in its own mask");
  auto arrive = [&] {
    f.wait = Wait::kSyncwarp;
    f.file = file;
    f.line = line;
    f.mask = mask;
    f.kind = ShuffleKind::kIndex;
    f.width = 32;
  };
  if (state().threads_engine) {
    thread_rendezvous(f, false, arrive);
    return;
  }
  arrive();
  yield(f);
}

uint64_t shuffle(const char* file, int line, ShuffleKind kind, unsigned mask, uint64_t value,
                 int operand, int width) {
  Fiber& f = running_fiber("a warp shuffle", file, line);
  if (!(mask >> f.lane & 1u))
    fiber_fault(
        f, "warp shuffle at " + where(file, line) + ": " + describe(f) + " is not in its own mask");
  if (width < 1 || width > kWarpSize || (width & (width - 1)) != 0)
    fiber_fault(f, "warp shuffle at " + where(file, line) + ": width " + std::to_string(width) +
                       " is not a power of 2 up to 32");
  const int lanes = warp_size_of(state(), f.warp);
  if (lanes < kWarpSize && (mask >> lanes) != 0)
    fiber_fault(f, "warp shuffle at " + where(file, line) + ": the mask names lanes past the " +
                       std::to_string(lanes) + " threads of warp " + std::to_string(f.warp));
  auto arrive = [&] {
    f.wait = Wait::kShuffle;
    f.file = file;
    f.line = line;
    f.kind = kind;
    f.mask = mask;
    f.value = value;
    f.operand = operand;
    f.width = width;
  };
  if (state().threads_engine) return thread_rendezvous(f, false, arrive);
  arrive();
  yield(f);
  return f.result;
}

// ---- launches ----------------------------------------------------------------------------------
std::string kernel_name_from(const char* pretty_function) {
  std::string s = pretty_function;
  const auto eq = s.find("Kernel = ");
  if (eq == std::string::npos) return s;
  s = s.substr(eq + 9);
  const auto end = s.rfind(']');
  if (end != std::string::npos) s = s.substr(0, end);
  if (!s.empty() && s[0] == '&') s = s.substr(1);
  const auto open = s.find('<');
  const auto scope = s.rfind("::", open);  // drop the namespaces
  if (scope != std::string::npos) s = s.substr(scope + 2);
  return s;
}

void* dynamic_shared_memory(size_t alignment) {
  State& s = state();
  if (running == nullptr) die("extern __shared__ memory used outside a kernel");
  if (reinterpret_cast<uintptr_t>(s.shared.user) % alignment != 0)
    die("dynamic shared memory misaligned for its type");
  return s.shared.user;
}

void launch(const LaunchSite& site, dim3 grid, dim3 block, size_t shared_bytes, void (*body)(void*),
            void* context) {
  State& s = state();
  if (running != nullptr) die("a kernel launched from a kernel (dynamic parallelism)");
  if (s.fault != cudaSuccess) return;  // the device is faulted: nothing runs
  const uint64_t threads = uint64_t{block.x} * block.y * block.z;
  if (block.x == 0 || block.y == 0 || block.z == 0 || block.x > 1024 || block.y > 1024 ||
      block.z > 64 || threads > 1024 || grid.x == 0 || grid.y == 0 || grid.z == 0 ||
      grid.x > 0x7fffffffu || grid.y > 65535 || grid.z > 65535) {
    s.last_error = cudaErrorInvalidConfiguration;
    return;
  }
  size_t limit = kSharedMemoryDefaultLimit;
  const auto opted = s.max_dynamic_shared.find(site.kernel);
  if (opted != s.max_dynamic_shared.end()) limit = static_cast<size_t>(opted->second);
  if (shared_bytes > limit) {
    s.last_error = cudaErrorInvalidValue;
    return;
  }
  install_handlers(s);
  ++s.launched[site.name];
  while (s.stacks.size() < threads) {
    void* p = mmap(nullptr, kStackBytes + page_size(), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) die("cannot map a fiber stack");
    mprotect(p, page_size(), PROT_NONE);  // below the stack: an overflow faults
    s.stacks.push_back(Stack{static_cast<char*>(p)});
  }
  s.threads = static_cast<int>(threads);
  s.warps = (s.threads + kWarpSize - 1) / kWarpSize;
  s.fibers.assign(threads, Fiber{});
  for (int t = 0; t < s.threads; ++t) {
    Fiber& f = s.fibers[static_cast<size_t>(t)];
    f.linear = t;
    f.warp = t / kWarpSize;
    f.lane = t % kWarpSize;
    f.coordinates.thread_idx =
        uint3{static_cast<unsigned>(t) % block.x, static_cast<unsigned>(t) / block.x % block.y,
              static_cast<unsigned>(t) / (block.x * block.y)};
    f.coordinates.block_dim = block;
    f.coordinates.grid_dim = grid;
  }
  s.shared = map_guarded(shared_bytes, 16);
  if (s.shared.map == nullptr) die("cannot map shared memory");
  s.body = body;
  s.body_context = context;
  s.site = &site;
  const Schedule schedule = schedule_from_environment();
  const bool reversed = schedule == Schedule::kReverse;
  const uint64_t blocks = uint64_t{grid.x} * grid.y * grid.z;
  std::vector<std::thread> os_threads;
  if (schedule == Schedule::kThreads) {
    s.threads_engine = true;
    s.wake = std::make_unique<State::Wake[]>(threads);
    s.stop = false;
    for (int t = 0; t < s.threads; ++t) os_threads.emplace_back(thread_main, t);
  }
  for (uint64_t bi = 0; bi < blocks; ++bi) {
    const uint64_t b = reversed ? blocks - 1 - bi : bi;
    s.block = uint3{static_cast<unsigned>(b % grid.x), static_cast<unsigned>(b / grid.x % grid.y),
                    static_cast<unsigned>(b / (uint64_t{grid.x} * grid.y))};
    for (Fiber& f : s.fibers) f.coordinates.block_idx = s.block;
    std::memset(s.shared.user, kFill, s.shared.bytes);
    s.block_fault.clear();
    if (!(s.threads_engine ? run_block_on_threads(s) : run_block(s, schedule))) {
      record_fault(s, launch_description(site, s.block) + ": " + s.block_fault);
      break;
    }
    const int64_t at = broken_canary(s.shared);
    if (at >= 0) {
      record_fault(s, launch_description(site, s.block) + ": wrote byte " + std::to_string(at) +
                          " of dynamic shared memory of " + std::to_string(shared_bytes) +
                          " bytes");
      break;
    }
  }
  if (s.threads_engine) {
    s.stop = true;
    {
      IgnoreForTsan ignore;
      for (int t = 0; t < s.threads; ++t) s.wake[t].semaphore.release();
    }
    for (std::thread& t : os_threads) t.join();
    s.threads_engine = false;
    s.wake.reset();
  }
  check_canaries(s, site);
  unmap(s.shared);
  s.site = nullptr;
}

// ---- runtime API
// ---------------------------------------------------------------------------------
cudaError_t Malloc(void** pointer, size_t bytes) {
  if (pointer == nullptr) return cudaErrorInvalidValue;
  GuardedRegion r = map_guarded(bytes, 256);  // cudaMalloc's alignment
  if (r.map == nullptr) return cudaErrorMemoryAllocation;
  *pointer = r.user;
  state().allocations[reinterpret_cast<uintptr_t>(r.user)] = r;
  return cudaSuccess;
}

cudaError_t Free(void* pointer) {
  if (pointer == nullptr) return cudaSuccess;
  State& s = state();
  auto it = s.allocations.find(reinterpret_cast<uintptr_t>(pointer));
  if (it == s.allocations.end()) return cudaErrorInvalidValue;
  const int64_t at = broken_canary(it->second);
  if (at >= 0 && s.fault == cudaSuccess)
    record_fault(s, "cudaFree: byte " + std::to_string(at) + " of a buffer of " +
                        std::to_string(it->second.bytes) + " bytes was written");
  unmap(it->second);
  s.allocations.erase(it);
  return cudaSuccess;
}

cudaError_t Memcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  State& s = state();
  if (s.fault != cudaSuccess) return s.fault;
  const bool dst_device = find_allocation(s, dst, bytes) != nullptr;
  const bool src_device = find_allocation(s, src, bytes) != nullptr;
  bool ok = true;
  switch (kind) {
    case cudaMemcpyHostToDevice:
      ok = dst_device;
      break;
    case cudaMemcpyDeviceToHost:
      ok = src_device;
      break;
    case cudaMemcpyDeviceToDevice:
      ok = dst_device && src_device;
      break;
    case cudaMemcpyHostToHost:
    case cudaMemcpyDefault:
      break;
  }
  if (!ok) return cudaErrorInvalidValue;
  if (bytes > 0) std::memmove(dst, src, bytes);
  return cudaSuccess;
}

cudaError_t MemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                        cudaStream_t) {
  return Memcpy(dst, src, bytes, kind);
}

cudaError_t Memset(void* dst, int value, size_t bytes) {
  if (find_allocation(state(), dst, bytes) == nullptr) return cudaErrorInvalidValue;
  std::memset(dst, value, bytes);
  return cudaSuccess;
}

cudaError_t DeviceSynchronize() { return state().fault; }

cudaError_t GetDeviceCount(int* count) {
  if (count == nullptr) return cudaErrorInvalidValue;
  *count = 1;
  return cudaSuccess;
}

cudaError_t GetLastError() {
  State& s = state();
  if (s.fault != cudaSuccess) return s.fault;
  const cudaError_t e = s.last_error;
  s.last_error = cudaSuccess;
  return e;
}

cudaError_t PeekAtLastError() {
  const State& s = state();
  return s.fault != cudaSuccess ? s.fault : s.last_error;
}

const char* GetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "no error (emulated)";
    case cudaErrorInvalidValue:
      return "invalid argument (emulated)";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument (emulated)";
    case cudaErrorMemoryAllocation:
      return "out of memory (emulated)";
    case cudaErrorLaunchFailure:
      return "unspecified launch failure (emulated; see posenc::cuda_emu::last_fault())";
    default:
      return "error (emulated)";
  }
}

cudaError_t FuncSetAttributeRaw(const void* kernel, cudaFuncAttribute attribute, int value) {
  if (attribute != cudaFuncAttributeMaxDynamicSharedMemorySize)
    return cudaSuccess;  // the others do not change what the emulator runs
  if (value < 0 || static_cast<size_t>(value) > kSharedMemoryOptInCeiling)
    return cudaErrorInvalidValue;
  state().max_dynamic_shared[kernel] = value;
  return cudaSuccess;
}

cudaError_t StreamCreate(cudaStream_t* stream) {
  if (stream == nullptr) return cudaErrorInvalidValue;
  *stream = nullptr;
  return cudaSuccess;
}
cudaError_t StreamDestroy(cudaStream_t) { return cudaSuccess; }
cudaError_t StreamSynchronize(cudaStream_t) { return state().fault; }

std::vector<std::pair<std::string, int64_t>> launched_kernels() {
  const auto& m = state().launched;
  return {m.begin(), m.end()};
}

std::string last_fault() { return state().fault_message; }

void clear_fault() {
  State& s = state();
  s.fault = cudaSuccess;
  s.fault_message.clear();
  s.last_error = cudaSuccess;
}

}  // namespace posenc::cuda_emu
