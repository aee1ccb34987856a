// OptiML's evaluation runner: a host program that loads a reference and a candidate kernel from
// shared objects, runs both on the same seeded inputs at every problem size, checks the candidate's
// outputs element by element and times both, interleaved, with CUDA events and an L2 flush.
//
// It is generic: what to run comes from a plan file written by optiml.harness.plan, so the runner
// is compiled once per toolkit and each evaluation compiles only its kernels.
//
//   runner PLAN RESULT.json REFERENCE.so|- CANDIDATE.so
//
// The result is JSON; progress ("phase ...") goes to stderr so that a caller that has to kill a
// hanging run can say where it hung.
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

typedef int (*launch_fn)(void** args, const unsigned* grid, const unsigned* block, size_t smem,
                         void* stream);
typedef int (*attrs_fn)(int* regs, int* local_bytes, int* static_smem, int* max_threads);
typedef int (*occupancy_fn)(int block_threads, size_t smem, int* blocks_per_sm);

// ---- small utilities -----------------------------------------------------------------------

static std::string g_result_path;

static std::string json_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if ((unsigned char)c < 0x20) {
          char buf[8];
          snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out;
}

static std::string num(double v) {
  if (std::isnan(v)) return "\"nan\"";
  if (std::isinf(v)) return v > 0 ? "\"inf\"" : "\"-inf\"";
  char buf[64];
  snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

static void phase(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "phase ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  fflush(stderr);
  va_end(ap);
}

// The JSON object being built; written out whole at the end or at the first fatal error.
static std::string g_device_json = "null";
static std::vector<std::string> g_cases_json;

static void write_result(const char* status, const std::string& who, const std::string& message) {
  std::ofstream f(g_result_path);
  f << "{\"status\": \"" << status << "\", \"failed\": \"" << json_escape(who)
    << "\", \"message\": \"" << json_escape(message) << "\", \"device\": " << g_device_json
    << ", \"cases\": [";
  for (size_t i = 0; i < g_cases_json.size(); ++i) f << (i ? ", " : "") << g_cases_json[i];
  f << "]}\n";
}

[[noreturn]] static void fail(const char* status, const std::string& who, const std::string& msg) {
  write_result(status, who, msg);
  exit(3);
}

static void check(cudaError_t e, const std::string& who, const char* what) {
  if (e != cudaSuccess) {
    fail("runtime_error", who,
         std::string(what) + ": " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
  }
}

#include "values.h"

enum Code { F64, F32, F16, BF16, I8, I16, I32, I64, U8, U16, U32, U64 };

struct DType {
  std::string name;
  Code code;
  size_t size;
  bool is_float, is_signed;
};

static DType dtype_of(const std::string& c) {
  static const struct { const char* name; Code code; size_t size; bool is_float, is_signed; } table[] = {
      {"f64", F64, 8, true, true},  {"f32", F32, 4, true, true},  {"f16", F16, 2, true, true},
      {"bf16", BF16, 2, true, true}, {"i8", I8, 1, false, true},   {"i16", I16, 2, false, true},
      {"i32", I32, 4, false, true},  {"i64", I64, 8, false, true}, {"u8", U8, 1, false, false},
      {"u16", U16, 2, false, false}, {"u32", U32, 4, false, false}, {"u64", U64, 8, false, false},
  };
  for (const auto& t : table)
    if (c == t.name) return {t.name, t.code, t.size, t.is_float, t.is_signed};
  fail("harness_error", "plan", "unknown type code " + c);
}

template <typename T>
OPTIML_HD static inline void put(void* dst, T v) { memcpy(dst, &v, sizeof(T)); }
template <typename T>
static inline T get(const void* src) { T v; memcpy(&v, src, sizeof(T)); return v; }

// Stores one element: `v` for floating-point types, `iv` for integer types.
OPTIML_HD static inline void store(Code code, void* dst, double v, int64_t iv) {
  switch (code) {
    case F64: put<double>(dst, v); break;
    case F32: put<float>(dst, (float)v); break;
    case F16: put<uint16_t>(dst, float_to_half_bits((float)v)); break;
    case BF16: put<uint16_t>(dst, float_to_bf16_bits((float)v)); break;
    case I8: put<int8_t>(dst, (int8_t)iv); break;
    case I16: put<int16_t>(dst, (int16_t)iv); break;
    case I32: put<int32_t>(dst, (int32_t)iv); break;
    case I64: put<int64_t>(dst, iv); break;
    case U8: put<uint8_t>(dst, (uint8_t)iv); break;
    case U16: put<uint16_t>(dst, (uint16_t)iv); break;
    case U32: put<uint32_t>(dst, (uint32_t)iv); break;
    case U64: put<uint64_t>(dst, (uint64_t)iv); break;
  }
}

static inline double load_float(const DType& d, const void* src) {
  switch (d.code) {
    case F64: return get<double>(src);
    case F32: return get<float>(src);
    case F16: return half_bits_to_float(get<uint16_t>(src));
    default: return bf16_bits_to_float(get<uint16_t>(src));
  }
}

static inline int64_t load_signed(const DType& d, const void* src) {
  switch (d.size) {
    case 1: return get<int8_t>(src);
    case 2: return get<int16_t>(src);
    case 4: return get<int32_t>(src);
    default: return get<int64_t>(src);
  }
}

static inline uint64_t load_unsigned(const DType& d, const void* src) {
  switch (d.size) {
    case 1: return get<uint8_t>(src);
    case 2: return get<uint16_t>(src);
    case 4: return get<uint32_t>(src);
    default: return get<uint64_t>(src);
  }
}

// Runs body(begin, end, chunk) over [0, n) on all cores: input generation and comparison of
// hundreds of millions of elements would otherwise dominate an evaluation.
template <typename F>
static void parallel_chunks(size_t n, size_t chunks, F body) {
  std::vector<std::thread> threads;
  size_t per = (n + chunks - 1) / chunks;
  for (size_t c = 0; c < chunks; ++c) {
    size_t begin = c * per, end = std::min(n, begin + per);
    if (begin >= end) break;
    threads.emplace_back(body, begin, end, c);
  }
  for (auto& t : threads) t.join();
}

static size_t worker_count(size_t n) {
  size_t hw = std::max(1u, std::thread::hardware_concurrency());
  return std::max<size_t>(1, std::min(hw, n / 65536 + 1));
}

// Poison: a NaN with a payload no arithmetic produces, or an unlikely integer pattern.
static void poison_bytes(const DType& d, std::vector<unsigned char>& pattern) {
  pattern.resize(d.size);
  switch (d.code) {
    case F64: put<uint64_t>(pattern.data(), 0x7FF4DEADBEEFCAFEull); break;
    case F32: put<uint32_t>(pattern.data(), 0x7FA5DEADu); break;
    case F16: put<uint16_t>(pattern.data(), 0x7D5Bu); break;
    case BF16: put<uint16_t>(pattern.data(), 0x7FA5u); break;
    default:
      for (size_t i = 0; i < d.size; ++i) pattern[i] = (unsigned char)(0xA5 ^ (i * 0x3C));
  }
}

// ---- the plan --------------------------------------------------------------------------------

struct Buffer {
  std::string name, role;  // role: in | out | inout
  DType dtype;
  double rtol, atol;
};

struct Param {
  bool is_buffer;
  int buffer;        // index into buffers
  DType dtype;       // scalars
};

struct Launch {
  unsigned grid[3], block[3];
  size_t smem;
};

struct Case {
  std::string label;
  Launch ref, cand;  // a candidate may bring its own launch configuration
  bool time;
  std::vector<size_t> lengths;        // per buffer
  std::vector<double> lo, hi;         // value range per buffer
  std::vector<std::string> scalars;   // per param ("-" for buffers)
  std::vector<std::string> expected;  // per buffer, per seed: files written by a NumPy reference
};

struct Plan {
  std::vector<uint64_t> seeds;
  std::vector<Buffer> buffers;
  std::vector<Param> params;
  std::vector<Case> cases;
  int reps_min = 20, reps_max = 200, warmup_max = 30, max_mismatches = 10;
  double target_ms = 400, flush_factor = 2.0, timeout_hint_s = 0;
  bool numpy_reference = false;
  bool profile_only = false;  // one launch of the candidate on the first seed's inputs, no checks
};

static Plan read_plan(const char* path) {
  std::ifstream f(path);
  if (!f) fail("harness_error", "plan", std::string("cannot open plan ") + path);
  Plan p;
  std::string line;
  Case* cur = nullptr;
  while (std::getline(f, line)) {
    std::istringstream in(line);
    std::string key;
    if (!(in >> key)) continue;
    if (key == "seeds") {
      uint64_t s;
      while (in >> s) p.seeds.push_back(s);
    } else if (key == "timing") {
      in >> p.reps_min >> p.reps_max >> p.target_ms >> p.warmup_max >> p.flush_factor;
    } else if (key == "max_mismatches") {
      in >> p.max_mismatches;
    } else if (key == "numpy_reference") {
      p.numpy_reference = true;
    } else if (key == "profile_only") {
      p.profile_only = true;
    } else if (key == "buffer") {
      Buffer b;
      std::string code;
      in >> b.name >> b.role >> code >> b.rtol >> b.atol;
      b.dtype = dtype_of(code);
      p.buffers.push_back(b);
    } else if (key == "param") {
      std::string kind, v;
      in >> kind >> v;
      Param prm{};
      if (kind == "buffer") {
        prm.is_buffer = true;
        prm.buffer = std::stoi(v);
      } else {
        prm.is_buffer = false;
        prm.dtype = dtype_of(v);
      }
      p.params.push_back(prm);
    } else if (key == "case") {
      p.cases.emplace_back();
      cur = &p.cases.back();
      std::getline(in >> std::ws, cur->label);
    } else if (cur && (key == "launch" || key == "candidate_launch")) {
      Launch l;
      in >> l.grid[0] >> l.grid[1] >> l.grid[2] >> l.block[0] >> l.block[1] >> l.block[2] >> l.smem;
      if (key == "launch") {
        cur->ref = cur->cand = l;
        int t;
        in >> t;
        cur->time = t != 0;
      } else {
        cur->cand = l;
      }
    } else if (cur && key == "length") {
      size_t n;
      double lo, hi;
      in >> n >> lo >> hi;
      cur->lengths.push_back(n);
      cur->lo.push_back(lo);
      cur->hi.push_back(hi);
    } else if (cur && key == "scalar") {
      std::string v;
      in >> v;
      cur->scalars.push_back(v);
    } else if (cur && key == "expected") {
      std::string v;
      in >> v;
      cur->expected.push_back(v);
    } else {
      fail("harness_error", "plan", "unknown plan line: " + line);
    }
  }
  return p;
}

// ---- scalars and buffers ---------------------------------------------------------------------

struct ScalarStorage {
  unsigned char bytes[8];
};

static ScalarStorage scalar_value(const DType& d, const std::string& text) {
  ScalarStorage s{};
  if (d.is_float) {
    store(d.code, s.bytes, strtod(text.c_str(), nullptr), 0);
  } else if (d.is_signed) {
    store(d.code, s.bytes, 0, strtoll(text.c_str(), nullptr, 10));
  } else {
    store(d.code, s.bytes, 0, (int64_t)strtoull(text.c_str(), nullptr, 10));
  }
  return s;
}

// Element i of an input: uniform in [lo, lo + span) (integers: floor of it), as inputs.py makes it.
// The same rounding on host and device: no fused multiply-add on either.
OPTIML_HD static inline void fill_value(Code code, bool is_float, size_t size, unsigned char* base,
                                        size_t i, double lo, double span, uint64_t seed,
                                        uint64_t buffer_index) {
  double u = uniform01(seed, buffer_index, i);
#ifdef __CUDA_ARCH__
  double scaled = __dmul_rn(u, span), value = __dadd_rn(lo, scaled);
#else
  double scaled = u * span, value = lo + scaled;
#endif
  if (is_float) {
    store(code, base + i * size, value, 0);
  } else {
    store(code, base + i * size, 0, (int64_t)lo + (int64_t)floor(scaled));
  }
}

static void fill_inputs(const Buffer& b, size_t buffer_index, size_t n, double lo, double hi,
                        uint64_t seed, std::vector<unsigned char>& host) {
  host.resize(n * b.dtype.size);
  const DType d = b.dtype;
  const double span = hi - lo;
  unsigned char* base = host.data();
  parallel_chunks(n, worker_count(n), [&](size_t begin, size_t end, size_t) {
    for (size_t i = begin; i < end; ++i)
      fill_value(d.code, d.is_float, d.size, base, i, lo, span, seed, buffer_index);
  });
}

__global__ void optiml_fill_input(unsigned char* base, Code code, bool is_float, size_t size,
                                  size_t n, double lo, double span, uint64_t seed,
                                  uint64_t buffer_index) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    fill_value(code, is_float, size, base, i, lo, span, seed, buffer_index);
}

__global__ void optiml_fill_pattern(unsigned char* base, size_t n, uint64_t pattern, size_t size) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    memcpy(base + i * size, &pattern, size);
}

struct Mismatch {
  size_t index;
  std::string expected, got;
  bool unwritten;
};

struct Comparison {
  size_t mismatches = 0, unwritten = 0;
  double max_abs = 0, max_rel = 0;
  std::vector<Mismatch> first;
};

static std::string show(const DType& d, const void* p) {
  char buf[64];
  if (d.is_float) {
    snprintf(buf, sizeof buf, "%.9g", load_float(d, p));
  } else if (d.is_signed) {
    snprintf(buf, sizeof buf, "%" PRId64, load_signed(d, p));
  } else {
    snprintf(buf, sizeof buf, "%" PRIu64, load_unsigned(d, p));
  }
  return buf;
}

static Comparison compare_range(const Buffer& b, const unsigned char* expected,
                                const unsigned char* got, size_t begin, size_t end,
                                int max_report) {
  Comparison c;
  const DType& d = b.dtype;
  std::vector<unsigned char> poison;
  poison_bytes(d, poison);
  const bool check_unwritten = b.role == "out";
  for (size_t i = begin; i < end; ++i) {
    const unsigned char* e = expected + i * d.size;
    const unsigned char* g = got + i * d.size;
    bool unwritten = check_unwritten && memcmp(g, poison.data(), d.size) == 0;
    bool ok;
    if (unwritten) {
      ok = false;
    } else if (d.is_float) {
      double ev = load_float(d, e), gv = load_float(d, g);
      if (std::isnan(ev)) {
        ok = std::isnan(gv);
      } else if (std::isinf(ev)) {
        ok = gv == ev;
      } else if (!std::isfinite(gv)) {
        ok = false;
      } else {
        double err = std::fabs(gv - ev);
        ok = err <= b.atol + b.rtol * std::fabs(ev);
        c.max_abs = std::max(c.max_abs, err);
        if (ev != 0) c.max_rel = std::max(c.max_rel, err / std::fabs(ev));
      }
    } else {
      ok = memcmp(e, g, d.size) == 0;
      if (!ok) {
        double err = d.is_signed ? std::fabs((double)load_signed(d, g) - (double)load_signed(d, e))
                                 : std::fabs((double)load_unsigned(d, g) - (double)load_unsigned(d, e));
        c.max_abs = std::max(c.max_abs, err);
      }
    }
    if (!ok) {
      c.mismatches++;
      if (unwritten) c.unwritten++;
      if ((int)c.first.size() < max_report) {
        c.first.push_back({i, show(d, e), unwritten ? std::string("(unwritten)") : show(d, g),
                           unwritten});
      }
    }
  }
  return c;
}

// Every element of one output, in parallel chunks merged in index order.
static Comparison compare(const Buffer& b, const std::vector<unsigned char>& expected,
                          const std::vector<unsigned char>& got, size_t n, int max_report) {
  size_t chunks = worker_count(n);
  std::vector<Comparison> parts(chunks);
  parallel_chunks(n, chunks, [&](size_t begin, size_t end, size_t k) {
    parts[k] = compare_range(b, expected.data(), got.data(), begin, end, max_report);
  });
  Comparison c;
  for (const Comparison& p : parts) {
    c.mismatches += p.mismatches;
    c.unwritten += p.unwritten;
    c.max_abs = std::max(c.max_abs, p.max_abs);
    c.max_rel = std::max(c.max_rel, p.max_rel);
    for (const Mismatch& m : p.first)
      if ((int)c.first.size() < max_report) c.first.push_back(m);
  }
  return c;
}

// ---- NVML, loaded at run time so that the runner needs no NVML headers or link ---------------

struct Nvml {
  void* lib = nullptr;
  void* device = nullptr;
  int (*clock_info)(void*, int, unsigned*) = nullptr;
  bool ok = false;

  void open(int cuda_device) {
    lib = dlopen("libnvidia-ml.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (!lib) return;
    auto init = (int (*)())dlsym(lib, "nvmlInit_v2");
    auto by_pci = (int (*)(const char*, void**))dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2");
    clock_info = (int (*)(void*, int, unsigned*))dlsym(lib, "nvmlDeviceGetClockInfo");
    if (!init || !by_pci || !clock_info || init() != 0) return;
    char pci[64];
    if (cudaDeviceGetPCIBusId(pci, sizeof pci, cuda_device) != cudaSuccess) return;
    ok = by_pci(pci, &device) == 0;
  }

  // NVML_CLOCK_SM is 1; -1 when NVML is not there.
  int sm_clock_mhz() {
    unsigned mhz = 0;
    if (!ok || clock_info(device, 1, &mhz) != 0) return -1;
    return (int)mhz;
  }
};

// ---- timing ----------------------------------------------------------------------------------

struct Stats {
  double median_ms, q1_ms, q3_ms, min_ms;
  int reps;
};

static double percentile(std::vector<float> v, double q) {
  std::sort(v.begin(), v.end());
  double pos = q * (v.size() - 1);
  size_t lo = (size_t)pos;
  size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (pos - lo) * (v[hi] - v[lo]);
}

static Stats stats_of(const std::vector<float>& v) {
  Stats s;
  s.median_ms = percentile(v, 0.5);
  s.q1_ms = percentile(v, 0.25);
  s.q3_ms = percentile(v, 0.75);
  s.min_ms = *std::min_element(v.begin(), v.end());
  s.reps = (int)v.size();
  return s;
}

static std::string stats_json(const Stats& s) {
  return "{\"median_ms\": " + num(s.median_ms) + ", \"q1_ms\": " + num(s.q1_ms) +
         ", \"q3_ms\": " + num(s.q3_ms) + ", \"min_ms\": " + num(s.min_ms) +
         ", \"reps\": " + std::to_string(s.reps) + "}";
}

// ---- main ------------------------------------------------------------------------------------

struct Kernel {
  std::string who;
  launch_fn launch = nullptr;
  attrs_fn attrs = nullptr;
  occupancy_fn occupancy = nullptr;
};

static Kernel load_kernel(const char* path, const std::string& who) {
  Kernel k;
  k.who = who;
  void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) fail("harness_error", who, std::string("cannot load ") + path + ": " + dlerror());
  k.launch = (launch_fn)dlsym(h, "optiml_launch");
  k.attrs = (attrs_fn)dlsym(h, "optiml_attributes");
  k.occupancy = (occupancy_fn)dlsym(h, "optiml_occupancy");
  if (!k.launch) fail("harness_error", who, std::string("no optiml_launch in ") + path);
  return k;
}

static std::string attributes_json(const Kernel& k, const Launch& l) {
  int regs = 0, local = 0, smem = 0, max_threads = 0, blocks = 0;
  if (!k.attrs || k.attrs(&regs, &local, &smem, &max_threads) != 0) return "null";
  int threads = (int)(l.block[0] * l.block[1] * l.block[2]);
  if (k.occupancy) k.occupancy(threads, l.smem, &blocks);
  return "{\"registers\": " + std::to_string(regs) + ", \"local_bytes\": " + std::to_string(local) +
         ", \"static_smem\": " + std::to_string(smem) + ", \"max_threads_per_block\": " +
         std::to_string(max_threads) + ", \"blocks_per_sm\": " + std::to_string(blocks) + "}";
}

int main(int argc, char** argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: %s PLAN RESULT.json REFERENCE.so|- CANDIDATE.so\n", argv[0]);
    return 2;
  }
  g_result_path = argv[2];
  Plan plan = read_plan(argv[1]);
  bool same = strcmp(argv[3], argv[4]) == 0;
  bool have_reference = strcmp(argv[3], "-") != 0;
  if (!have_reference && !plan.numpy_reference)
    fail("harness_error", "plan", "no reference kernel and no NumPy reference");

  int dev = 0;
  check(cudaSetDevice(dev), "harness", "cudaSetDevice");
  cudaDeviceProp prop;
  check(cudaGetDeviceProperties(&prop, dev), "harness", "cudaGetDeviceProperties");
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  Nvml nvml;
  nvml.open(dev);
  {
    std::ostringstream d;
    d << "{\"name\": \"" << json_escape(prop.name) << "\", \"compute_capability\": \""
      << prop.major << "." << prop.minor << "\", \"sm_count\": " << prop.multiProcessorCount
      << ", \"l2_bytes\": " << prop.l2CacheSize << ", \"memory_bytes\": " << prop.totalGlobalMem
      << ", \"driver_version\": " << driver << ", \"runtime_version\": " << runtime
      << ", \"sm_clock_idle_mhz\": " << nvml.sm_clock_mhz() << "}";
    g_device_json = d.str();
  }

  // With no candidate the kernel is checked against a second run of itself: call both "kernel".
  Kernel reference, candidate = load_kernel(argv[4], same ? "kernel" : "candidate");
  if (have_reference) reference = same ? candidate : load_kernel(argv[3], "reference");

  cudaStream_t stream;
  check(cudaStreamCreate(&stream), "harness", "cudaStreamCreate");
  size_t flush_bytes = (size_t)(plan.flush_factor * std::max(prop.l2CacheSize, 1 << 22));
  void* flush = nullptr;
  check(cudaMalloc(&flush, flush_bytes), "harness", "allocating the L2 flush buffer");

  const size_t nb = plan.buffers.size();
  for (size_t ci = 0; ci < plan.cases.size(); ++ci) {
    const Case& c = plan.cases[ci];
    std::vector<void*> dev_bufs(nb, nullptr), pristine(nb, nullptr);
    for (size_t b = 0; b < nb; ++b) {
      size_t bytes = c.lengths[b] * plan.buffers[b].dtype.size;
      check(cudaMalloc(&dev_bufs[b], bytes), "harness", "cudaMalloc");
      if (plan.buffers[b].role == "inout")
        check(cudaMalloc(&pristine[b], bytes), "harness", "cudaMalloc");
    }
    std::vector<ScalarStorage> scalars(plan.params.size());
    std::vector<void*> args(plan.params.size());
    for (size_t i = 0; i < plan.params.size(); ++i) {
      const Param& prm = plan.params[i];
      if (prm.is_buffer) {
        args[i] = &dev_bufs[prm.buffer];
      } else {
        scalars[i] = scalar_value(prm.dtype, c.scalars[i]);
        args[i] = scalars[i].bytes;
      }
    }

    // Poisoned images of the `out` buffers, made once per case (a profiler's run makes its own).
    std::vector<std::vector<unsigned char>> poisoned(nb);
    for (size_t b = 0; b < nb; ++b) {
      const Buffer& buf = plan.buffers[b];
      if (buf.role != "out" || plan.profile_only) continue;
      std::vector<unsigned char> pattern;
      poison_bytes(buf.dtype, pattern);
      poisoned[b].resize(c.lengths[b] * buf.dtype.size);
      unsigned char* base = poisoned[b].data();
      parallel_chunks(c.lengths[b], worker_count(c.lengths[b]), [&](size_t begin, size_t end, size_t) {
        for (size_t i = begin; i < end; ++i) memcpy(base + i * pattern.size(), pattern.data(), pattern.size());
      });
    }
    auto upload = [&](const std::vector<std::vector<unsigned char>>& host) {
      for (size_t b = 0; b < nb; ++b) {
        const Buffer& buf = plan.buffers[b];
        const std::vector<unsigned char>& src = buf.role == "out" ? poisoned[b] : host[b];
        check(cudaMemcpy(dev_bufs[b], src.data(), src.size(), cudaMemcpyHostToDevice), "harness",
              buf.role == "out" ? "poisoning an output" : "uploading an input");
      }
    };
    auto launch_of = [&](const Kernel& k) -> const Launch& { return &k == &candidate ? c.cand : c.ref; };
    auto run = [&](const Kernel& k, const char* what) {
      check(cudaGetLastError(), "harness", "before launch");
      const Launch& l = launch_of(k);
      int rc = k.launch(args.data(), l.grid, l.block, l.smem, stream);
      if (rc != 0)
        check((cudaError_t)rc, k.who, (std::string("launching the ") + what).c_str());
      check(cudaStreamSynchronize(stream), k.who,
            (std::string("running the ") + what).c_str());
      check(cudaGetLastError(), k.who, (std::string("after the ") + what).c_str());
    };
    auto download = [&](std::vector<std::vector<unsigned char>>& host) {
      host.assign(nb, {});
      for (size_t b = 0; b < nb; ++b) {
        if (plan.buffers[b].role == "in") continue;
        host[b].resize(c.lengths[b] * plan.buffers[b].dtype.size);
        check(cudaMemcpy(host[b].data(), dev_bufs[b], host[b].size(), cudaMemcpyDeviceToHost),
              "harness", "downloading an output");
      }
    };

    if (plan.profile_only) {
      // For a profiler: the candidate's one launch is all it watches. Its inputs are those the
      // checks make (the same function of seed, buffer and index) and its outputs are poisoned
      // alike, but both are made on the device: making and uploading hundreds of megabytes on the
      // host would be most of a profile's cost.
      for (size_t b = 0; b < nb; ++b) {
        const Buffer& buf = plan.buffers[b];
        const DType& d = buf.dtype;
        const size_t n = c.lengths[b];
        if (n == 0) continue;
        const unsigned blocks =
            (unsigned)std::min<size_t>((n + 255) / 256, (size_t)prop.multiProcessorCount * 16);
        unsigned char* base = static_cast<unsigned char*>(dev_bufs[b]);
        if (buf.role == "out") {
          std::vector<unsigned char> pattern;
          poison_bytes(d, pattern);
          uint64_t bits = 0;
          memcpy(&bits, pattern.data(), pattern.size());
          optiml_fill_pattern<<<blocks, 256, 0, stream>>>(base, n, bits, d.size);
        } else {
          optiml_fill_input<<<blocks, 256, 0, stream>>>(base, d.code, d.is_float, d.size, n,
                                                        c.lo[b], c.hi[b] - c.lo[b], plan.seeds[0], b);
        }
        check(cudaGetLastError(), "harness", "filling an input on the device");
      }
      check(cudaStreamSynchronize(stream), "harness", "filling the inputs on the device");
      phase("case=%zu seed=%" PRIu64 " kernel=%s", ci, plan.seeds[0], candidate.who.c_str());
      run(candidate, candidate.who.c_str());
      for (size_t b = 0; b < nb; ++b) {
        cudaFree(dev_bufs[b]);
        if (pristine[b]) cudaFree(pristine[b]);
      }
      continue;
    }
    std::ostringstream cj;
    auto launch_json = [](const Launch& l) {
      std::ostringstream o;
      o << "{\"grid\": [" << l.grid[0] << ", " << l.grid[1] << ", " << l.grid[2] << "], \"block\": ["
        << l.block[0] << ", " << l.block[1] << ", " << l.block[2] << "], \"smem\": " << l.smem << "}";
      return o.str();
    };
    cj << "{\"label\": \"" << json_escape(c.label) << "\", \"launch\": {\"candidate\": "
       << launch_json(c.cand) << ", \"reference\": " << launch_json(c.ref)
       << "}, \"attributes\": {\"candidate\": " << attributes_json(candidate, c.cand)
       << ", \"reference\": " << (have_reference ? attributes_json(reference, c.ref) : "null")
       << "}, \"seeds\": [";
    std::vector<std::vector<unsigned char>> inputs(nb), ref_out, cand_out;
    bool case_ok = true;
    for (size_t si = 0; si < plan.seeds.size(); ++si) {
      uint64_t seed = plan.seeds[si];
      for (size_t b = 0; b < nb; ++b) {
        if (plan.buffers[b].role != "out")
          fill_inputs(plan.buffers[b], b, c.lengths[b], c.lo[b], c.hi[b], seed, inputs[b]);
      }
      if (have_reference) {
        phase("case=%zu seed=%" PRIu64 " kernel=%s", ci, seed, reference.who.c_str());
        upload(inputs);
        run(reference, reference.who.c_str());
        download(ref_out);
      } else {
        ref_out.assign(nb, {});
        for (size_t b = 0; b < nb; ++b) {
          if (plan.buffers[b].role == "in") continue;
          const std::string& path = c.expected[si * nb + b];
          std::ifstream f(path, std::ios::binary);
          ref_out[b].resize(c.lengths[b] * plan.buffers[b].dtype.size);
          if (!f.read((char*)ref_out[b].data(), ref_out[b].size()))
            fail("harness_error", "reference", "cannot read expected output " + path);
        }
      }
      phase("case=%zu seed=%" PRIu64 " kernel=%s", ci, seed, candidate.who.c_str());
      upload(inputs);
      run(candidate, candidate.who.c_str());
      download(cand_out);
      cj << (si ? ", " : "") << "{\"seed\": " << seed << ", \"buffers\": [";
      bool first_buf = true;
      for (size_t b = 0; b < nb; ++b) {
        const Buffer& buf = plan.buffers[b];
        if (buf.role == "in") continue;
        Comparison cmp = compare(buf, ref_out[b], cand_out[b], c.lengths[b], plan.max_mismatches);
        if (cmp.mismatches) case_ok = false;
        cj << (first_buf ? "" : ", ") << "{\"name\": \"" << buf.name
           << "\", \"mismatches\": " << cmp.mismatches << ", \"unwritten\": " << cmp.unwritten
           << ", \"max_abs_error\": " << num(cmp.max_abs)
           << ", \"max_rel_error\": " << num(cmp.max_rel) << ", \"first\": [";
        for (size_t m = 0; m < cmp.first.size(); ++m) {
          cj << (m ? ", " : "") << "{\"index\": " << cmp.first[m].index << ", \"expected\": \""
             << cmp.first[m].expected << "\", \"got\": \"" << cmp.first[m].got
             << "\", \"unwritten\": " << (cmp.first[m].unwritten ? "true" : "false") << "}";
        }
        cj << "]}";
        first_buf = false;
      }
      cj << "]}";
    }
    cj << "], \"timing\": ";

    if (c.time && case_ok) {
      // Pristine copies of inout buffers, restored before every timed launch, so that every launch
      // sees the inputs the check saw (and no launch gets data already in L2).
      for (size_t b = 0; b < nb; ++b) {
        if (!pristine[b]) continue;
        check(cudaMemcpy(pristine[b], inputs[b].data(), inputs[b].size(), cudaMemcpyHostToDevice),
              "harness", "uploading an input");
      }
      upload(inputs);
      std::vector<const Kernel*> series;
      series.push_back(&candidate);
      if (have_reference && !same) series.push_back(&reference);
      std::vector<cudaEvent_t> ev_start, ev_stop;
      auto timed_round = [&](int reps, std::vector<std::vector<float>>& out) {
        size_t need = (size_t)reps * series.size();
        while (ev_start.size() < need) {
          cudaEvent_t a, b;
          check(cudaEventCreate(&a), "harness", "cudaEventCreate");
          check(cudaEventCreate(&b), "harness", "cudaEventCreate");
          ev_start.push_back(a);
          ev_stop.push_back(b);
        }
        for (int r = 0; r < reps; ++r) {
          for (size_t s = 0; s < series.size(); ++s) {
            for (size_t b = 0; b < nb; ++b) {
              if (pristine[b])
                cudaMemcpyAsync(dev_bufs[b], pristine[b], inputs[b].size(),
                                cudaMemcpyDeviceToDevice, stream);
            }
            cudaMemsetAsync(flush, r & 0xFF, flush_bytes, stream);
            size_t e = (size_t)r * series.size() + s;
            cudaEventRecord(ev_start[e], stream);
            const Launch& l = launch_of(*series[s]);
            int rc = series[s]->launch(args.data(), l.grid, l.block, l.smem, stream);
            if (rc != 0) check((cudaError_t)rc, series[s]->who, "launching a timed run");
            cudaEventRecord(ev_stop[e], stream);
          }
        }
        check(cudaStreamSynchronize(stream), "harness", "timed runs");
        out.assign(series.size(), {});
        for (int r = 0; r < reps; ++r) {
          for (size_t s = 0; s < series.size(); ++s) {
            size_t e = (size_t)r * series.size() + s;
            float ms = 0;
            check(cudaEventElapsedTime(&ms, ev_start[e], ev_stop[e]), "harness", "event time");
            out[s].push_back(ms);
          }
        }
      };
      phase("case=%zu warmup", ci);
      // Warm up in rounds of 5 until the medians of two rounds agree within 2 % for every series.
      std::vector<std::vector<float>> prev, cur;
      int warm_rounds = 0;
      timed_round(5, prev);
      while (warm_rounds++ < plan.warmup_max / 5) {
        timed_round(5, cur);
        bool stable = true;
        for (size_t s = 0; s < series.size(); ++s) {
          double a = percentile(prev[s], 0.5), b = percentile(cur[s], 0.5);
          if (std::fabs(a - b) > 0.02 * std::max(a, b)) stable = false;
        }
        prev = cur;
        if (stable) break;
      }
      double per_round_ms = 0;
      for (size_t s = 0; s < series.size(); ++s) per_round_ms += percentile(prev[s], 0.5);
      int reps = (int)std::ceil(plan.target_ms / std::max(per_round_ms, 1e-3));
      reps = std::max(plan.reps_min, std::min(plan.reps_max, reps));
      phase("case=%zu timing reps=%d", ci, reps);
      int clock_before = nvml.sm_clock_mhz();
      std::vector<std::vector<float>> times;
      timed_round(reps, times);
      int clock_after = nvml.sm_clock_mhz();
      for (auto e : ev_start) cudaEventDestroy(e);
      for (auto e : ev_stop) cudaEventDestroy(e);
      cj << "{\"candidate\": " << stats_json(stats_of(times[0]))
         << ", \"reference\": " << (series.size() > 1 ? stats_json(stats_of(times[1])) : "null")
         << ", \"warmup_rounds\": " << warm_rounds << ", \"sm_clock_mhz\": ["
         << clock_before << ", " << clock_after << "], \"candidate_ms\": [";
      for (size_t i = 0; i < times[0].size(); ++i) cj << (i ? ", " : "") << num(times[0][i]);
      cj << "]}";
    } else {
      cj << "null";
    }
    cj << "}";
    g_cases_json.push_back(cj.str());
    for (size_t b = 0; b < nb; ++b) {
      cudaFree(dev_bufs[b]);
      if (pristine[b]) cudaFree(pristine[b]);
    }
  }
  write_result("done", "", "");
  return 0;
}
