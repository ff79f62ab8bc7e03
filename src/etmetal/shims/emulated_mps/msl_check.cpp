// The checker of the emulated Metal device (ETMETAL_METAL_CHECK), appended to msl_dispatch.cpp
// when the dispatcher is built (it reads the dispatcher's worker, threadgroup and threads).
//
// A checked build of a library routes each subscript of device and threadgroup memory
// through etm_msl_check_device / etm_msl_check_threadgroup (msl_check.h). Here:
//   - device accesses are checked against the extent of the [[buffer(i)]] binding they go
//     through; outside it, the access is redirected to scratch memory and recorded;
//   - threadgroup arrays get a shadow per byte, reset for every threadgroup: the epoch
//     (barriers passed) and thread of the last write and of the last read. A read of bytes
//     never written is uninitialized; bytes written by one thread and read or written by
//     another in the same epoch (no barrier between) are a race. Threads of a threadgroup
//     run one after another between barriers, so a race shows whatever the order. A
//     threadgroup array is filled with 0xff bytes when its threadgroup first declares it;
//   - after the grid, bindings over overlapping but different byte ranges, one of them
//     written, are an aliasing hazard (binding the same range twice is in-place, not one).
// Faults are kept once per (kind, memory, site) with a count; the first occurrence keeps
// its thread position and offset.
#include <atomic>

namespace {

constexpr uint32_t kNoThread = 0xffffffffu;
constexpr size_t kScratchBytes = 4096;
constexpr uint64_t kMaxShadowBytes = 1 << 20;  // per threadgroup array

struct Shadow {  // one threadgroup byte; epoch 0: never
  uint32_t w_epoch, r_epoch;
  uint32_t writer, reader;  // thread index in the threadgroup; reader kNoThread: several
};

struct Region {
  uintptr_t base;
  uint64_t size;
  uint32_t site;
  std::vector<Shadow> shadow;
};

struct BindingUse {
  bool written;
  uint32_t tg[3], thread[3];  // the first write through it
};

std::atomic<uint64_t> g_checked_accesses{0};

}  // namespace

namespace {

struct Checker {
  etm_msl_check_run* run;
  void* const* args;
  uint32_t epoch = 1;
  std::vector<Region> regions;  // declared in the current threadgroup: the first `live`
  uint32_t live = 0;
  std::vector<BindingUse> uses;
  uint64_t accesses = 0;
  alignas(64) unsigned char scratch[kScratchBytes];
};

void check_group_begin(Checker* c) {
  c->live = 0;
  c->epoch = 1;
}

void check_barrier(Checker* c) { c->epoch++; }

const etm_msl_thread& current_thread() {
  Worker& w = worker();
  return w.group->threads[w.current].info;
}

void record(Checker* c, uint32_t kind, int32_t buffer, int64_t offset, uint64_t extent,
            uint32_t size, uint32_t site, const uint32_t* other, bool other_known,
            uint32_t array_site = kNoThread) {
  etm_msl_check_run* r = c->run;
  for (uint32_t i = 0; i < r->nfaults; i++) {
    etm_msl_fault& f = r->faults[i];
    if (f.kind == kind && f.buffer == buffer && f.site == site && f.array_site == array_site) {
      f.count++;
      return;
    }
  }
  if (r->nfaults >= r->max_faults) {
    r->dropped++;
    return;
  }
  etm_msl_fault& f = r->faults[r->nfaults++];
  memset(&f, 0, sizeof f);
  const etm_msl_thread& t = current_thread();
  f.kind = kind;
  f.buffer = buffer;
  f.offset = offset;
  f.extent = extent;
  f.size = size;
  f.site = site;
  f.count = 1;
  for (int d = 0; d < 3; d++) {
    f.tg[d] = t.tg_id[d];
    f.thread[d] = t.tg_pos[d];
    f.other[d] = other ? other[d] : 0;
  }
  f.other_known = other_known ? 1 : 0;
  f.array_site = array_site;
}

// the binding holding [a, a + size), or else the one starting last at or before a (else -1)
int32_t find_binding(Checker* c, uintptr_t a, uint32_t size, bool* inside) {
  const etm_msl_check_run* r = c->run;
  int32_t best = -1;
  uintptr_t best_lo = 0;
  *inside = false;
  for (uint32_t i = 0; i < r->nargs; i++) {
    const uintptr_t lo = uintptr_t(c->args[i]);
    if (!lo || r->extents[i] == UINT64_MAX) continue;
    if (a >= lo && a + size <= lo + r->extents[i]) {
      *inside = true;
      return int32_t(i);
    }
    if (lo <= a && (best < 0 || lo > best_lo)) {
      best = int32_t(i);
      best_lo = lo;
    }
  }
  return best;
}

void* redirect(Checker* c, uint32_t size, uint32_t flags) {
  if (flags & ETM_MSL_READ) memset(c->scratch, 0, size < kScratchBytes ? size : kScratchBytes);
  return c->scratch;
}

void note_write(Checker* c, int32_t b) {
  BindingUse& u = c->uses[b];
  if (u.written) return;
  const etm_msl_thread& t = current_thread();
  u.written = true;
  for (int d = 0; d < 3; d++) {
    u.tg[d] = t.tg_id[d];
    u.thread[d] = t.tg_pos[d];
  }
}

void shadow_access(Checker* c, Region& reg, uint64_t off, uint32_t size, uint32_t flags,
                   uint32_t site) {
  const uint32_t self = current_thread().index_in_tg, e = c->epoch;
  Worker& w = worker();
  bool uninit = false, raw = false, war = false, waw = false;
  uint32_t raw_by = 0, war_by = 0, waw_by = 0;
  for (uint64_t i = off; i < off + size; i++) {
    Shadow& s = reg.shadow[i];
    if (flags & ETM_MSL_READ) {
      if (s.w_epoch == 0) {
        uninit = true;
      } else if (s.w_epoch == e && s.writer != self) {
        raw = true;
        raw_by = s.writer;
      }
      if (s.r_epoch != e) {
        s.r_epoch = e;
        s.reader = self;
      } else if (s.reader != self) {
        s.reader = kNoThread;
      }
    }
    if (flags & ETM_MSL_WRITE) {
      if (s.w_epoch == e && s.writer != self) {
        waw = true;
        waw_by = s.writer;
      }
      if (s.r_epoch == e && s.reader != self) {
        war = true;
        war_by = s.reader;
      }
      s.w_epoch = e;
      s.writer = self;
    }
  }
  auto pos = [&](uint32_t t, uint32_t* out) {
    for (int d = 0; d < 3; d++) out[d] = w.group->threads[t].info.tg_pos[d];
  };
  uint32_t other[3] = {0, 0, 0};
  const int64_t o = int64_t(off);
  if (uninit)
    record(c, ETM_FAULT_UNINIT_READ, -1, o, reg.size, size, site, nullptr, false, reg.site);
  if (raw) {
    pos(raw_by, other);
    record(c, ETM_FAULT_RACE_RAW, -1, o, reg.size, size, site, other, true, reg.site);
  }
  if (waw) {
    pos(waw_by, other);
    record(c, ETM_FAULT_RACE_WAW, -1, o, reg.size, size, site, other, true, reg.site);
  } else if (war) {
    const bool known = war_by != kNoThread;
    if (known) pos(war_by, other);
    record(c, ETM_FAULT_RACE_WAR, -1, o, reg.size, size, site, known ? other : nullptr, known,
           reg.site);
  }
}

// after the grid: bindings over overlapping, different ranges, one of them written
void check_aliasing(Checker* c) {
  const etm_msl_check_run* r = c->run;
  for (uint32_t i = 0; i < r->nargs; i++) {
    for (uint32_t j = 0; j < r->nargs; j++) {
      if (i == j || !c->uses[i].written) continue;
      if (j < i && c->uses[j].written) continue;  // the pair was seen from j
      const uintptr_t li = uintptr_t(c->args[i]), lj = uintptr_t(c->args[j]);
      const uint64_t ei = r->extents[i], ej = r->extents[j];
      if (!li || !lj || ei == UINT64_MAX || ej == UINT64_MAX || !ei || !ej) continue;
      const uintptr_t lo = li > lj ? li : lj, hi = li + ei < lj + ej ? li + ei : lj + ej;
      if (lo >= hi || (li == lj && ei == ej)) continue;
      etm_msl_check_run* rw = c->run;
      if (rw->nfaults >= rw->max_faults) {
        rw->dropped++;
        continue;
      }
      etm_msl_fault& f = rw->faults[rw->nfaults++];
      memset(&f, 0, sizeof f);
      f.kind = ETM_FAULT_ALIAS;
      f.buffer = int32_t(i);
      f.offset = int64_t(lo - li);
      f.extent = ei;
      f.site = kNoThread;
      f.overlap = hi - lo;
      f.count = 1;
      f.other[0] = j;
      f.other_known = 1;
      f.array_site = kNoThread;
      for (int d = 0; d < 3; d++) {
        f.tg[d] = c->uses[i].tg[d];
        f.thread[d] = c->uses[i].thread[d];
      }
    }
  }
}

}  // namespace

extern "C" {

void* etm_msl_check_device(const void* addr, uint32_t size, int32_t buffer, uint32_t flags,
                           uint32_t site) {
  Checker* c = worker().checker;
  if (!c) return const_cast<void*>(addr);  // a checked library run unchecked: no checks
  c->accesses++;
  const uintptr_t a = uintptr_t(addr);
  const etm_msl_check_run* r = c->run;
  bool inside = false;
  int32_t b = buffer;
  if (b >= 0 && uint32_t(b) < r->nargs && c->args[b]) {
    const uintptr_t lo = uintptr_t(c->args[b]);
    inside = r->extents[b] == UINT64_MAX || (a >= lo && a + size <= lo + r->extents[b]);
  } else {
    b = find_binding(c, a, size, &inside);
  }
  if (inside) {
    if ((flags & ETM_MSL_WRITE) && b >= 0) note_write(c, b);
    return const_cast<void*>(addr);
  }
  const uint32_t kind = (flags & ETM_MSL_WRITE) ? ETM_FAULT_OOB_WRITE : ETM_FAULT_OOB_READ;
  const int64_t off = b >= 0 ? int64_t(a - uintptr_t(c->args[b])) : int64_t(a);
  record(c, kind, b, off, b >= 0 ? r->extents[b] : 0, size, site, nullptr, false);
  return redirect(c, size, flags);
}

void* etm_msl_check_threadgroup(const void* addr, uint32_t size, const void* array,
                                uint32_t flags, uint32_t site) {
  Checker* c = worker().checker;
  if (!c) return const_cast<void*>(addr);
  c->accesses++;
  const uintptr_t a = uintptr_t(addr);
  // the array the access must stay in: the one its subscript names, else the one holding it
  // (else, for the report, the one starting last before it)
  Region* reg = nullptr;
  for (uint32_t i = 0; i < c->live; i++) {
    Region& r = c->regions[i];
    if (array ? r.base == uintptr_t(array) : (a >= r.base && a + size <= r.base + r.size)) {
      reg = &r;
      break;
    }
  }
  if (!reg && !array) {
    for (uint32_t i = 0; i < c->live; i++) {
      Region& r = c->regions[i];
      if (r.base <= a && (!reg || r.base > reg->base)) reg = &r;
    }
  }
  if (reg && a >= reg->base && a + size <= reg->base + reg->size) {
    shadow_access(c, *reg, a - reg->base, size, flags, site);
    return const_cast<void*>(addr);
  }
  const uint32_t kind = (flags & ETM_MSL_WRITE) ? ETM_FAULT_TG_OOB_WRITE : ETM_FAULT_TG_OOB_READ;
  const int64_t off = reg ? int64_t(a) - int64_t(reg->base) : 0;
  record(c, kind, -1, off, reg ? reg->size : 0, size, site, nullptr, false,
         reg ? reg->site : kNoThread);
  return redirect(c, size, flags);
}

void etm_msl_declare_threadgroup(const void* base, uint64_t size, uint32_t site) {
  Checker* c = worker().checker;
  if (!c) return;
  const uintptr_t b = uintptr_t(base);
  for (uint32_t i = 0; i < c->live; i++)
    if (c->regions[i].base == b) return;  // another thread of the threadgroup declared it
  if (size > kMaxShadowBytes) {  // far past Metal's 32 KB: refuse rather than allocate
    fail(worker().group, "the checker cannot shadow a threadgroup array of %llu bytes (its "
         "limit is %llu; Metal gives a threadgroup 32 KB)", (unsigned long long)size,
         (unsigned long long)kMaxShadowBytes);
    size = 0;
  }
  if (c->live == c->regions.size()) c->regions.emplace_back();
  Region& reg = c->regions[c->live++];
  reg.base = b;
  reg.size = size;
  reg.site = site;
  reg.shadow.assign(size, Shadow{0, 0, 0, 0});
  // poisoned, as a new threadgroup's memory is garbage on a GPU: an uninitialized read gives
  // all-ones bytes (NaN, -1), not what the previous threadgroup left
  memset(const_cast<void*>(base), 0xff, size);
}

int etm_msl_dispatch_checked(etm_msl_entry entry, void* const* args, const uint64_t* threads,
                             const uint64_t* group, etm_msl_check_run* run, char* err,
                             uint64_t err_len) {
  Worker& w = worker();
  if (w.group != nullptr || w.checker != nullptr) {
    snprintf(err, err_len, "dispatch from inside a running kernel");
    return 1;
  }
  Checker* c = new Checker();  // large (scratch, regions): not on the caller's stack
  c->run = run;
  c->args = args;
  c->uses.assign(run->nargs, BindingUse{});
  run->nfaults = 0;
  run->dropped = 0;
  w.checker = c;
  int rc = etm_msl_dispatch(entry, args, threads, group, err, err_len);
  w.checker = nullptr;
  if (rc == 0) check_aliasing(c);
  run->accesses = c->accesses;
  g_checked_accesses.fetch_add(c->accesses, std::memory_order_relaxed);
  delete c;
  return rc;
}

uint64_t etm_msl_checked_accesses(void) {
  return g_checked_accesses.load(std::memory_order_relaxed);
}

}  // extern "C"
