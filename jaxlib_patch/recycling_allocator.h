// The allocator of traversal vectors.
//
// Most flattens build a traversal of a few nodes (a call's arguments, a
// sharding spec, a single leaf), and a vector that grows one node at a time
// asks for capacities 1, 2, 4, 8, ...: each step is a malloc and a free, as
// much as the rest of flattening a small tree. Stock jaxlib keeps the first
// node inline; this keeps freed blocks of small capacities (up to 32 nodes,
// rounded up to powers of two) and hands them out again.
//
// The bins are process-wide and unsynchronized: every allocation and release
// of a treedef's traversal happens with the GIL held (docs/hardening.md).

#ifndef JAXLIB_PATCH_RECYCLING_ALLOCATOR_H_
#define JAXLIB_PATCH_RECYCLING_ALLOCATOR_H_

#include <cstddef>
#include <new>

namespace jaxlib_patch {

// Freed blocks of one capacity.
struct RecycledBin {
  static constexpr int kBlocks = 16;
  void* blocks[kBlocks];
  int count = 0;
};

class RecycledBlocks {
 public:
  // Bin b holds blocks of 2**b elements, for b < kBins.
  static constexpr int kBins = 6;

  // The bin of an allocation of `n` elements (the smallest whose blocks hold
  // them), or -1 if it has none. An allocation and its release ask for the
  // same `n`, so they agree on the bin.
  static int BinOf(size_t n) {
    int bin = 0;
    while (bin < kBins && (size_t{1} << bin) < n) ++bin;
    return bin < kBins ? bin : -1;
  }

  static size_t Capacity(int bin) { return size_t{1} << bin; }

  static void* Take(int bin) {
    RecycledBin& b = bins_[bin];
    return b.count > 0 ? b.blocks[--b.count] : nullptr;
  }

  // Whether the bin kept `block` (else the caller frees it).
  static bool Keep(int bin, void* block) {
    RecycledBin& b = bins_[bin];
    if (b.count == RecycledBin::kBlocks) return false;
    b.blocks[b.count++] = block;
    return true;
  }

 private:
  // Never destroyed: a treedef freed during interpreter shutdown may still
  // return its block. The kept blocks are reachable, so not leaks.
  static inline RecycledBin bins_[kBins];
};

template <typename T>
struct RecyclingAllocator {
  using value_type = T;

  RecyclingAllocator() = default;
  template <typename U>
  RecyclingAllocator(const RecyclingAllocator<U>&) {}

  T* allocate(size_t n) {
    const int bin = RecycledBlocks::BinOf(n);
    if (bin < 0) return static_cast<T*>(::operator new(n * sizeof(T)));
    if (void* block = RecycledBlocks::Take(bin)) return static_cast<T*>(block);
    return static_cast<T*>(
        ::operator new(RecycledBlocks::Capacity(bin) * sizeof(T)));
  }

  void deallocate(T* p, size_t n) {
    const int bin = RecycledBlocks::BinOf(n);
    if (bin >= 0 && RecycledBlocks::Keep(bin, p)) return;
    ::operator delete(p);
  }

  template <typename U>
  bool operator==(const RecyclingAllocator<U>&) const {
    return true;
  }
};

}  // namespace jaxlib_patch

#endif  // JAXLIB_PATCH_RECYCLING_ALLOCATOR_H_
