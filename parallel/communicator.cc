#include "parallel/communicator.h"

#include <cstdio>
#include <cstdlib>
#include <exception>

#include "core/error.h"

namespace hap::parallel {

Communicator Communicator::world() { return Communicator(MpiBackend::world()); }

Backend& Communicator::backend() const {
  HAP_CHECK(backend_ != nullptr,
            "using an invalid Communicator (a rank that split() left out, or a default-constructed "
            "one)");
  return *backend_;
}

int Communicator::rank() const { return backend().rank(); }
int Communicator::size() const { return backend().size(); }
void Communicator::barrier() const { backend().barrier(); }

Communicator Communicator::split(int colour, int key) const {
  return Communicator(backend().split(colour, key));
}

Communicator Communicator::split_by_node() const { return Communicator(backend().split_by_node()); }

void Communicator::broadcast_bytes(std::vector<uint8_t>& bytes, int root) const {
  HAP_CHECK(root >= 0 && root < size(), "broadcast: root ", root, " out of range for ", size(),
            " ranks");
  Tensor n = Tensor::from_vector(std::vector<int64_t>{static_cast<int64_t>(bytes.size())}, {1});
  backend().broadcast(n, root);
  const int64_t count = static_cast<int64_t>(n.item());
  Tensor data = Tensor::empty({count}, TensorOptions{}.with_dtype(DType::U8));
  if (rank() == root && count > 0) std::copy(bytes.begin(), bytes.end(), data.data<uint8_t>());
  backend().broadcast(data, root);
  bytes.assign(data.data<uint8_t>(), data.data<uint8_t>() + count);
}

std::string Communicator::broadcast_string(const std::string& s, int root) const {
  std::vector<uint8_t> bytes(s.begin(), s.end());
  broadcast_bytes(bytes, root);
  return std::string(bytes.begin(), bytes.end());
}

namespace {

template <typename T>
std::vector<T> gather_scalar(Backend& b, T value) {
  const DType dtype = std::is_same_v<T, double> ? DType::F64 : DType::I64;
  Tensor mine = Tensor::from_vector(std::vector<T>{value}, {1}, TensorOptions{}.with_dtype(dtype));
  Tensor all = Tensor::empty({b.size()}, TensorOptions{}.with_dtype(dtype));
  b.all_gather(mine, all, BlockLayout::slots(static_cast<size_t>(b.size()), 1));
  const T* p = all.data<T>();
  return std::vector<T>(p, p + b.size());
}

template <typename T>
T reduce_in_rank_order(const std::vector<T>& all, ReduceOp op) {
  T acc = all[0];
  for (size_t i = 1; i < all.size(); ++i) {
    switch (op) {
      case ReduceOp::Sum:
        acc = acc + all[i];
        break;
      case ReduceOp::Max:
        acc = all[i] > acc ? all[i] : acc;
        break;
      case ReduceOp::Min:
        acc = all[i] < acc ? all[i] : acc;
        break;
    }
  }
  return acc;
}

}  // namespace

std::vector<double> Communicator::allgather(double value) const {
  return gather_scalar(backend(), value);
}

std::vector<int64_t> Communicator::allgather(int64_t value) const {
  return gather_scalar(backend(), value);
}

double Communicator::allreduce(double value, ReduceOp op) const {
  return reduce_in_rank_order(allgather(value), op);
}

int64_t Communicator::allreduce(int64_t value, ReduceOp op) const {
  return reduce_in_rank_order(allgather(value), op);
}

void Communicator::abort_all(int code) const {
  if (backend_) backend_->abort(code);
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(code);
}

MPI_Comm mpi_handle(const Communicator& comm) {
  auto* mpi = dynamic_cast<MpiBackend*>(&comm.backend());
  HAP_CHECK(mpi != nullptr, "mpi_handle: the communicator's backend is ", comm.backend().name(),
            ", not mpi");
  return mpi->comm();
}

void run_or_abort_all(const Communicator& comm, const std::function<void()>& fn, int abort_code) {
  try {
    fn();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", comm.rank(), e.what());
    comm.abort_all(abort_code);
  } catch (...) {
    std::fprintf(stderr, "rank %d: unknown exception\n", comm.rank());
    comm.abort_all(abort_code);
  }
}

}  // namespace hap::parallel
