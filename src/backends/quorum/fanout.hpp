#pragma once
// Fanout: one request to every server of a quorum at once. Each server has a worker thread of its own
// with its own connection, started once (not per request) and kept until the Fanout goes; a round
// hands each worker its request and gathers the replies until one deadline. A slow or frozen server
// delays nobody: the round ends at its deadline with that server's reply missing, and its worker
// finishes the request in flight within the same deadline (every redis::Client call is bounded).
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "backends/redis/client.hpp"
#include "util/clock.hpp"

namespace fencerun::lease {

class Fanout {
 public:
  // Starts a worker per endpoint. Throws SystemError when a thread cannot start.
  explicit Fanout(const std::vector<redis::RedisEndpoint>& endpoints);
  ~Fanout();  // stops the workers; each finishes its request in flight first, within its deadline
  Fanout(const Fanout&) = delete;
  Fanout& operator=(const Fanout&) = delete;

  std::size_t size() const { return m_workers.size(); }

  // The replies of a round so far, by server (nullopt: not yet).
  template <class T>
  using Replies = std::vector<std::optional<redis::Result<T>>>;

  // Runs `request(client, i)` for every server i at once and returns the replies by server once all
  // came, `enough` says the ones so far decide the round, or `until` passed; a missing reply is a
  // timeout error. `request` is copied to every worker and may outlive the call (a late worker still
  // runs it), so it must capture by value.
  template <class T>
  std::vector<redis::Result<T>> round(std::function<redis::Result<T>(redis::Client&, std::size_t)> request,
                                      Deadline until, std::function<bool(const Replies<T>&)> enough = {});

 private:
  struct Worker;
  void post(std::size_t i, std::function<void(redis::Client&)> task);
  void stop();

  std::vector<std::unique_ptr<Worker>> m_workers;
};

namespace detail {
// The replies of one round, shared with the workers (which may finish after the round gave up).
template <class T>
struct Gathered {
  explicit Gathered(std::size_t n) : replies(n) {}
  std::mutex mutex;
  std::condition_variable cv;
  Fanout::Replies<T> replies;
  std::size_t done = 0;
};
}  // namespace detail

template <class T>
std::vector<redis::Result<T>> Fanout::round(std::function<redis::Result<T>(redis::Client&, std::size_t)> request,
                                            Deadline until, std::function<bool(const Replies<T>&)> enough) {
  auto gathered = std::make_shared<detail::Gathered<T>>(size());
  for (std::size_t i = 0; i < size(); ++i)
    post(i, [gathered, request, i](redis::Client& client) {
      auto reply = request(client, i);
      std::lock_guard lock(gathered->mutex);
      gathered->replies[i] = std::move(reply);
      ++gathered->done;
      gathered->cv.notify_all();
    });
  std::vector<redis::Result<T>> out;
  std::unique_lock lock(gathered->mutex);
  // The condition variable waits on the steady clock, the deadline is on the boot clock: convert the
  // time left each time round.
  while (gathered->done < size() && !(enough && enough(gathered->replies))) {
    auto left = time_left(until);
    if (left <= BootClock::duration::zero()) break;
    gathered->cv.wait_for(lock, left);
  }
  for (auto& reply : gathered->replies)
    out.push_back(reply ? std::move(*reply)
                        : std::unexpected(redis::Error{redis::Error::Kind::timeout, "no reply within the round",
                                                       true}));
  return out;
}

}  // namespace fencerun::lease
