// Data-parallel ranks on c10d; contract and sources in data_parallel.h. The environment variables
// are torchrun's (torch/distributed/run.py, torch/distributed/elastic/agent/server/api.py).
#include "data_parallel.h"

#include <ATen/record_function.h>
#include <torch/torch.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <thread>

#include "posenc/core/errors.h"

#ifdef POSENC_HAS_DISTRIBUTED
#include <gloo/common/error.h>

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/comm.hpp>
#include <torch/csrc/distributed/c10d/reducer.hpp>

#include "nccl_backend.h"
#endif

namespace posenc::train {

namespace {

constexpr int kMaxWorldSize = 65536;  // ranks a run may have (a sanity bound on WORLD_SIZE)

// An environment variable as an integer in [low, high]; unset: fallback.
int env_int(const char* name, int fallback, int low, int high) {
  const char* text = std::getenv(name);
  if (text == nullptr) return fallback;
  const std::string value(text);
  int parsed = 0;
  const auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), parsed);
  TORCH_CHECK(error == std::errc() && end == value.data() + value.size() && !value.empty() &&
                  parsed >= low && parsed <= high,
              "environment: ", name, "='", value, "' must be an integer in [", low, ", ", high,
              "]");
  return parsed;
}

std::string first_line(const std::string& text) {
  auto line = text.substr(0, text.find('\n'));
  return line.size() > 400 ? line.substr(0, 400) + "..." : line;
}

}  // namespace

GradientSync gradient_sync_from_string(const std::string& name) {
  if (name == "overlap") return GradientSync::kOverlap;
  if (name == "after_backward") return GradientSync::kAfterBackward;
  TORCH_CHECK(false, "train: gradient_sync must be 'overlap' or 'after_backward', got '", name,
              "'");
}

DistributedOptions distributed_from_environment() {
  DistributedOptions o;
  const bool has_rank = std::getenv("RANK") != nullptr;
  const bool has_world = std::getenv("WORLD_SIZE") != nullptr;
  if (!has_rank && !has_world) return o;
  TORCH_CHECK(has_rank && has_world, "environment: ", has_rank ? "RANK" : "WORLD_SIZE",
              " is set but ", has_rank ? "WORLD_SIZE" : "RANK",
              " is not; a data-parallel run needs both (torchrun sets them)");
  o.world_size = env_int("WORLD_SIZE", 1, 1, kMaxWorldSize);
  o.rank = env_int("RANK", 0, 0, o.world_size - 1);
  o.local_world_size = env_int("LOCAL_WORLD_SIZE", o.world_size, 1, o.world_size);
  o.local_rank = env_int("LOCAL_RANK", o.rank % o.local_world_size, 0, o.local_world_size - 1);
  if (o.world_size == 1) return o;
  if (const char* file = std::getenv("POSENC_STORE_FILE"); file != nullptr && *file != '\0') {
    o.store_file = file;
    return o;
  }
  const char* addr = std::getenv("MASTER_ADDR");
  TORCH_CHECK(addr != nullptr && *addr != '\0', "environment: WORLD_SIZE is ", o.world_size,
              " but MASTER_ADDR is not set (the host of rank 0, or of torchrun's store)");
  o.master_addr = addr;
  TORCH_CHECK(std::getenv("MASTER_PORT") != nullptr, "environment: WORLD_SIZE is ", o.world_size,
              " but MASTER_PORT is not set");
  o.master_port = env_int("MASTER_PORT", 0, 1, 65535);
  if (const char* agent = std::getenv("TORCHELASTIC_USE_AGENT_STORE")) {
    const std::string value(agent);
    TORCH_CHECK(value == "True" || value == "False" || value == "true" || value == "false" ||
                    value == "1" || value == "0",
                "environment: TORCHELASTIC_USE_AGENT_STORE='", value, "' must be True or False");
    o.agent_store = value == "True" || value == "true" || value == "1";
  }
  o.restart_count = env_int("TORCHELASTIC_RESTART_COUNT", 0, 0, 1 << 30);
  return o;
}

#ifdef POSENC_HAS_DISTRIBUTED

bool distributed_available() { return true; }

struct DataParallel::Impl {
  std::string store_name;                 // "the store at host:port" (for errors)
  bool store_on_rank0 = false;            // rank 0 hosts the TCPStore
  c10::intrusive_ptr<c10d::Store> words;  // the ranks' word after a failure
  c10::intrusive_ptr<c10d::ProcessGroup> group;
  c10::intrusive_ptr<c10d::Backend> nccl;  // with a CUDA device: the group's CUDA backend
  std::shared_ptr<c10d::Reducer> reducer;  // kOverlap
  GradientSync mode = GradientSync::kOverlap;
  std::vector<at::Tensor> params;  // kAfterBackward
  int64_t step = -1;               // the step whose backward runs (for the injected fault)
  int64_t fault_step = -1;         // POSENC_FAULT_AT=gloo_worker:RANK:STEP (tests); -1: none
};

namespace {

bool is_loopback(const std::string& host) {
  return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1";
}

std::shared_ptr<::gloo::transport::Device> gloo_device(const DistributedOptions& o) {
  if (const char* name = std::getenv("GLOO_SOCKET_IFNAME"); name != nullptr && *name != '\0')
    return c10d::ProcessGroupGloo::createDeviceForInterface(name);
  if (!o.store_file.empty() || is_loopback(o.master_addr))
    return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

// Fault injection for tests (tests/test_distributed.cpp), beside durable_file.cpp's points in the
// same variable: POSENC_FAULT_AT="gloo_worker:RANK:STEP" makes rank RANK's gradient all-reduce of
// step STEP fail by an exception thrown where a local failure of a collective is (an allocation, a
// tensor check): in a callback of the all-reduce's future, run by the Gloo worker thread that
// completes it (or by this thread, when the all-reduce ended before the callback was added). The
// data has gone out, so the other ranks run on into their next collective. -1 when not asked.
int64_t injected_fault_step(int rank) {
  const char* spec = std::getenv("POSENC_FAULT_AT");
  if (spec == nullptr) return -1;
  const std::string text(spec), prefix = "gloo_worker:" + std::to_string(rank) + ":";
  if (text.rfind(prefix, 0) != 0) return -1;
  int64_t step = -1;
  const char* first = text.data() + prefix.size();
  const auto [end, error] = std::from_chars(first, text.data() + text.size(), step);
  TORCH_CHECK(error == std::errc() && end == text.data() + text.size() && step >= 0,
              "environment: POSENC_FAULT_AT='", text, "': expected gloo_worker:RANK:STEP");
  return step;
}

c10::intrusive_ptr<c10::ivalue::Future> fail_in_callback(
    const c10::intrusive_ptr<c10::ivalue::Future>& all_reduce, int rank, int64_t step) {
  return all_reduce->then(
      [rank, step](c10::ivalue::Future&) -> c10::IValue {
        throw EnvironmentError("rank " + std::to_string(rank) +
                               ": injected fault in the gradient all-reduce of step " +
                               std::to_string(step) + " (POSENC_FAULT_AT)");
      },
      all_reduce->elementType());
}

// c10d's built-in "allreduce" hook (the mean: divided, then summed), failing at the fault step.
class FaultInjectingHook
    : public c10d::CppCommHookInterface<c10::intrusive_ptr<c10d::ProcessGroup>> {
 public:
  FaultInjectingHook(const c10::intrusive_ptr<c10d::ProcessGroup>& group, const int64_t* step,
                     int64_t fault_step)
      : CppCommHookInterface(group), step_(step), fault_step_(fault_step) {}
  c10::intrusive_ptr<c10::ivalue::Future> runHook(c10d::GradBucket& bucket) override {
    std::vector<at::Tensor> tensors = {bucket.getBufferRef()};
    tensors[0] /= state_->getSize();
    auto done = state_->allreduce(tensors)->getFuture();
    return *step_ == fault_step_ ? fail_in_callback(done, state_->getRank(), *step_) : done;
  }

 private:
  const int64_t* step_;
  int64_t fault_step_;
};

}  // namespace

DataParallel::DataParallel(const DistributedOptions& options, std::chrono::milliseconds timeout,
                           c10::Device device)
    : options_(options), device_(device) {
  if (!active()) return;
  impl_ = std::make_unique<Impl>();
  impl_->fault_step = injected_fault_step(options.rank);
  const std::string me = "rank " + std::to_string(options.rank);
  c10::intrusive_ptr<c10d::Store> base;
  if (!options.store_file.empty()) {
    impl_->store_name = "the file store '" + options.store_file + "'";
    base = c10::make_intrusive<c10d::FileStore>(options.store_file, options.world_size);
    base->setTimeout(timeout);
  } else {
    c10d::TCPStoreOptions store_options;
    store_options.port = static_cast<uint16_t>(options.master_port);
    store_options.isServer = !options.agent_store && options.rank == 0;
    // as torch.distributed's env:// rendezvous: every rank counts itself in and waits for the
    // others (the agent's store: the agent has gathered the workers already)
    if (!options.agent_store) store_options.numWorkers = options.world_size;
    store_options.waitWorkers = !options.agent_store;
    store_options.timeout = timeout;
    impl_->store_on_rank0 = store_options.isServer || !options.agent_store;
    impl_->store_name = "the store at " + options.master_addr + ":" +
                        std::to_string(options.master_port) +
                        (options.agent_store ? " (torchrun's agent)" : "");
    try {
      base = c10::make_intrusive<c10d::TCPStore>(options.master_addr, store_options);
    } catch (const std::exception& e) {
      throw EnvironmentError(me + ": cannot " + (store_options.isServer ? "host " : "reach ") +
                             impl_->store_name + " (MASTER_ADDR, MASTER_PORT) within " +
                             std::to_string(timeout.count() / 1000) +
                             " s: " + first_line(e.what()));
    }
    if (options.agent_store)
      base = c10::make_intrusive<c10d::PrefixStore>(
          "/worker/attempt_" + std::to_string(options.restart_count), base);
  }
  impl_->words = c10::make_intrusive<c10d::PrefixStore>("posenc/words", base);
  auto gloo_store = c10::make_intrusive<c10d::PrefixStore>("posenc/gloo", base);
  try {
    auto gloo_options = c10d::ProcessGroupGloo::Options::create(timeout);
    gloo_options->devices.push_back(gloo_device(options));
    auto backend = c10::make_intrusive<c10d::ProcessGroupGloo>(gloo_store, options.rank,
                                                               options.world_size, gloo_options);
    impl_->group =
        c10::make_intrusive<c10d::ProcessGroup>(gloo_store, options.rank, options.world_size);
    impl_->group->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO, backend);
    impl_->group->setDefaultBackend(c10d::ProcessGroup::BackendType::GLOO);
  } catch (const std::exception& e) {
    throw EnvironmentError(me + ": the " + std::to_string(options.world_size) +
                           " ranks did not all connect through " + impl_->store_name + " within " +
                           std::to_string(timeout.count() / 1000) + " s: " + first_line(e.what()));
  }
  if (!device.is_cuda()) return;
  // the CUDA tensors' collectives: NCCL beside Gloo ("cpu:gloo,cuda:nccl")
  c10::intrusive_ptr<c10d::Backend> nccl;
  try {
    nccl = make_nccl_backend(c10::make_intrusive<c10d::PrefixStore>("posenc/nccl", base),
                             options.rank, options.world_size, timeout, device);
  } catch (const EnvironmentError&) {
    throw;
  } catch (const std::exception& e) {
    throw EnvironmentError(me + ": cannot create the NCCL group on " + device.str() + ": " +
                           first_line(e.what()));
  }
  impl_->group->setBackend(c10::DeviceType::CUDA, c10d::ProcessGroup::BackendType::NCCL, nccl);
  impl_->nccl = nccl;
}

DataParallel::~DataParallel() {
  if (!impl_) return;
  try {  // c10d's Reducer may throw from its destructor after a failed step
    impl_->reducer.reset();
    if (impl_->nccl) impl_->nccl->shutdown();  // NCCL's communicators, before the group goes
    impl_->nccl.reset();
    impl_->group.reset();
  } catch (...) {
  }
}

namespace {

// After a failed collective: who is gone? Each survivor says "alive"; a rank that failed by
// itself has left "failed/<rank>" with its message. Returns the verdict in words.
std::string lost_ranks(c10d::Store& words, const DistributedOptions& o, bool store_on_rank0,
                       const std::string& store_name) {
  try {
    words.setTimeout(std::chrono::duration_cast<std::chrono::milliseconds>(kLostRankWait));
    words.set("alive/" + std::to_string(o.rank), std::string("1"));
    const auto deadline = std::chrono::steady_clock::now() + kLostRankWait;
    std::vector<int> silent;
    while (true) {
      silent.clear();
      for (int r = 0; r < o.world_size; ++r) {
        if (r == o.rank) continue;
        const auto failed = "failed/" + std::to_string(r);
        if (words.check({failed})) {
          const auto message = words.get(failed);
          return "rank " + std::to_string(r) +
                 " failed: " + std::string(message.begin(), message.end());
        }
        if (!words.check({"alive/" + std::to_string(r)})) silent.push_back(r);
      }
      if (silent.empty() || std::chrono::steady_clock::now() > deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    if (silent.empty()) return "every rank is still running";
    std::string names;
    for (int r : silent) names += (names.empty() ? "" : ", ") + std::to_string(r);
    return (silent.size() == 1 ? "lost rank " : "lost ranks ") + names + " (no word within " +
           std::to_string(kLostRankWait.count()) + " s: killed, crashed or hung)";
  } catch (const std::exception&) {
    if (store_on_rank0 && o.rank != 0)
      return "lost rank 0 (it hosts " + store_name + ", which no longer answers)";
    return store_name + " no longer answers";
  }
}

// Whether a collective's exception says the ranks lost each other (a socket closed or reset, a
// timeout, the store gone: Gloo's and c10d's communication errors) rather than that this rank
// failed by itself (an allocation, a tensor check, a disk: thrown on this thread or on the Gloo
// worker thread that ran the collective, and rethrown here by its future).
bool is_communication_error(const std::exception& e) {
  return dynamic_cast<const ::gloo::Exception*>(&e) != nullptr ||
         dynamic_cast<const c10::DistError*>(&e) != nullptr;
}

}  // namespace

// A collective that fails: when the ranks lost each other, one error naming the lost rank (or
// quoting the rank that failed by itself); when this rank failed by itself, its own error as it
// is (its type keeps the exit code), which run_training leaves in the store for the others to
// quote before this process ends and closes its sockets. Asking the others first, as before,
// named a rank that was still running: the rank that failed waited kLostRankWait for a word from
// ranks that were blocked in the collective or already in their next one, and blamed them.
#define POSENC_LOST_RANKS_ERROR(action, e)                                                         \
  EnvironmentError("rank " + std::to_string(options_.rank) + ": " + (action) + ": " +              \
                   lost_ranks(*impl_->words, options_, impl_->store_on_rank0, impl_->store_name) + \
                   " [" + first_line((e).what()) + "]")

#define POSENC_COLLECTIVE(action, ...)        \
  try {                                       \
    __VA_ARGS__;                              \
  } catch (const std::exception& e) {         \
    if (!is_communication_error(e)) throw;    \
    throw POSENC_LOST_RANKS_ERROR(action, e); \
  }

void DataParallel::broadcast_module(torch::nn::Module& module) {
  if (!active()) return;
  torch::NoGradGuard no_grad;
  std::vector<at::Tensor> tensors;
  for (auto& p : module.parameters()) tensors.push_back(p.detach());
  for (auto& b : module.buffers()) tensors.push_back(b.detach());
  POSENC_COLLECTIVE("broadcasting rank 0's weights",
                    c10d::broadcast_coalesced(impl_->group, tensors, 16 * 1024 * 1024, 0));
}

void DataParallel::sync_gradients(torch::nn::Module& model, GradientSync mode, int64_t bucket_bytes,
                                  bool find_unused) {
  if (!active()) return;
  impl_->mode = mode;
  std::vector<at::Tensor> params;
  std::unordered_map<size_t, std::string> names;
  int64_t bytes = 0;
  for (const auto& item : model.named_parameters()) {
    if (!item.value().requires_grad()) continue;
    names[params.size()] = item.key();
    params.push_back(item.value());
    bytes += item.value().numel() * item.value().element_size();
  }
  if (lead())
    std::cerr << "data-parallel: " << world_size() << " ranks, " << params.size()
              << " gradients of " << bytes << " bytes all-reduced per step ("
              << (mode == GradientSync::kAfterBackward
                      ? std::string("one flat all-reduce after backward")
                      : "c10d Reducer, buckets of " + std::to_string(bucket_bytes >> 20) +
                            " MiB overlapped with backward") +
                     ")\n";
  if (mode == GradientSync::kAfterBackward) {
    impl_->params = params;
    return;
  }
  // As DistributedDataParallel: buckets in parameter order, then reversed (gradients arrive
  // roughly from the last layer to the first), a small first bucket.
  auto [buckets, limits] = c10d::compute_bucket_assignment_by_size(
      params, {static_cast<size_t>(kFirstBucketBytes), static_cast<size_t>(bucket_bytes)},
      std::vector<bool>(params.size(), false), {});
  std::reverse(buckets.begin(), buckets.end());
  impl_->reducer = std::make_shared<c10d::Reducer>(
      params, buckets, impl_->group, std::vector<bool>(params.size(), false), bucket_bytes,
      find_unused, /*gradient_as_bucket_view=*/false, names, kFirstBucketBytes,
      /*skip_all_reduce_unused_params=*/false, /*use_python_reducer=*/false,
      std::vector<int64_t>{});
  if (impl_->fault_step >= 0)
    impl_->reducer->register_comm_hook(
        std::make_unique<FaultInjectingHook>(impl_->group, &impl_->step, impl_->fault_step));
}

void DataParallel::before_forward() {
  if (!active() || !impl_->reducer) return;
  impl_->reducer->prepare_for_forward();
  POSENC_COLLECTIVE("agreeing on the gradient buckets", impl_->reducer->rebuild_buckets());
}

void DataParallel::backward(const at::Tensor& loss, int64_t step) {
  if (!active()) {
    loss.backward();
    return;
  }
  const auto what = "step " + std::to_string(step);
  impl_->step = step;
  if (impl_->reducer) impl_->reducer->prepare_for_backward({loss});
  POSENC_COLLECTIVE(what + " (backward and its gradient all-reduce)", loss.backward());
  if (impl_->mode != GradientSync::kAfterBackward) return;
  RECORD_USER_SCOPE("posenc::allreduce");
  torch::NoGradGuard no_grad;
  std::vector<at::Tensor> pieces;
  for (auto& p : impl_->params) {
    if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
    pieces.push_back(p.grad().reshape({-1}));
  }
  auto flat = torch::cat(pieces).div_(world_size());
  std::vector<at::Tensor> buffer{flat};
  POSENC_COLLECTIVE(what + " (gradient all-reduce)", {
    auto work = impl_->group->allreduce(buffer);
    if (step != impl_->fault_step)
      work->wait();
    else
      fail_in_callback(work->getFuture(), rank(), step)->waitAndThrow();
  });
  int64_t offset = 0;
  for (auto& p : impl_->params) {
    const int64_t n = p.numel();
    p.mutable_grad().copy_(flat.narrow(0, offset, n).view_as(p));
    offset += n;
  }
}

std::vector<double> DataParallel::sum(std::vector<double> values, const std::string& what) {
  if (!active() || values.empty()) return values;
  auto t = torch::tensor(values, torch::kDouble);
  std::vector<at::Tensor> buffer{t};
  POSENC_COLLECTIVE(what, impl_->group->allreduce(buffer)->wait());
  auto a = t.accessor<double, 1>();
  for (size_t i = 0; i < values.size(); ++i) values[i] = a[static_cast<int64_t>(i)];
  return values;
}

std::vector<int64_t> DataParallel::gather(int64_t value, const std::string& what) {
  if (!active()) return {value};
  auto t = torch::zeros({world_size()}, torch::kLong);
  t[rank()] = value;
  std::vector<at::Tensor> buffer{t};
  POSENC_COLLECTIVE(what, impl_->group->allreduce(buffer)->wait());
  return std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + world_size());
}

std::vector<std::string> DataParallel::gather_text(const std::string& key, const std::string& value,
                                                   const std::string& what) {
  if (!active()) return {value};
  std::vector<std::string> out;
  try {  // the store's errors, whatever their type (a FileStore times out with a plain c10::Error)
    auto store = c10::make_intrusive<c10d::PrefixStore>("posenc/texts/" + key, impl_->words);
    store->set(std::to_string(rank()), std::vector<uint8_t>(value.begin(), value.end()));
    for (int64_t r = 0; r < world_size(); ++r) {
      const auto bytes = store->get(std::to_string(r));
      out.emplace_back(bytes.begin(), bytes.end());
    }
  } catch (const std::exception& e) {
    throw POSENC_LOST_RANKS_ERROR(what, e);
  }
  return out;
}

void DataParallel::report_failure(const std::string& message) noexcept {
  if (!active() || !impl_ || !impl_->words) return;
  try {
    impl_->words->setTimeout(std::chrono::duration_cast<std::chrono::milliseconds>(kLostRankWait));
    impl_->words->set("failed/" + std::to_string(rank()), first_line(message));
  } catch (...) {
  }
}

#else  // built without the Gloo headers: one process only

bool distributed_available() { return false; }

struct DataParallel::Impl {};

DataParallel::DataParallel(const DistributedOptions& options, std::chrono::milliseconds,
                           c10::Device device)
    : options_(options), device_(device) {
  TORCH_CHECK(!active(), "WORLD_SIZE is ", options.world_size,
              " but this posenc was built without distributed training (no Gloo headers: run "
              "scripts/setup.sh, which installs libgloo-dev, and rebuild)");
}
DataParallel::~DataParallel() = default;
void DataParallel::broadcast_module(torch::nn::Module&) {}
void DataParallel::sync_gradients(torch::nn::Module&, GradientSync, int64_t, bool) {}
void DataParallel::before_forward() {}
void DataParallel::backward(const at::Tensor& loss, int64_t) { loss.backward(); }
std::vector<double> DataParallel::sum(std::vector<double> values, const std::string&) {
  return values;
}
std::vector<int64_t> DataParallel::gather(int64_t value, const std::string&) { return {value}; }
std::vector<std::string> DataParallel::gather_text(const std::string&, const std::string& value,
                                                   const std::string&) {
  return {value};
}
void DataParallel::report_failure(const std::string&) noexcept {}

#endif

}  // namespace posenc::train
