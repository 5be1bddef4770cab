// Copyright 2025 The tfcompress Authors. Licensed under the Apache License 2.0.
//
// CPU kernels for TFCompress>TopK, ThresholdSelect, SparseScatter and
// RandomKIndices.
//
// Selection (TopK, RandomKIndices) is a one-level radix select, linear in the
// number of elements and parallel except for a small final step:
//
//   1. each block of the input builds a histogram of the top 12 bits of the
//      element keys (for TopK the key is |x|'s IEEE bits without the sign,
//      which order like |x|; for RandomKIndices the noise itself), and checks
//      that x is finite;
//   2. walking the summed histogram from the top finds the bin holding the
//      k-th largest key; every element of higher bins is selected;
//   3. the elements of that bin are gathered (at offsets known from the
//      histograms) and std::nth_element finds the boundary element under the
//      full order (key descending, index ascending);
//   4. each block writes the indices it selects, in index order, at offsets
//      known from the histograms: the output comes out sorted, with no sort.
//
// Only step 3 is sequential, over one bin (about n / 4096 elements for
// uniform noise, a few per mille of n for Gaussian gradients, and n in the
// degenerate case of all-equal magnitudes, still linear).

#define EIGEN_USE_THREADS

#include "sparsify/cc/kernels/sparsify.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <numeric>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/cc/blocks.h"
#include "common/cc/kernel_checks.h"
#include "common/cc/op_prefix.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/register_types.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/framework/types.h"
#include "tensorflow/core/util/work_sharder.h"

namespace tensorflow {
namespace tfcompress {

using CPUDevice = Eigen::ThreadPoolDevice;

namespace {

template <typename Bits, typename T>
inline Bits BitsOf(T value) {
  static_assert(sizeof(Bits) == sizeof(T), "BitsOf needs equal sizes");
  Bits bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

// |x| as an unsigned key that orders like |x|: the IEEE bits without the
// sign bit. -0.0 and 0.0 share key 0; NaN and +-Inf have keys >= kNonFinite.
// Keys are compared as integers, never as floats, so subnormal numbers rank by
// their true magnitude whatever the CPU's flush-to-zero mode (TensorFlow sets
// it in its threads, where a float comparison would see them as zero).
// kMantissaBits and kBias describe the format, kLargest is its largest finite
// value (for ThresholdKey).
template <typename T>
struct Magnitude;

template <>
struct Magnitude<Eigen::half> {
  using Key = uint32_t;
  static constexpr int kKeyBits = 15;
  static constexpr Key kNonFinite = 0x7C00u;
  static constexpr int kMantissaBits = 10;
  static constexpr int kBias = 15;
  static constexpr double kLargest = 65504.0;
  static Key KeyOf(Eigen::half v) { return BitsOf<uint16_t>(v) & 0x7FFFu; }
};

template <>
struct Magnitude<bfloat16> {
  using Key = uint32_t;
  static constexpr int kKeyBits = 15;
  static constexpr Key kNonFinite = 0x7F80u;
  static constexpr int kMantissaBits = 7;
  static constexpr int kBias = 127;
  static constexpr double kLargest = 3.3895313892515355e38;  // (2 - 2^-7) 2^127
  static Key KeyOf(bfloat16 v) { return BitsOf<uint16_t>(v) & 0x7FFFu; }
};

template <>
struct Magnitude<float> {
  using Key = uint32_t;
  static constexpr int kKeyBits = 31;
  static constexpr Key kNonFinite = 0x7F800000u;
  static constexpr int kMantissaBits = 23;
  static constexpr int kBias = 127;
  static constexpr double kLargest = 3.4028234663852886e38;  // FLT_MAX
  static Key KeyOf(float v) { return BitsOf<uint32_t>(v) & 0x7FFFFFFFu; }
};

template <>
struct Magnitude<double> {
  using Key = uint64_t;
  static constexpr int kKeyBits = 63;
  static constexpr Key kNonFinite = 0x7FF0000000000000ull;
  static Key KeyOf(double v) {
    return BitsOf<uint64_t>(v) & 0x7FFFFFFFFFFFFFFFull;
  }
};

// The key of the smallest magnitude of T that is >= t, for a finite t >= 0
// (kNonFinite when t exceeds every finite T), so that
//   |x| >= t  <=>  KeyOf(x) >= ThresholdKey(t)
// exactly. Every floating-point operation below sees only normal doubles (a
// zero or subnormal t is handled on its bits), so the CPU's flush-to-zero
// mode cannot change the result. Mirrored by _threshold_key in
// tfcompress/ops/sparsify.py.
template <typename T>
typename Magnitude<T>::Key ThresholdKey(double t) {
  using M = Magnitude<T>;
  using Key = typename M::Key;
  const uint64_t t_bits = BitsOf<uint64_t>(t) & 0x7FFFFFFFFFFFFFFFull;  // -0.0
  if constexpr (std::is_same_v<T, double>) {
    return t_bits;  // non-negative doubles order like their bits
  } else {
    if (t_bits == 0) return 0;
    if ((t_bits >> 52) == 0) return 1;  // a subnormal double: below any T > 0
    if (t > M::kLargest) return M::kNonFinite;
    constexpr int kM = M::kMantissaBits;
    // t in units of T's smallest subnormal, 2^(1 - bias - M); exact.
    const double r = std::ldexp(t, kM + M::kBias - 1);
    const double linear_limit = std::ldexp(1.0, kM + 1);
    // Keys below 2^(M+1) (subnormals and the first binade) are evenly spaced
    // by one unit: key k has magnitude k units.
    if (r <= linear_limit) return static_cast<Key>(std::ceil(r));
    int exponent;
    std::frexp(r, &exponent);
    const int p = exponent - 1;  // r = 1.f * 2^p, p >= M + 1
    // Round the significand up to M bits: m in [2^M, 2^(M+1)].
    double m = std::ceil(std::ldexp(r, kM - p));
    int biased_exponent = p - kM + 1;
    if (m == linear_limit) {
      m = std::ldexp(1.0, kM);
      ++biased_exponent;
    }
    return (static_cast<Key>(biased_exponent) << kM) |
           (static_cast<Key>(m) - (Key{1} << kM));
  }
}

// --- blocks: the unit of parallel work ---------------------------------------
//
// An input of n elements is cut into at most 4 blocks per thread of at least
// kMinBlockSize elements. Per-block results (histograms, counts) are merged in
// block order, so every result is independent of the thread count's effect on
// scheduling.

constexpr int64_t kMinBlockSize = int64_t{1} << 15;

Blocks BlocksOfSize(int64_t n, int64_t size) {
  return {n, size, std::max<int64_t>(1, (n + size - 1) / size)};
}

// Runs work(block, begin, end) for every block on the CPU thread pool.
void ForEachBlock(OpKernelContext* context, const Blocks& blocks,
                  int64_t cost_per_element,
                  const std::function<void(int64_t, int64_t, int64_t)>& work) {
  const auto* workers = context->device()->tensorflow_cpu_worker_threads();
  Shard(workers->num_threads, workers->workers, blocks.count,
        cost_per_element * blocks.size, [&](int64_t first, int64_t last) {
          for (int64_t block = first; block < last; ++block) {
            work(block, blocks.Begin(block), blocks.End(block));
          }
        });
}

// The first i in [0, n) where bad(i), or -1.
int64_t FirstWhere(OpKernelContext* context, int64_t n,
                   const std::function<bool(int64_t)>& bad) {
  if (n == 0) return -1;
  const Blocks blocks = MakeBlocks(context, n, kMinBlockSize);
  std::vector<int64_t> first(blocks.count, -1);
  ForEachBlock(context, blocks, 2,
               [&](int64_t block, int64_t begin, int64_t end) {
                 for (int64_t i = begin; i < end; ++i) {
                   if (bad(i)) {
                     first[block] = i;
                     return;
                   }
                 }
               });
  for (const int64_t i : first) {
    if (i >= 0) return i;
  }
  return -1;
}

// --- radix select ----------------------------------------------------------

constexpr int kHistogramBits = 12;

template <typename Key>
struct Candidate {
  Key key;
  int32_t index;  // n <= kMaxSparsifyElements
};

// The selection order: a larger key first; among equal keys the lower index.
template <typename Key>
inline bool RanksBefore(const Candidate<Key>& a, const Candidate<Key>& b) {
  return a.key > b.key || (a.key == b.key && a.index < b.index);
}

// Writes to out[0, k) the positions of the k first elements of [0, n) in the
// selection order of their keys key_of(i), ascending (see the file comment).
// Keys have kKeyBits significant bits. Returns the first index whose key is
// >= invalid_from (then `out` is unspecified), or -1.
template <typename Key, int kKeyBits, typename KeyOf>
int64_t SelectLargest(OpKernelContext* context, int64_t n, int64_t k,
                      uint64_t invalid_from, const KeyOf& key_of,
                      int32_t* out) {
  if (n == 0) return -1;
  constexpr int kShift =
      kKeyBits > kHistogramBits ? kKeyBits - kHistogramBits : 0;
  constexpr int64_t kBins = int64_t{1} << (kKeyBits - kShift);
  const Blocks blocks = MakeBlocks(context, n, kMinBlockSize);

  // 1. Histograms of the top bits, and the finiteness check.
  std::vector<uint32_t> histograms(blocks.count * kBins, 0);
  std::vector<int64_t> first_invalid(blocks.count, -1);
  ForEachBlock(context, blocks, 3,
               [&](int64_t block, int64_t begin, int64_t end) {
                 uint32_t* histogram = histograms.data() + block * kBins;
                 for (int64_t i = begin; i < end; ++i) {
                   const Key key = key_of(i);
                   if (static_cast<uint64_t>(key) >= invalid_from) {
                     first_invalid[block] = i;
                     return;
                   }
                   ++histogram[key >> kShift];
                 }
               });
  for (const int64_t i : first_invalid) {
    if (i >= 0) return i;
  }
  if (k == 0) return -1;
  if (k == n) {
    ForEachBlock(context, blocks, 1,
                 [&](int64_t, int64_t begin, int64_t end) {
                   std::iota(out + begin, out + end, static_cast<int32_t>(begin));
                 });
    return -1;
  }

  // 2. The bin holding the k-th key; `above` keys lie in higher bins.
  auto count_in = [&](int64_t block, int64_t bin) -> int64_t {
    return histograms[block * kBins + bin];
  };
  int64_t above = 0;
  int64_t boundary_bin = kBins - 1;
  int64_t in_boundary_bin = 0;
  for (; boundary_bin > 0; --boundary_bin) {
    in_boundary_bin = 0;
    for (int64_t b = 0; b < blocks.count; ++b) {
      in_boundary_bin += count_in(b, boundary_bin);
    }
    if (above + in_boundary_bin >= k) break;
    above += in_boundary_bin;
  }
  if (boundary_bin == 0) {
    in_boundary_bin = n - above;
  }
  const int64_t need = k - above;  // in [1, in_boundary_bin]

  // 3. The boundary element among the candidates of that bin.
  std::vector<int64_t> candidate_offsets(blocks.count + 1, 0);
  for (int64_t b = 0; b < blocks.count; ++b) {
    candidate_offsets[b + 1] = candidate_offsets[b] + count_in(b, boundary_bin);
  }
  std::vector<Candidate<Key>> candidates(in_boundary_bin);
  const uint64_t bin_value = static_cast<uint64_t>(boundary_bin);
  ForEachBlock(context, blocks, 2,
               [&](int64_t block, int64_t begin, int64_t end) {
                 Candidate<Key>* next =
                     candidates.data() + candidate_offsets[block];
                 for (int64_t i = begin; i < end; ++i) {
                   const Key key = key_of(i);
                   if (static_cast<uint64_t>(key >> kShift) == bin_value) {
                     *next++ = {key, static_cast<int32_t>(i)};
                   }
                 }
               });
  std::nth_element(candidates.begin(), candidates.begin() + (need - 1),
                   candidates.end(), RanksBefore<Key>);
  const Candidate<Key> last = candidates[need - 1];

  // 4. Each block writes its selected indices in order.
  std::vector<int64_t> offsets(blocks.count + 1, 0);
  for (int64_t b = 0; b < blocks.count; ++b) {
    int64_t selected = 0;
    for (int64_t bin = boundary_bin + 1; bin < kBins; ++bin) {
      selected += count_in(b, bin);
    }
    offsets[b + 1] = selected;
  }
  for (int64_t j = 0; j < need; ++j) {
    ++offsets[candidates[j].index / blocks.size + 1];
  }
  std::partial_sum(offsets.begin(), offsets.end(), offsets.begin());
  ForEachBlock(context, blocks, 2,
               [&](int64_t block, int64_t begin, int64_t end) {
                 int32_t* next = out + offsets[block];
                 for (int64_t i = begin; i < end; ++i) {
                   const Key key = key_of(i);
                   if (key > last.key || (key == last.key && i <= last.index)) {
                     *next++ = static_cast<int32_t>(i);
                   }
                 }
               });
  return -1;
}

}  // namespace

namespace functor {

template <typename T>
struct TopKMagnitudes<CPUDevice, T> {
  int64_t operator()(OpKernelContext* context, const CPUDevice& /*device*/,
                     typename TTypes<T>::ConstFlat x,
                     typename TTypes<int32_t>::Flat indices) const {
    using M = Magnitude<T>;
    const T* in = x.data();
    return SelectLargest<typename M::Key, M::kKeyBits>(
        context, x.size(), indices.size(), M::kNonFinite,
        [in](int64_t i) { return M::KeyOf(in[i]); }, indices.data());
  }
};

template <typename T>
struct ThresholdSelect<CPUDevice, T> {
  using M = Magnitude<T>;

  ThresholdPlan Plan(OpKernelContext* context, const CPUDevice& /*device*/,
                     typename TTypes<T>::ConstFlat x, double threshold) const {
    const int64_t n = x.size();
    const T* in = x.data();
    const typename M::Key threshold_key = ThresholdKey<T>(threshold);
    const Blocks blocks = MakeBlocks(context, n, kMinBlockSize);
    ThresholdPlan plan;
    plan.block_size = blocks.size;
    plan.block_counts.assign(blocks.count, 0);
    std::vector<int64_t> first_non_finite(blocks.count, -1);
    std::vector<typename M::Key> largest(blocks.count, 0);
    std::vector<int64_t> largest_index(blocks.count, -1);
    ForEachBlock(
        context, blocks, 4, [&](int64_t block, int64_t begin, int64_t end) {
          int64_t count = 0;
          typename M::Key best = 0;  // zeros never become the fallback
          int64_t best_index = -1;
          for (int64_t i = begin; i < end; ++i) {
            const typename M::Key key = M::KeyOf(in[i]);
            if (key >= M::kNonFinite) {
              first_non_finite[block] = i;
              return;
            }
            count += key >= threshold_key;
            if (key > best) {  // strict: the lowest index wins ties
              best = key;
              best_index = i;
            }
          }
          plan.block_counts[block] = count;
          largest[block] = best;
          largest_index[block] = best_index;
        });
    for (const int64_t i : first_non_finite) {
      if (i >= 0) {
        plan.first_non_finite = i;
        return plan;
      }
    }
    plan.count = std::accumulate(plan.block_counts.begin(),
                                 plan.block_counts.end(), int64_t{0});
    if (plan.count == 0) {
      typename M::Key best = 0;
      for (int64_t b = 0; b < blocks.count; ++b) {
        if (largest[b] > best) {
          best = largest[b];
          plan.fallback_index = largest_index[b];
        }
      }
      if (plan.fallback_index >= 0) plan.count = 1;
    }
    return plan;
  }

  void Write(OpKernelContext* context, const CPUDevice& /*device*/,
             typename TTypes<T>::ConstFlat x, double threshold,
             const ThresholdPlan& plan,
             typename TTypes<int32_t>::Flat indices) const {
    if (plan.count == 0) return;
    if (plan.fallback_index >= 0) {
      indices(0) = static_cast<int32_t>(plan.fallback_index);
      return;
    }
    const T* in = x.data();
    int32_t* out = indices.data();
    const typename M::Key threshold_key = ThresholdKey<T>(threshold);
    const Blocks blocks = BlocksOfSize(x.size(), plan.block_size);
    std::vector<int64_t> offsets(blocks.count + 1, 0);
    std::partial_sum(plan.block_counts.begin(), plan.block_counts.end(),
                     offsets.begin() + 1);
    ForEachBlock(context, blocks, 3,
                 [&](int64_t block, int64_t begin, int64_t end) {
                   int32_t* next = out + offsets[block];
                   for (int64_t i = begin; i < end; ++i) {
                     if (M::KeyOf(in[i]) >= threshold_key) {
                       *next++ = static_cast<int32_t>(i);
                     }
                   }
                 });
  }
};

template <typename T>
struct GatherValues<CPUDevice, T> {
  void operator()(OpKernelContext* context, const CPUDevice& /*device*/,
                  typename TTypes<T>::ConstFlat x,
                  typename TTypes<int32_t>::ConstFlat indices,
                  typename TTypes<T>::Flat values) const {
    const auto* workers = context->device()->tensorflow_cpu_worker_threads();
    Shard(workers->num_threads, workers->workers, indices.size(), 4,
          [&](int64_t begin, int64_t end) {
            for (int64_t j = begin; j < end; ++j) values(j) = x(indices(j));
          });
  }
};

template <typename T>
struct SparseScatter<CPUDevice, T> {
  void operator()(OpKernelContext* context, const CPUDevice& device,
                  typename TTypes<T>::ConstFlat values,
                  typename TTypes<int32_t>::ConstFlat indices,
                  typename TTypes<T>::Flat dense) const {
    dense.device(device) = dense.constant(T(0));
    const auto* workers = context->device()->tensorflow_cpu_worker_threads();
    Shard(workers->num_threads, workers->workers, indices.size(), 4,
          [&](int64_t begin, int64_t end) {
            for (int64_t j = begin; j < end; ++j) dense(indices(j)) = values(j);
          });
  }
};

template <>
struct RandomKIndices<CPUDevice> {
  void operator()(OpKernelContext* context, const CPUDevice& /*device*/,
                  typename TTypes<uint32_t>::ConstFlat noise,
                  typename TTypes<int32_t>::Flat indices) const {
    const uint32_t* in = noise.data();
    // Every uint32 is a valid key: invalid_from lies above them all.
    SelectLargest<uint32_t, 32>(
        context, noise.size(), indices.size(), uint64_t{1} << 32,
        [in](int64_t i) { return in[i]; }, indices.data());
  }
};

}  // namespace functor

namespace {

absl::Status NonFiniteError(const char* op, const std::string& tensor_name,
                            int64_t index) {
  return InvalidArgument(op, ": tensor `", tensor_name,
                         "` has a non-finite value (NaN or Inf) at flat index ",
                         index);
}

absl::Status TooManyElements(const char* op, const std::string& tensor_name,
                             int64_t n) {
  return InvalidArgument(op, ": tensor `", tensor_name, "` has ", n,
                         " elements; at most ", kMaxSparsifyElements,
                         " are supported (indices are int32)");
}

template <typename Device, typename T>
class TopKOp : public OpKernel {
 public:
  explicit TopKOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("tensor_name", &tensor_name_));
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& x = context->input(0);
    const Tensor& k_tensor = context->input(1);
    OP_REQUIRES_OK(context, CheckScalar("TopK", "k", k_tensor));
    const int64_t n = x.NumElements();
    OP_REQUIRES(context, n <= kMaxSparsifyElements,
                TooManyElements("TopK", tensor_name_, n));
    const int64_t k = k_tensor.scalar<int64_t>()();
    OP_REQUIRES(context, k >= 0 && k <= n,
                InvalidArgument("TopK: `k` must be in [0, ", n,
                                "] (the number of elements of `", tensor_name_,
                                "`), got ", k));
    Tensor* values = nullptr;
    OP_REQUIRES_OK(context,
                   context->allocate_output(0, TensorShape({k}), &values));
    Tensor* indices = nullptr;
    OP_REQUIRES_OK(context,
                   context->allocate_output(1, TensorShape({k}), &indices));
    const Device& device = context->eigen_device<Device>();
    const int64_t first_non_finite = functor::TopKMagnitudes<Device, T>()(
        context, device, x.flat<T>(), indices->flat<int32_t>());
    OP_REQUIRES(context, first_non_finite < 0,
                NonFiniteError("TopK", tensor_name_, first_non_finite));
    const Tensor& selected = *indices;
    functor::GatherValues<Device, T>()(context, device, x.flat<T>(),
                                       selected.flat<int32_t>(),
                                       values->flat<T>());
  }

 private:
  std::string tensor_name_;
};

template <typename Device, typename T>
class ThresholdSelectOp : public OpKernel {
 public:
  explicit ThresholdSelectOp(OpKernelConstruction* context)
      : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("tensor_name", &tensor_name_));
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& x = context->input(0);
    const Tensor& threshold_tensor = context->input(1);
    OP_REQUIRES_OK(context,
                   CheckScalar("ThresholdSelect", "threshold", threshold_tensor));
    const double threshold = threshold_tensor.scalar<double>()();
    OP_REQUIRES(context, std::isfinite(threshold) && threshold >= 0,
                InvalidArgument("ThresholdSelect: `threshold` must be finite "
                                "and >= 0, got ",
                                threshold));
    const int64_t n = x.NumElements();
    OP_REQUIRES(context, n <= kMaxSparsifyElements,
                TooManyElements("ThresholdSelect", tensor_name_, n));
    const Device& device = context->eigen_device<Device>();
    const functor::ThresholdSelect<Device, T> select;
    const functor::ThresholdPlan plan =
        select.Plan(context, device, x.flat<T>(), threshold);
    OP_REQUIRES(context, plan.first_non_finite < 0,
                NonFiniteError("ThresholdSelect", tensor_name_,
                               plan.first_non_finite));
    Tensor* values = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(
                                0, TensorShape({plan.count}), &values));
    Tensor* indices = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(
                                1, TensorShape({plan.count}), &indices));
    select.Write(context, device, x.flat<T>(), threshold, plan,
                 indices->flat<int32_t>());
    const Tensor& selected = *indices;
    functor::GatherValues<Device, T>()(context, device, x.flat<T>(),
                                       selected.flat<int32_t>(),
                                       values->flat<T>());
  }

 private:
  std::string tensor_name_;
};

template <typename Device, typename T>
class SparseScatterOp : public OpKernel {
 public:
  explicit SparseScatterOp(OpKernelConstruction* context)
      : OpKernel(context) {}

  void Compute(OpKernelContext* context) override {
    const Tensor& values = context->input(0);
    const Tensor& indices = context->input(1);
    const Tensor& size_tensor = context->input(2);
    OP_REQUIRES_OK(context, CheckVector("SparseScatter", "values", values));
    OP_REQUIRES_OK(context, CheckVector("SparseScatter", "indices", indices));
    OP_REQUIRES_OK(context, CheckScalar("SparseScatter", "size", size_tensor));
    const int64_t m = values.NumElements();
    OP_REQUIRES(context, indices.NumElements() == m,
                InvalidArgument("SparseScatter: corrupted payload: `values` "
                                "has ",
                                m, " elements but `indices` has ",
                                indices.NumElements()));
    const int64_t size = size_tensor.scalar<int64_t>()();
    OP_REQUIRES(context, size >= 0,
                InvalidArgument("SparseScatter: `size` must be >= 0, got ",
                                size));
    // Both checks read only `indices`, before anything is written.
    const auto index = indices.flat<int32_t>();
    const int64_t out_of_range = FirstWhere(context, m, [&](int64_t j) {
      return index(j) < 0 || index(j) >= size;
    });
    OP_REQUIRES(context, out_of_range < 0,
                InvalidArgument("SparseScatter: corrupted payload: `indices[",
                                out_of_range, "]` = ",
                                out_of_range < 0 ? 0 : index(out_of_range),
                                " is out of range [0, ", size, ")"));
    const int64_t unordered = FirstWhere(context, m, [&](int64_t j) {
      return j > 0 && index(j) <= index(j - 1);
    });
    OP_REQUIRES(
        context, unordered < 0,
        InvalidArgument("SparseScatter: corrupted payload: `indices` must be "
                        "strictly increasing (no duplicates), but indices[",
                        unordered - 1, "] = ",
                        unordered < 1 ? 0 : index(unordered - 1),
                        " and indices[", unordered,
                        "] = ", unordered < 0 ? 0 : index(unordered)));
    Tensor* dense = nullptr;
    OP_REQUIRES_OK(context,
                   context->allocate_output(0, TensorShape({size}), &dense));
    functor::SparseScatter<Device, T>()(
        context, context->eigen_device<Device>(), values.flat<T>(), index,
        dense->flat<T>());
  }
};

template <typename Device>
class RandomKIndicesOp : public OpKernel {
 public:
  explicit RandomKIndicesOp(OpKernelConstruction* context)
      : OpKernel(context) {}

  void Compute(OpKernelContext* context) override {
    const Tensor& noise = context->input(0);
    const Tensor& k_tensor = context->input(1);
    OP_REQUIRES_OK(context, CheckVector("RandomKIndices", "noise", noise));
    OP_REQUIRES_OK(context, CheckScalar("RandomKIndices", "k", k_tensor));
    const int64_t n = noise.NumElements();
    OP_REQUIRES(context, n <= kMaxSparsifyElements,
                TooManyElements("RandomKIndices", "noise", n));
    const int64_t k = k_tensor.scalar<int64_t>()();
    OP_REQUIRES(context, k >= 0 && k <= n,
                InvalidArgument("RandomKIndices: `k` must be in [0, ", n,
                                "] (the length of `noise`), got ", k));
    Tensor* indices = nullptr;
    OP_REQUIRES_OK(context,
                   context->allocate_output(0, TensorShape({k}), &indices));
    functor::RandomKIndices<Device>()(context, context->eigen_device<Device>(),
                                      noise.flat<uint32_t>(),
                                      indices->flat<int32_t>());
  }
};

#define REGISTER_CPU(T)                                                  \
  REGISTER_KERNEL_BUILDER(Name(TFCOMPRESS_OP_NAME("TopK"))               \
                              .Device(DEVICE_CPU)                        \
                              .TypeConstraint<T>("T"),                   \
                          TopKOp<CPUDevice, T>);                         \
  REGISTER_KERNEL_BUILDER(Name(TFCOMPRESS_OP_NAME("ThresholdSelect"))    \
                              .Device(DEVICE_CPU)                        \
                              .TypeConstraint<T>("T"),                   \
                          ThresholdSelectOp<CPUDevice, T>);              \
  REGISTER_KERNEL_BUILDER(Name(TFCOMPRESS_OP_NAME("SparseScatter"))      \
                              .Device(DEVICE_CPU)                        \
                              .TypeConstraint<T>("T"),                   \
                          SparseScatterOp<CPUDevice, T>);

REGISTER_CPU(Eigen::half);
REGISTER_CPU(bfloat16);
REGISTER_CPU(float);
REGISTER_CPU(double);

#undef REGISTER_CPU

REGISTER_KERNEL_BUILDER(Name(TFCOMPRESS_OP_NAME("RandomKIndices"))
                            .Device(DEVICE_CPU),
                        RandomKIndicesOp<CPUDevice>);

}  // namespace
}  // namespace tfcompress
}  // namespace tensorflow
