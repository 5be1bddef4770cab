// Copyright 2025 The tfcompress Authors. Licensed under the Apache License 2.0.
//
// CPU kernel of TFCompress>BloomConflictSets, DeepReduce's P2 false-positive
// policy (the algorithm, its random stream and its cost are described in
// bloom_conflict_sets.h). The hashes are BloomHash's (index_codecs.h), the
// ones BloomInsert and BloomQuery use, so a change of the hash-to-bit
// reduction there applies here too.
//
// Every input is checked before anything is allocated: positives 1-D,
// strictly increasing and in [0, dense_length); m, k and dense_length in
// range; 0 <= num_selected <= the number of positives; a seed of 2 elements.
// The work arrays come from the TensorFlow allocator (allocate_temp): a size
// that cannot be allocated fails with ResourceExhausted instead of aborting.
//
// CPU only, by design: the policy is a sequential walk over the conflict sets
// (each choice depends on the previous ones), of the positives' size, not of
// the dense length; on a GPU machine TensorFlow runs it on the CPU. So its
// functor keeps the OpKernelContext (for allocate_temp) and is not part of
// the TensorFlow-free functor headers.

#define EIGEN_USE_THREADS
#if GOOGLE_CUDA
#define EIGEN_USE_GPU
#endif

#include "index_codecs/cc/kernels/bloom_conflict_sets.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/cc/kernel_checks.h"
#include "common/cc/op_prefix.h"
#include "common/cc/tf_device.h"
#include "index_codecs/cc/kernels/index_codecs.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/framework/types.h"

namespace tensorflow {
namespace tfcompress {


namespace {

constexpr char kOp[] = "BloomConflictSets";

// A work array of `size` elements of T (a plain struct or integer) in a
// byte tensor from the op's allocator (64-byte aligned).
template <typename T>
class TempArray {
 public:
  static_assert(std::is_trivially_copyable<T>::value, "plain data only");

  absl::Status Allocate(OpKernelContext* context, int64_t size) {
    constexpr int64_t kElementBytes = sizeof(T);
    if (size > std::numeric_limits<int64_t>::max() / kElementBytes) {
      return absl::ResourceExhaustedError(
          absl::StrCat(kOp, ": cannot allocate ", size, " work elements"));
    }
    TF_RETURN_IF_ERROR(context->allocate_temp(
        DT_UINT8, TensorShape({size * kElementBytes}), &tensor_));
    data_ = reinterpret_cast<T*>(tensor_.flat<uint8_t>().data());
    return absl::OkStatus();
  }
  T& operator[](int64_t i) { return data_[i]; }
  const T& operator[](int64_t i) const { return data_[i]; }
  T* data() { return data_; }
  void Swap(TempArray& other) {
    std::swap(tensor_, other.tensor_);
    std::swap(data_, other.data_);
  }

 private:
  Tensor tensor_;
  T* data_ = nullptr;
};

int64_t LowestBit(int64_t i) { return i & -i; }

// A (filter bit, pair number) pair, sorted by bit.
struct KeyedPair {
  uint64_t bit;
  int64_t pair;
};

// Sorts pairs[0, count) by bit, stably (LSD radix sort on 16-bit digits; bits
// are below num_bits, so at most 4 passes).
absl::Status SortByBit(OpKernelContext* context, uint64_t num_bits,
                       int64_t count, TempArray<KeyedPair>* pairs) {
  const int width = num_bits <= 1 ? 0 : 64 - __builtin_clzll(num_bits - 1);
  if (width == 0 || count < 2) return absl::OkStatus();
  TempArray<KeyedPair> scratch;
  TF_RETURN_IF_ERROR(scratch.Allocate(context, count));
  std::vector<int64_t> start(int64_t{1} << 16);
  for (int shift = 0; shift < width; shift += 16) {
    std::fill(start.begin(), start.end(), 0);
    auto digit = [shift](uint64_t bit) { return (bit >> shift) & 0xFFFF; };
    for (int64_t i = 0; i < count; ++i) ++start[digit((*pairs)[i].bit)];
    int64_t sum = 0;
    for (int64_t& entry : start) {
      const int64_t size = entry;
      entry = sum;
      sum += size;
    }
    for (int64_t i = 0; i < count; ++i) {
      scratch[start[digit((*pairs)[i].bit)]++] = (*pairs)[i];
    }
    pairs->Swap(scratch);
  }
  return absl::OkStatus();
}

// A conflict set: slots [begin, begin + size) of the members sorted by (bit,
// position), and the Fenwick tree over them (see ConflictSets).
struct ConflictSet {
  int64_t begin;
  int64_t size;
  int64_t remaining;
  // 1 when a member was chosen by another set since this one's last visit.
  int64_t compromised;
};

// Where pair e of a positive sits: its slot and its set.
struct PairPlace {
  int64_t slot;
  int64_t set;
};

// Conflict sets as Fenwick trees over consecutive segments of one array:
// tree[slot] counts the remaining members of the Fenwick range that ends at
// that slot (local 1-based index slot - begin + 1).
class ConflictSets {
 public:
  TempArray<ConflictSet> sets;
  TempArray<int64_t> tree;

  // Set s with all its members present.
  void Fill(int64_t s) {
    ConflictSet& set = sets[s];
    set.remaining = set.size;
    set.compromised = 0;
    for (int64_t i = 1; i <= set.size; ++i) {
      tree[set.begin + i - 1] = LowestBit(i);
    }
  }

  // Slot of the j-th (0-based) remaining member of set s, j < remaining.
  int64_t Select(int64_t s, int64_t j) const {
    const ConflictSet& set = sets[s];
    int64_t at = 0;        // local 1-based index reached so far
    int64_t rank = j + 1;  // remaining members still to pass
    for (int64_t step = int64_t{1} << (63 - __builtin_clzll(set.size));
         step > 0; step >>= 1) {
      if (at + step <= set.size && tree[set.begin + at + step - 1] < rank) {
        at += step;
        rank -= tree[set.begin + at - 1];
      }
    }
    return set.begin + at;  // local index at + 1
  }

  // Removes the member at `slot` of set s.
  void Remove(int64_t s, int64_t slot) {
    ConflictSet& set = sets[s];
    for (int64_t i = slot - set.begin + 1; i <= set.size; i += LowestBit(i)) {
      --tree[set.begin + i - 1];
    }
    --set.remaining;
  }
};

// `positives` is 1-D, strictly increasing, in [0, dense_length).
absl::Status CheckPositives(const Tensor& tensor, int64_t dense_length) {
  return CheckAscendingPositions(kOp, "positives", tensor, dense_length);
}

// Reads the int64 scalar input `what` ("<op>: `<what>`<symbol> must be in
// <range>, got ..." when it is outside [low, high]).
absl::Status ReadScalar(const char* what, const char* symbol,
                        const Tensor& tensor, int64_t low, int64_t high,
                        const char* range, int64_t* value) {
  TF_RETURN_IF_ERROR(CheckScalar(kOp, what, tensor));
  *value = tensor.scalar<int64_t>()();
  if (*value < low || *value > high) {
    return InvalidArgument(kOp, ": `", what, "`", symbol, " must be in ",
                           range, ", got ", *value);
  }
  return absl::OkStatus();
}

}  // namespace

namespace functor {

template <>
struct BloomConflictSets<CpuDevice> {
  absl::Status operator()(OpKernelContext* context, const CpuDevice& device,
                          typename TTypes<int64_t>::ConstFlat positives,
                          int64_t num_bits, int64_t num_hashes,
                          int64_t num_selected, uint64_t stream,
                          typename TTypes<int64_t>::Flat selected) const {
    if (num_selected == 0) return absl::OkStatus();
    const int64_t n = positives.size();
    const uint64_t m = static_cast<uint64_t>(num_bits);

    // The distinct bits of each positive, as pairs e numbered positive by
    // positive: the pairs of positive q are [first_pair[q], first_pair[q+1]).
    TempArray<KeyedPair> by_bit;
    TempArray<int64_t> owner;  // owner[e]: the positive of pair e
    TempArray<int64_t> first_pair;
    const int64_t most = n * std::min<int64_t>(num_hashes, num_bits);
    TF_RETURN_IF_ERROR(by_bit.Allocate(context, most));
    TF_RETURN_IF_ERROR(owner.Allocate(context, most));
    TF_RETURN_IF_ERROR(first_pair.Allocate(context, n + 1));
    std::vector<uint64_t> bits(num_hashes);
    int64_t pairs = 0;
    for (int64_t q = 0; q < n; ++q) {
      first_pair[q] = pairs;
      const BloomHash hash(static_cast<uint64_t>(positives(q)));
      for (int64_t i = 0; i < num_hashes; ++i) {
        bits[i] = hash.Bit(static_cast<uint64_t>(i), m);
      }
      std::sort(bits.begin(), bits.end());
      const auto end = std::unique(bits.begin(), bits.end());
      for (auto it = bits.begin(); it != end; ++it) {
        by_bit[pairs] = {*it, pairs};
        owner[pairs] = q;
        ++pairs;
      }
    }
    first_pair[n] = pairs;

    // Pairs sorted by (bit, positive): each run of one bit is a conflict set,
    // members ascending; the sets are numbered in bit order.
    TF_RETURN_IF_ERROR(SortByBit(context, m, pairs, &by_bit));
    int64_t num_sets = 0;
    for (int64_t slot = 0; slot < pairs; ++slot) {
      if (slot == 0 || by_bit[slot].bit != by_bit[slot - 1].bit) ++num_sets;
    }
    ConflictSets sets;
    TempArray<int64_t> member;  // member[slot]: the positive at that slot
    TempArray<PairPlace> place;
    TF_RETURN_IF_ERROR(sets.sets.Allocate(context, num_sets));
    TF_RETURN_IF_ERROR(sets.tree.Allocate(context, pairs));
    TF_RETURN_IF_ERROR(member.Allocate(context, pairs));
    TF_RETURN_IF_ERROR(place.Allocate(context, pairs));
    for (int64_t slot = 0, s = -1; slot < pairs; ++slot) {
      if (slot == 0 || by_bit[slot].bit != by_bit[slot - 1].bit) {
        sets.sets[++s] = {slot, 0, 0, 0};
      }
      ++sets.sets[s].size;
      const int64_t e = by_bit[slot].pair;
      member[slot] = owner[e];
      place[e] = {slot, s};
    }
    int64_t largest = 0;
    for (int64_t s = 0; s < num_sets; ++s) {
      sets.Fill(s);
      largest = std::max(largest, sets.sets[s].size);
    }

    // The visiting order: size ascending, then bit ascending (a stable
    // counting sort of the sets by size).
    TempArray<int64_t> rotation;
    TempArray<int64_t> start;
    TF_RETURN_IF_ERROR(rotation.Allocate(context, num_sets));
    TF_RETURN_IF_ERROR(start.Allocate(context, largest + 2));
    std::fill(start.data(), start.data() + largest + 2, 0);
    for (int64_t s = 0; s < num_sets; ++s) ++start[sets.sets[s].size + 1];
    for (int64_t size = 1; size <= largest + 1; ++size) {
      start[size] += start[size - 1];
    }
    for (int64_t s = 0; s < num_sets; ++s) {
      rotation[start[sets.sets[s].size]++] = s;
    }

    TempArray<uint8_t> chosen;
    TF_RETURN_IF_ERROR(chosen.Allocate(context, n));
    std::fill(chosen.data(), chosen.data() + n, 0);
    int64_t picks = 0;
    int64_t active = num_sets;  // rotation[0, active): sets not known empty
    while (picks < num_selected) {
      if (active == 0) {
        // Unreachable with num_selected <= n (checked by the caller): an
        // unchosen positive stays in its sets.
        return absl::InternalError(
            absl::StrCat(kOp, ": ran out of conflict sets after ", picks,
                         " of ", num_selected, " positions"));
      }
      int64_t kept = 0;
      int64_t visit = 0;
      for (; visit < active && picks < num_selected; ++visit) {
        const int64_t s = rotation[visit];
        ConflictSet& set = sets.sets[s];
        if (set.remaining == 0) continue;  // leaves the rotation
        if (set.compromised) {
          set.compromised = 0;
          rotation[kept++] = s;
          continue;
        }
        const int64_t j = static_cast<int64_t>(
            ConflictSetsDraw(stream, picks) %
            static_cast<uint64_t>(set.remaining));
        const int64_t q = member[sets.Select(s, j)];
        chosen[q] = 1;
        ++picks;
        for (int64_t e = first_pair[q]; e < first_pair[q + 1]; ++e) {
          const PairPlace where = place[e];
          sets.Remove(where.set, where.slot);
          if (where.set != s) sets.sets[where.set].compromised = 1;
        }
        if (set.remaining > 0) rotation[kept++] = s;
      }
      // Sets not visited this round (the last one ended early) stay.
      for (; visit < active; ++visit) rotation[kept++] = rotation[visit];
      active = kept;
    }
    int64_t out = 0;
    for (int64_t q = 0; q < n; ++q) {
      if (chosen[q]) selected(out++) = positives(q);
    }
    return absl::OkStatus();
  }
};

}  // namespace functor

namespace {

class BloomConflictSetsOp : public OpKernel {
 public:
  explicit BloomConflictSetsOp(OpKernelConstruction* context)
      : OpKernel(context) {}

  void Compute(OpKernelContext* context) override {
    int64_t d = 0;
    OP_REQUIRES_OK(context, ReadScalar("dense_length", "", context->input(1),
                                       0, kMaxDenseLength, "[0, 2^62]", &d));
    const Tensor& positives = context->input(0);
    OP_REQUIRES_OK(context, CheckPositives(positives, d));
    int64_t m = 0;
    int64_t k = 0;
    OP_REQUIRES_OK(context,
                   ReadScalar("num_bits", " (m)", context->input(2), 1,
                              kMaxDenseLength, "[1, 2^62]", &m));
    OP_REQUIRES_OK(context,
                   ReadScalar("num_hashes", " (k)", context->input(3), 1,
                              kMaxBloomHashes, "[1, 255]", &k));
    const int64_t n = positives.NumElements();
    OP_REQUIRES_OK(context,
                   CheckScalar(kOp, "num_selected", context->input(4)));
    const int64_t r = context->input(4).scalar<int64_t>()();
    OP_REQUIRES(context, r >= 0 && r <= n,
                InvalidArgument(kOp, ": `num_selected` (r) must be in [0, ",
                                n, "] (the number of positives), got ", r));
    const Tensor& seed = context->input(5);
    OP_REQUIRES(context,
                TensorShapeUtils::IsVector(seed.shape()) &&
                    seed.NumElements() == 2,
                InvalidArgument(kOp, ": `seed` must have shape [2], got ",
                                seed.shape().DebugString()));
    const auto seed_flat = seed.flat<int64_t>();
    Tensor* output = nullptr;
    OP_REQUIRES_OK(context,
                   context->allocate_output(0, TensorShape({r}), &output));
    OP_REQUIRES_OK(context,
                   functor::BloomConflictSets<CpuDevice>()(
                       context, MakeCpuDevice(context),
                       positives.flat<int64_t>(), m, k, r,
                       ConflictSetsStream(seed_flat(0), seed_flat(1)),
                       output->flat<int64_t>()));
  }
};

}  // namespace

REGISTER_KERNEL_BUILDER(Name(TFCOMPRESS_OP_NAME("BloomConflictSets"))
                            .Device(DEVICE_CPU),
                        BloomConflictSetsOp);

}  // namespace tfcompress
}  // namespace tensorflow
