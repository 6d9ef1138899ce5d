// Bookkeeping shared by the operations that see relative identities.

#ifndef JAXLIB_PATCH_IDENTITY_SCOPE_H_
#define JAXLIB_PATCH_IDENTITY_SCOPE_H_

#include <algorithm>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "jaxlib_patch/pytree.h"
#include "jaxlib_patch/spare_lease.h"

namespace jaxlib_patch {

// Maps the opted-in objects met during one operation to the traversal index
// of their first occurrence. The objects are kept alive until the operation
// ends: a flatten function may hand out fresh objects, and if one died
// mid-flatten its id could be reused by another, faking a share.
//
// Each object gets a slot, its place in `members_`; the caller keeps the slot
// of an object it is still flattening and finishes it through the slot, so
// a node costs one probe, not two. The table is a plain open-addressing one
// with linear probing and Fibonacci hashing of the pointer, kept at most half
// full: every opted-in node of every flatten inserts into it, and robin_map's
// bookkeeping for displaced entries cost twice the rest of the insert. Each
// member remembers its bucket, so clearing touches only what was inserted.
class IdentityScope {
 public:
  static constexpr Py_ssize_t kInProgress = -1;

  struct Entry {
    size_t slot;
    bool first;  // `obj` was met for the first time; its index is kInProgress
  };

  Entry Enter(nb::handle obj) {
    if (2 * (members_.size() + 1) > buckets_.size()) {
      Rebuild(std::max<size_t>(kMinBuckets, 2 * buckets_.size()));
    }
    PyObject* key = obj.ptr();
    size_t bucket = HomeBucket(key);
    for (; buckets_[bucket].key != nullptr; bucket = NextBucket(bucket)) {
      if (buckets_[bucket].key == key) return {buckets_[bucket].slot, false};
    }
    buckets_[bucket] = {key, members_.size()};
    members_.push_back({nb::borrow(obj), kInProgress, bucket});
    return {members_.size() - 1, true};
  }

  Py_ssize_t IndexAt(size_t slot) const { return members_[slot].index; }

  void Finish(size_t slot, Py_ssize_t index) { members_[slot].index = index; }

  // Returns the index recorded for `obj`, recording `index` for it when it is
  // met for the first time.
  Py_ssize_t FindOrInsert(nb::handle obj, Py_ssize_t index) {
    const Entry entry = Enter(obj);
    if (entry.first) Finish(entry.slot, index);
    return IndexAt(entry.slot);
  }

  // Room for `objects` distinct objects without growing the table.
  void Reserve(size_t objects) {
    size_t buckets = kMinBuckets;
    while (buckets < 2 * objects) buckets *= 2;
    if (buckets > buckets_.size()) Rebuild(buckets);
    members_.reserve(objects);
  }

  // Releases the objects and forgets them, keeping the memory for the next
  // operation.
  void Clear() {
    for (const Member& member : members_) buckets_[member.bucket] = {};
    members_.clear();
  }

  // A table grown past kMaxSpareBuckets by a huge tree is freed rather than
  // kept for the thread's lifetime.
  bool KeepAsSpare() const { return buckets_.size() <= kMaxSpareBuckets; }

 private:
  static constexpr size_t kMinBuckets = 16;
  static constexpr size_t kMaxSpareBuckets = size_t{1} << 15;

  struct Bucket {
    PyObject* key = nullptr;
    size_t slot = 0;
  };
  struct Member {
    nb::object object;
    Py_ssize_t index;
    size_t bucket;
  };

  size_t HomeBucket(PyObject* key) const {
    return (reinterpret_cast<uintptr_t>(key) * kGoldenRatio) >> shift_;
  }
  size_t NextBucket(size_t bucket) const {
    return (bucket + 1) & (buckets_.size() - 1);
  }

  // Moves the members into a table of `buckets` buckets, a power of two.
  void Rebuild(size_t buckets) {
    buckets_.assign(buckets, Bucket{});
    shift_ = 64;
    for (size_t b = buckets; b > 1; b /= 2) --shift_;
    for (size_t slot = 0; slot < members_.size(); ++slot) {
      Member& member = members_[slot];
      size_t bucket = HomeBucket(member.object.ptr());
      while (buckets_[bucket].key != nullptr) bucket = NextBucket(bucket);
      buckets_[bucket] = {member.object.ptr(), slot};
      member.bucket = bucket;
    }
  }

  std::vector<Bucket> buckets_;
  int shift_ = 64;  // 64 - log2(buckets_.size())
  std::vector<Member> members_;
};

// The identity scope of one operation, from the thread's spare. Without it
// each flatten of an opted-in tree would grow a table from empty, rehashing
// about as many entries as it inserts, and free it again: most of what
// opting in cost on a tree without sharing.
using IdentityScopeLease = SpareLease<IdentityScope>;

}  // namespace jaxlib_patch

#endif  // JAXLIB_PATCH_IDENTITY_SCOPE_H_
