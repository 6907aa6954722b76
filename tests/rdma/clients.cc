#include "tests/rdma/clients.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>

#include <new>

namespace rdmalock::rdma_test {

using namespace std::chrono_literals;

SharedFile::SharedFile() {
  path_ = TempDir() + "/shared";
  const int fd = open(path_.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
  REQUIRE(fd >= 0);
  REQUIRE(ftruncate(fd, sizeof(WorkerShared)) == 0);
  void* p = mmap(nullptr, sizeof(WorkerShared), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  REQUIRE(p != MAP_FAILED);
  shared_ = new (p) WorkerShared();
}

pid_t Worker(const std::vector<std::string>& args) {
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    std::vector<char*> argv;
    argv.push_back(const_cast<char*>(WORKER_PATH));
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(WORKER_PATH, argv.data());
    _exit(127);
  }
  return pid;
}

pid_t StartHolder(const Lockd& lockd, SharedFile& shf, const std::string& name, bool shared,
                  bool record, bool warm) {
  std::vector<std::string> args = {
      "hold", RxeIp(), std::to_string(lockd.port()), shf.path(), "0", name, shared ? "s" : "x"};
  if (!record) args.push_back("norecord");
  if (warm) args.push_back("warm");
  const pid_t pid = Worker(args);
  const auto end = std::chrono::steady_clock::now() + 30s;
  while (shf.get()->granted == 0) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) FAIL("holder exited early");
    REQUIRE(std::chrono::steady_clock::now() < end);
    std::this_thread::sleep_for(5ms);
  }
  return pid;
}

void WaitQueued(Client& c, uint64_t slot, uint32_t n) {
  const auto end = std::chrono::steady_clock::now() + 30s;
  for (;;) {
    auto s = c.Inspect(slot);
    REQUIRE(s.ok());
    if (s->exclusive_outstanding + s->shared_outstanding >= n) return;
    REQUIRE(std::chrono::steady_clock::now() < end);
    std::this_thread::sleep_for(2ms);
  }
}

BackgroundLock::BackgroundLock(Client& c, const std::string& name)
    : thread_([this, &c, name] {
        result_ = c.Lock(name, {.timeout = 10000ms});
        granted_at_ = std::chrono::steady_clock::now();
      }) {}

BackgroundLock::~BackgroundLock() {
  if (thread_.joinable()) thread_.join();
}

Result<LockHandle>& BackgroundLock::Join() {
  thread_.join();
  return result_;
}

LockAndRelease::LockAndRelease(Client& c, const std::string& name)
    : thread_([this, &c, name] {
        auto h = c.Lock(name, {.timeout = 10000ms});
        ok_ = h.ok() && h->Release().ok();
      }) {}

LockAndRelease::~LockAndRelease() {
  if (thread_.joinable()) thread_.join();
}

bool LockAndRelease::ok() {
  thread_.join();
  return ok_;
}

}  // namespace rdmalock::rdma_test
