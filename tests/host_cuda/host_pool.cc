// host_pool.cc — the threads that run the host stand-in's blocks (cuda_host.h: host_pool_run),
// made once and kept: starting 256 threads for every launch costs far more than the launch.
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace {
struct Pool {
    std::mutex mu;
    std::condition_variable go, done;
    std::vector<std::thread> th;
    const std::function<void(unsigned)>* job = nullptr;
    unsigned n = 0, left = 0;
    unsigned long gen = 0;
    bool quit = false;

    void work(unsigned t) {
        unsigned long seen = 0;
        for (;;) {
            std::unique_lock<std::mutex> l(mu);
            go.wait(l, [&] { return quit || gen != seen; });
            if (quit) return;
            seen = gen;
            if (t >= n) continue;
            const std::function<void(unsigned)>* f = job;
            l.unlock();
            (*f)(t);
            l.lock();
            if (--left == 0) done.notify_one();
        }
    }
    void run(unsigned count, const std::function<void(unsigned)>& f) {
        std::unique_lock<std::mutex> l(mu);
        while (th.size() < count) {
            const unsigned t = (unsigned)th.size();
            th.emplace_back([this, t] { work(t); });
        }
        job = &f, n = count, left = count, gen++;
        go.notify_all();
        done.wait(l, [&] { return left == 0; });
    }
    ~Pool() {
        {
            std::lock_guard<std::mutex> l(mu);
            quit = true;
        }
        go.notify_all();
        for (auto& t : th) t.join();
    }
};
Pool g_pool;
}  // namespace

void host_pool_run(unsigned n, const std::function<void(unsigned)>& f) { g_pool.run(n, f); }
