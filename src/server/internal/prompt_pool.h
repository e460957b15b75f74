#pragma once

#include <pthread.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace msinfer::server {

// Threads that render chat templates and tokenize prompts for the event loop
// (a long prompt must not hold up other connections or /health). Jobs run in
// the order given; the destructor drops jobs not yet started and joins.
class PromptPool {
 public:
  explicit PromptPool(int threads) {
    for (int i = 0; i < std::max(threads, 1); ++i) {
      threads_.emplace_back([this] {
        ::pthread_setname_np(::pthread_self(), "msinfer-prompt");
        work();
      });
    }
  }
  ~PromptPool() {
    std::deque<std::function<void()>> dropped;
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
      dropped.swap(jobs_);
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  void run(std::function<void()> job) {
    {
      std::lock_guard<std::mutex> l(mu_);
      jobs_.push_back(std::move(job));
    }
    cv_.notify_one();
  }

 private:
  void work() {
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [this] { return stop_ || !jobs_.empty(); });
        if (stop_) return;
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      job();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;  // GUARDED_BY(mu_)
  bool stop_ = false;                       // GUARDED_BY(mu_)
  std::vector<std::thread> threads_;
};

}  // namespace msinfer::server
