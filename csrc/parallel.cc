// The worker pool behind parallel_for: helper threads are created once and
// wait on a condition variable, so a call's helpers are already running on
// the other cores instead of being spawned (and placed) per call. In a process
// whose torch runs its ops on libgomp, the work can go to torch's OpenMP team
// instead (share_process_openmp, parallel.h).
#include "parallel.h"

#include <dlfcn.h>
#include <unistd.h>

#include <condition_variable>
#include <mutex>

namespace recstore {

namespace {

int default_threads() {
  unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}
std::atomic<int> g_threads{default_threads()};

class Pool {
 public:
  explicit Pool(int helpers) : pid_(getpid()) {
    for (int i = 0; i < helpers; ++i) workers_.emplace_back([this, i] { loop(i); });
  }

  int helpers() const { return static_cast<int>(workers_.size()); }
  pid_t pid() const { return pid_; }

  // Runs job on the caller and on up to `helpers` workers; returns when every
  // copy that started is done. One job at a time: a caller that finds the pool
  // busy runs alone. A job must finish its work whoever runs it (parallel_for's
  // blocks are claimed from a shared counter), so once the caller's own copy
  // returns, workers that have not picked the job up yet skip it: on a loaded
  // machine a descheduled worker would otherwise hold the caller for a time slice.
  bool try_run(int helpers, const std::function<void()>& job) {
    std::unique_lock<std::mutex> submit(submit_, std::try_to_lock);
    if (!submit.owns_lock()) return false;
    {
      std::lock_guard<std::mutex> lk(m_);
      job_ = &job;
      active_ = helpers;
      open_ = true;
      ++generation_;
    }
    wake_.notify_all();
    job();
    std::unique_lock<std::mutex> lk(m_);
    open_ = false;
    done_.wait(lk, [&] { return running_ == 0; });
    job_ = nullptr;
    return true;
  }

 private:
  void loop(int index) {
    uint64_t seen = 0;
    for (;;) {
      const std::function<void()>* job;
      {
        std::unique_lock<std::mutex> lk(m_);
        wake_.wait(lk, [&] { return generation_ != seen; });
        seen = generation_;
        if (index >= active_ || !open_) continue;
        job = job_;
        ++running_;
      }
      (*job)();
      std::lock_guard<std::mutex> lk(m_);
      if (--running_ == 0) done_.notify_one();
    }
  }

  const pid_t pid_;
  std::vector<std::thread> workers_;
  std::mutex submit_;
  std::mutex m_;
  std::condition_variable wake_, done_;
  const std::function<void()>* job_ = nullptr;
  uint64_t generation_ = 0;
  int active_ = 0;
  bool open_ = false;  // the job may still be picked up
  int running_ = 0;    // workers running the job now
};

std::mutex g_pool_mutex;
Pool* g_pool = nullptr;  // never destroyed: workers may outlive static destructors

Pool* pool_for(int helpers) {
  std::lock_guard<std::mutex> lk(g_pool_mutex);
  // A forked child inherits the pointer but not the threads: start a new pool.
  if (g_pool == nullptr || g_pool->pid() != getpid() || g_pool->helpers() < helpers)
    g_pool = new Pool(std::max(helpers, default_threads() - 1));
  return g_pool;
}

// libgomp's entry for `#pragma omp parallel` (its ABI since GCC 4.9): runs fn(data)
// on num_threads threads of the calling thread's team, the caller one of them.
using GompParallel = void (*)(void (*)(void*), void*, unsigned, unsigned);
std::atomic<GompParallel> g_gomp_parallel{nullptr};
std::atomic<pid_t> g_gomp_pid{0};  // a forked child has no team threads: it uses the pool

void run_job(void* job) { (*static_cast<const std::function<void()>*>(job))(); }

}  // namespace

bool share_process_openmp(bool share) {
  GompParallel entry = nullptr;
  if (share) {
    // Only a libgomp the process has loaded already (torch's): never a second runtime.
    if (void* gomp = dlopen("libgomp.so.1", RTLD_NOLOAD | RTLD_NOW)) {
      entry = reinterpret_cast<GompParallel>(dlsym(gomp, "GOMP_parallel"));
      dlclose(gomp);  // the process's own reference keeps it loaded
    }
  }
  g_gomp_pid.store(getpid());
  g_gomp_parallel.store(entry);
  return entry != nullptr;
}

namespace {

// libgomp's entry while sharing holds in this process (null: use the pool).
GompParallel shared_gomp() {
  GompParallel gomp = g_gomp_parallel.load(std::memory_order_relaxed);
  return gomp != nullptr && g_gomp_pid.load(std::memory_order_relaxed) == getpid() ? gomp
                                                                                    : nullptr;
}

}  // namespace

bool shares_process_openmp() { return shared_gomp() != nullptr; }

int num_threads() { return g_threads.load(std::memory_order_relaxed); }

void set_num_threads(int n) { g_threads.store(n <= 0 ? default_threads() : n); }

void start_pool() { pool_for(std::max(1, default_threads() - 1)); }

void run_on_pool(int helpers, const std::function<void()>& job) {
  GompParallel gomp = helpers > 0 ? shared_gomp() : nullptr;
  if (gomp != nullptr) {
    gomp(&run_job, const_cast<std::function<void()>*>(&job), static_cast<unsigned>(helpers + 1),
         0);
    return;
  }
  if (helpers <= 0 || !pool_for(helpers)->try_run(helpers, job)) job();
}

}  // namespace recstore
