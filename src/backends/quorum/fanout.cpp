#include "backends/quorum/fanout.hpp"

#include <system_error>

#include "util/error.hpp"

namespace fencerun::lease {

struct Fanout::Worker {
  explicit Worker(const redis::RedisEndpoint& endpoint) : client(endpoint) {}

  void run() {
    std::unique_lock lock(mutex);
    for (;;) {
      cv.wait(lock, [this] { return stopping || !tasks.empty(); });
      if (tasks.empty()) return;  // stopping, nothing left
      auto task = std::move(tasks.front());
      tasks.pop_front();
      lock.unlock();
      task(client);
      lock.lock();
    }
  }

  redis::Client client;  // used by the worker thread only
  std::mutex mutex;
  std::condition_variable cv;
  std::deque<std::function<void(redis::Client&)>> tasks;
  bool stopping = false;
  std::thread thread;
};

Fanout::Fanout(const std::vector<redis::RedisEndpoint>& endpoints) {
  for (const auto& endpoint : endpoints) {
    m_workers.push_back(std::make_unique<Worker>(endpoint));
    try {
      Worker* w = m_workers.back().get();
      w->thread = std::thread([w] { w->run(); });
    } catch (const std::system_error& e) {
      stop();
      throw SystemError("cannot start a thread for a quorum server", e.code().value());
    }
  }
}

Fanout::~Fanout() { stop(); }

void Fanout::stop() {
  for (auto& w : m_workers) {
    {
      std::lock_guard lock(w->mutex);
      w->stopping = true;
    }
    w->cv.notify_all();
  }
  for (auto& w : m_workers)
    if (w->thread.joinable()) w->thread.join();
}

void Fanout::post(std::size_t i, std::function<void(redis::Client&)> task) {
  Worker& w = *m_workers[i];
  {
    std::lock_guard lock(w.mutex);
    w.tasks.push_back(std::move(task));
  }
  w.cv.notify_all();
}

}  // namespace fencerun::lease
