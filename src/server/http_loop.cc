// The event loop's side of the engine's rounds (run, poll, anticipate,
// deliver, one batched submit per delivery) and the accepting of
// connections (limits, eviction of idle ones).
#include <sched.h>

#include <ctime>

#include "internal/server_impl.h"
#include "internal/session.h"

namespace msinfer::server {

double thread_cpu_s() {
  timespec t{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

void HttpServer::Impl::run_rounds() {
  {
    std::unique_lock<std::mutex> l(rounds_mu);
    running.swap(ready);
    posted = false;
    took_rounds(l);
  }
  deliver(running);
}

bool HttpServer::Impl::poll_rounds() {
  {
    std::unique_lock<std::mutex> l(rounds_mu);
    if (ready.empty()) return false;
    running.swap(ready);
    took_rounds(l);
  }
  deliver(running);
  return true;
}

void HttpServer::Impl::anticipate_loop() {
  using poll_clock = std::chrono::steady_clock;
  net::steady_timer alarm(ioc);
  while (!ioc.stopped()) {
    if (streams.empty() || round_gap.count() == 0) {
      ioc.run_one();
      continue;
    }
    const uint64_t seen = rounds_delivered;
    const auto due = last_round_at + round_gap;
    const auto wake_at = due - round_gap / 8;
    const auto give_up = due + round_gap / 2;
    if (poll_clock::now() > give_up) {
      // Late (a long step, or none coming): the engine thread posts it.
      while (rounds_delivered == seen && !streams.empty() && !ioc.stopped()) ioc.run_one();
      continue;
    }
    if (poll_clock::now() < wake_at) {
      // Sleep until then; sockets and early rounds are served meanwhile.
      alarm_rang = false;
      alarm.expires_at(wake_at);
      alarm.async_wait([this](beast::error_code) { alarm_rang = true; });
      while (!alarm_rang && rounds_delivered == seen && !ioc.stopped()) ioc.run_one();
      if (!alarm_rang) {
        alarm.cancel();
        while (!alarm_rang && !ioc.stopped()) ioc.run_one();  // its handler, cancelled
      }
      if (rounds_delivered != seen) continue;  // it came early
    }
    // Until the round comes; socket handlers run meanwhile.
    set_polling(true);
    IdleStretch stretch{*this};
    while (!ioc.stopped() && !streams.empty()) {
      if (rounds_waiting()) {
        stretch.work();
        poll_rounds();
        break;
      }
      if (ioc.poll() > 0) {
        stretch.work();
      } else {
        stretch.idle();
      }
      if (poll_clock::now() > give_up) break;
      ::sched_yield();  // a process sharing this cpu (a local client) runs
    }
    stretch.work();
    set_polling(false);
  }
}

void HttpServer::Impl::run_loop() {
  if (options.busy_poll.count() <= 0) {
    if (options.anticipate) {
      anticipate_loop();
    } else {
      ioc.run();
    }
    return;
  }
  using poll_clock = std::chrono::steady_clock;
  while (!ioc.stopped()) {
    if (streams.empty()) {
      ioc.run_one();  // sleeps until there is something to do
      continue;
    }
    // Streams in flight: the loop takes the engine's rounds itself and runs
    // the sockets' handlers without blocking. After busy_poll with nothing
    // to do, it sleeps again (a long step, or no stream left).
    set_polling(true);
    auto last_work = poll_clock::now();
    IdleStretch stretch{*this};
    bool idle = false;
    while (!streams.empty() && !ioc.stopped()) {
      const bool worked = ioc.poll() > 0 || poll_rounds();
      const auto now = poll_clock::now();
      if (worked) {
        stretch.work();
        last_work = now;
        continue;
      }
      stretch.idle();
      if (now - last_work > options.busy_poll) {
        idle = true;
        break;
      }
      ::sched_yield();  // a process sharing this cpu (a local client) runs
    }
    stretch.work();
    set_polling(false);
    if (idle) ioc.run_one();
  }
}

void HttpServer::Impl::deliver(std::vector<Round>& rounds) {
  batching = sender != nullptr && sender->broken().empty();
  for (Round& r : rounds) {
    if (r.flush || r.urgent) {
      if (last_round_at.time_since_epoch().count() != 0) {
        const auto gap = r.at - last_round_at;
        // Gaps of an idle engine (none in flight) are not its pace.
        if (gap > std::chrono::nanoseconds(0) && gap < std::chrono::milliseconds(100)) {
          round_gap = round_gap.count() == 0 ? gap : (3 * round_gap + gap) / 4;
        }
      }
      last_round_at = r.at;
    }
    ++rounds_delivered;
    for (Delivery& d : r.deliveries) {
      auto it = streams.find(d.id);
      if (it == streams.end()) continue;  // its response ended (cancelled, stopped)
      auto p = it->second.lock();
      if (!p) {  // the connection is gone
        streams.erase(it);
        continue;
      }
      p->guarded("delivering tokens", [&] {
        if (d.error) {
          p->on_error(d.id, *d.error);
        } else {
          p->on_tokens(
              d.id,
              std::span<const runtime::TokenEvent>(r.events.data() + d.begin, d.end - d.begin),
              r.flush);
        }
      });
    }
    r.events.clear();
    r.deliveries.clear();
  }
  batching = false;
  send_batch();
  // Emptied rounds keep their capacity for the engine thread's next ones (a
  // few: a burst's backlog is let go).
  std::lock_guard<std::mutex> l(rounds_mu);
  for (Round& r : rounds) {
    r.flush = r.urgent = false;
    if (spare.size() < kMaxWaitingRounds + 2) spare.push_back(std::move(r));
  }
  rounds.clear();
}

void HttpServer::Impl::send_batch() {
  if (batched.empty()) return;
  batch_items.clear();
  for (auto& s : batched) batch_items.push_back(s->batch_item());
  sender->send_all(batch_items, &batch_results);
  batched_writes += static_cast<int64_t>(batched.size());
  // The sessions' next writes (a partial one's rest, the next request's
  // answer) go the usual way: this batch is over.
  std::vector<std::shared_ptr<Session>> sent;
  sent.swap(batched);
  for (size_t i = 0; i < sent.size(); ++i) sent[i]->on_batch_sent(batch_results[i]);
  sent.clear();
  batched.swap(sent);  // its capacity, for the next batch
  if (!sender->broken().empty()) {
    std::fprintf(stderr, "msinfer: server: %s; the streams' writes go one send() each from now\n",
                 sender->broken().c_str());
  }
}

void HttpServer::Impl::accept() {
  acceptor.async_accept([this](beast::error_code ec, tcp::socket sock) {
    if (ec == net::error::operation_aborted || !acceptor.is_open()) return;
    if (!ec) {
      beast::error_code ignored;
      const auto peer = sock.remote_endpoint(ignored);
      std::string client = ignored ? std::string() : peer.address().to_string();
      auto it = per_client.find(client);
      const int64_t from_client = it == per_client.end() ? 0 : it->second;
      if ((options.max_connections_per_client > 0 &&
           from_client >= options.max_connections_per_client) ||
          (connections.load() >= options.max_connections && !evict_idle())) {
        sock.close(ignored);  // over a limit: refuse at once
      } else {
        beast::error_code ignored;
        // TCP_NODELAY is set on the listening socket, and Linux hands it on
        // to the sockets it accepts: checked on the first, set on each only
        // where it is not (a system call per connection saved).
        if (nodelay_inherited < 0) {
          tcp::no_delay nd;
          sock.get_option(nd, ignored);
          nodelay_inherited = !ignored && nd.value() ? 1 : 0;
        }
        if (nodelay_inherited == 0) sock.set_option(tcp::no_delay(true), ignored);
        auto s = std::make_shared<Session>(*this, std::move(sock), std::move(client));
        // Forget closed connections now and then, not on every accept (a
        // scan of every connection per accept: quadratic in a burst).
        if (sessions.size() >= prune_sessions_at) {
          sessions.remove_if([](const std::weak_ptr<Session>& w) { return w.expired(); });
          prune_sessions_at = 2 * sessions.size() + 64;
        }
        sessions.push_back(s);
        s->start();
      }
    }
    accept();
  });
}

bool HttpServer::Impl::evict_idle() {
  // Oldest first: sessions is in the order of acceptance.
  for (auto it = sessions.begin(); it != sessions.end();) {
    auto s = it->lock();
    if (!s) {
      it = sessions.erase(it);
      continue;
    }
    if (s->idle()) {
      s->close();
      sessions.erase(it);
      return true;
    }
    ++it;
  }
  return false;
}

}  // namespace msinfer::server
