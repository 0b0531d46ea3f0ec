// A native ONNX Runtime custom-op library running lstm_tvm exports (no Python at run time).
//
// ONNX Runtime loads it with SessionOptions.register_custom_ops_library (C API:
// RegisterCustomOpsLibrary_V2) and calls RegisterCustomOps below, which reads the session config
// entry LSTM_TVM_ORT_CONFIG_EXPORT_DIRS (export folders written by `lstm-tvm export`,
// separated by ':'), loads each folder's lstm_tvm_ops.so with TVM's runtime and registers, in
// the domain LSTM_TVM_ORT_DOMAIN (lstm_tvm.onnx.DOMAIN, defined on the compiler's command
// line), one op per (op, dtype) found in the manifests. Everything about an op (inputs,
// outputs, dtypes, shapes, the baked attributes) comes from the manifests, which lstm_tvm
// writes from its registry: nothing is restated here.
//
// A node's kernel is created for the exports of its (op, dtype) whose attributes equal the
// node's (every attribute of the export must be on the node: lstm_tvm.onnx.make_node writes
// them all); a call picks the export whose static dims (I, H) match its inputs. Inputs and
// outputs are passed to the TVM function in place as DLTensors (zero copies) when their data
// is 64-byte aligned, which is what the kernels need and what ONNX Runtime's CPU allocator
// gives; a misaligned buffer (e.g. a NumPy array fed from Python) is copied through an aligned
// one, counted by lstm_tvm_ort_copy_count(). Where an export has a prepacked kernel (the
// manifest's "prepacked": the sequence ops and LSTMBlockCell) and the node's w is a constant
// initializer, the kernel packs w into that kernel's panels (passed between the inputs and
// the outputs) once, when ONNX Runtime creates it, and calls the prepacked kernel from then
// on (counted by lstm_tvm_ort_prepacked_count()), as ONNX Runtime's own LSTM packs its
// weights once per session. Every failure (no matching export, a missing or
// mistyped attribute, a wrong rank or shape, seq_len_max outside [0, T], a TVM error) is an
// OrtStatus: ONNX Runtime raises it, nothing aborts.
//
// TVM gives every thread that launches a kernel a thread pool of its own. With the optional
// session config entry LSTM_TVM_ORT_CONFIG_KERNEL_THREADS (an int >= 1; lstm_tvm sets it for
// ONNX Runtime's parallel executor, whose thread that called Run spins on a core until the
// nodes are done) each thread running one of the session's nodes sizes its pool to that many
// threads before its kernel; unset, a kernel uses every core.
//
// Headers: ONNX Runtime's onnxruntime_c_api.h (C API only; any ORT_API_VERSION up to the
// runtime's, the C API is backward compatible) and tvm-ffi's. Libraries: libtvm_runtime.so
// (--no-as-needed: the kernels call its thread pool) and libtvm_ffi.so; not libonnxruntime.
// lstm_tvm.onnx.native.build_command() prints the g++ line; the LSTM_TVM_* macros below are
// lstm_tvm.onnx.native.compile_definitions().

#include <dlpack/dlpack.h>
#include <onnxruntime_c_api.h>
#include <tvm/ffi/container/array.h>
#include <tvm/ffi/container/map.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/json.h>
#include <tvm/ffi/extra/module.h>
#include <tvm/ffi/function.h>

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#ifndef LSTM_TVM_ORT_DOMAIN
#error "define LSTM_TVM_ORT_DOMAIN (lstm_tvm.onnx.DOMAIN), e.g. -DLSTM_TVM_ORT_DOMAIN='\"org.lstm_tvm\"'"
#endif
#ifndef LSTM_TVM_POOL_SPIN_COUNT
#error "define LSTM_TVM_POOL_SPIN_COUNT (lstm_tvm.env.POOL_SPIN_COUNT), e.g. -DLSTM_TVM_POOL_SPIN_COUNT='\"1000\"'"
#endif
#if !defined(LSTM_TVM_ORT_CONFIG_EXPORT_DIRS) || !defined(LSTM_TVM_ORT_CONFIG_KERNEL_THREADS)
#error "define LSTM_TVM_ORT_CONFIG_EXPORT_DIRS and LSTM_TVM_ORT_CONFIG_KERNEL_THREADS (lstm_tvm.onnx.native.compile_definitions())"
#endif

namespace ffi = tvm::ffi;
using JsonObject = ffi::Map<ffi::Any, ffi::Any>;
using JsonArray = ffi::Array<ffi::Any>;

namespace {

constexpr const char* kConfigKey = LSTM_TVM_ORT_CONFIG_EXPORT_DIRS;
constexpr const char* kThreadsKey = LSTM_TVM_ORT_CONFIG_KERNEL_THREADS;
constexpr size_t kAlignment = 64;  // TVM's allocation alignment; the kernels assume it

const OrtApi* g_api = nullptr;
std::atomic<int64_t> g_copies{0};
std::atomic<int64_t> g_prepacked{0};
std::atomic<int64_t> g_kernel_threads{0};  // the size pools were last given (0: none)

// An error that becomes an OrtStatus with this code.
struct OrtError : std::runtime_error {
  OrtErrorCode code;
  OrtError(OrtErrorCode c, const std::string& msg) : std::runtime_error(msg), code(c) {}
};

[[noreturn]] void Fail(const std::string& msg, OrtErrorCode code = ORT_INVALID_ARGUMENT) {
  throw OrtError(code, msg);
}

// Turn an OrtStatus from an API call into an OrtError (and release it).
void Check(OrtStatus* status, const std::string& what) {
  if (status == nullptr) return;
  std::string msg = what + ": " + g_api->GetErrorMessage(status);
  OrtErrorCode code = g_api->GetErrorCode(status);
  g_api->ReleaseStatus(status);
  throw OrtError(code, msg);
}

// Run fn, converting any exception into an OrtStatus (nothing may cross the C boundary).
template <typename Fn>
OrtStatus* Guard(const char* where, Fn&& fn) noexcept {
  try {
    fn();
    return nullptr;
  } catch (const OrtError& err) {
    return g_api->CreateStatus(err.code, (std::string(where) + ": " + err.what()).c_str());
  } catch (const std::exception& err) {  // tvm::ffi::Error derives from std::exception
    return g_api->CreateStatus(ORT_FAIL, (std::string(where) + ": " + err.what()).c_str());
  } catch (...) {
    return g_api->CreateStatus(ORT_FAIL, (std::string(where) + ": unknown error").c_str());
  }
}

std::string Str(const ffi::Any& v) { return std::string(v.cast<ffi::String>()); }

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  if (!in) Fail("cannot open " + path, ORT_NO_SUCHFILE);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// --- SHA-256 (FIPS 180-4): an export's library is checked against its manifest before it is
// mapped (a damaged file must fail with an error, not a SIGBUS inside the loader) ---------------

class Sha256 {
 public:
  void Update(const unsigned char* data, size_t n) {
    bits_ += static_cast<uint64_t>(n) * 8;
    while (n > 0) {
      size_t take = std::min(n, sizeof(buf_) - used_);
      std::memcpy(buf_ + used_, data, take);
      used_ += take;
      data += take;
      n -= take;
      if (used_ == sizeof(buf_)) {
        Block(buf_);
        used_ = 0;
      }
    }
  }

  std::string HexDigest() {
    uint64_t bits = bits_;
    const unsigned char pad = 0x80, zero = 0;
    Update(&pad, 1);
    while (used_ != 56) Update(&zero, 1);
    unsigned char length[8];
    for (int i = 0; i < 8; ++i) length[i] = static_cast<unsigned char>(bits >> (56 - 8 * i));
    Update(length, 8);
    static const char* hex = "0123456789abcdef";
    std::string out;
    for (uint32_t word : h_) {
      for (int shift = 28; shift >= 0; shift -= 4) out += hex[(word >> shift) & 0xf];
    }
    return out;
  }

 private:
  static uint32_t Rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

  void Block(const unsigned char* p) {
    static const uint32_t k[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
    };
    uint32_t w[64];
    for (int i = 0; i < 16; ++i) {
      w[i] = (uint32_t(p[4 * i]) << 24) | (uint32_t(p[4 * i + 1]) << 16) |
             (uint32_t(p[4 * i + 2]) << 8) | uint32_t(p[4 * i + 3]);
    }
    for (int i = 16; i < 64; ++i) {
      uint32_t s0 = Rotr(w[i - 15], 7) ^ Rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
      uint32_t s1 = Rotr(w[i - 2], 17) ^ Rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h_[0], b = h_[1], c = h_[2], d = h_[3], e = h_[4], f = h_[5], g = h_[6],
             h = h_[7];
    for (int i = 0; i < 64; ++i) {
      uint32_t t1 = h + (Rotr(e, 6) ^ Rotr(e, 11) ^ Rotr(e, 25)) + ((e & f) ^ (~e & g)) + k[i] +
                    w[i];
      uint32_t t2 = (Rotr(a, 2) ^ Rotr(a, 13) ^ Rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
      h = g;
      g = f;
      f = e;
      e = d + t1;
      d = c;
      c = b;
      b = a;
      a = t1 + t2;
    }
    h_[0] += a;
    h_[1] += b;
    h_[2] += c;
    h_[3] += d;
    h_[4] += e;
    h_[5] += f;
    h_[6] += g;
    h_[7] += h;
  }

  uint32_t h_[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  unsigned char buf_[64] = {};
  size_t used_ = 0;
  uint64_t bits_ = 0;
};

std::string FileSha256(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) Fail("cannot open " + path, ORT_NO_SUCHFILE);
  Sha256 sha;
  std::vector<char> chunk(1 << 20);
  while (in) {
    in.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
    sha.Update(reinterpret_cast<const unsigned char*>(chunk.data()),
               static_cast<size_t>(in.gcount()));
  }
  if (in.bad()) Fail("cannot read " + path, ORT_NO_SUCHFILE);
  return sha.HexDigest();
}

// --- the manifests ---------------------------------------------------------------------------

struct Dim {  // a static size, or a symbol ("T", "B") bound from the inputs
  int64_t value = 0;
  std::string symbol;
};

struct Param {
  std::string name;
  bool input = true, scalar = false;
  DLDataType dtype{};
  ONNXTensorElementDataType ort_type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  std::vector<Dim> shape;
  bool has_range = false;
  Dim lo, hi;
};

struct Attr {  // an attribute baked into an export: bools are ONNX INT, floats ONNX FLOAT
  std::string name;
  bool is_bool = false;
  double value = 0;
};

struct ExportedOp {
  std::string op, dtype, dir, function;
  std::vector<Param> params;
  std::vector<Attr> attrs;
  ffi::Function func;
  // The prepacked kernel, the function packing w into its panels, the panels' shapes (float32)
  // and the index of w in params (inputs come first: also its index among the inputs); none
  // without a "prepacked" entry.
  bool has_prepacked = false;
  ffi::Function prepacked, pack;
  std::vector<std::vector<int64_t>> panels;
  size_t w_input = 0;
  std::string Describe() const {
    std::string s = dir + " (";
    for (const Param& p : params) {
      if (!p.input || p.scalar) continue;
      s += p.name + "[";
      for (size_t k = 0; k < p.shape.size(); ++k) {
        s += (k ? "," : "") + (p.shape[k].symbol.empty() ? std::to_string(p.shape[k].value)
                                                          : p.shape[k].symbol);
      }
      s += "] ";
      break;  // the first tensor input (x) shows I
    }
    std::ostringstream values;
    for (const Attr& a : attrs) {
      values << a.name << "=";
      if (a.is_bool) {
        values << (a.value != 0 ? "true" : "false");
      } else {
        values << a.value;
      }
      values << " ";
    }
    return s + values.str() + ")";
  }
};

Dim ParseDim(const ffi::Any& d) {
  Dim out;
  if (auto sym = d.try_cast<ffi::String>()) {
    out.symbol = std::string(*sym);
  } else {
    out.value = d.cast<int64_t>();
  }
  return out;
}

void ParseDType(const std::string& name, Param* p) {
  if (name == "float32") {
    p->dtype = DLDataType{kDLFloat, 32, 1};
    p->ort_type = ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
  } else if (name == "float16") {
    p->dtype = DLDataType{kDLFloat, 16, 1};
    p->ort_type = ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16;
  } else if (name == "int64") {
    p->dtype = DLDataType{kDLInt, 64, 1};
    p->ort_type = ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64;
  } else {
    Fail("unsupported dtype " + name + " in a manifest");
  }
}

Attr ParseAttr(const std::string& name, const ffi::Any& v) {
  Attr a;
  a.name = name;
  if (auto b = v.as<bool>()) {
    a.is_bool = true;
    a.value = *b ? 1 : 0;
  } else if (auto f = v.as<double>()) {
    a.value = *f;
  } else if (auto i = v.as<int64_t>()) {
    a.value = static_cast<double>(*i);
  } else {
    Fail("attribute " + name + ": unsupported manifest value");
  }
  return a;
}

ffi::Function Function(const ffi::Module& mod, const std::string& dir, const std::string& name) {
  ffi::Optional<ffi::Function> func = mod->GetFunction(ffi::String(name));
  if (!func.has_value()) Fail(dir + ": function " + name + " missing from the library");
  return *func;
}

// Loaded libraries, by folder; kept for the life of the process (kernels point into them).
std::mutex g_mutex;
std::map<std::string, std::vector<std::shared_ptr<const ExportedOp>>> g_loaded;

std::vector<std::shared_ptr<const ExportedOp>> LoadExport(const std::string& dir) {
  std::lock_guard<std::mutex> lock(g_mutex);
  auto found = g_loaded.find(dir);
  if (found != g_loaded.end()) return found->second;
  JsonObject manifest;
  try {
    manifest = ffi::json::Parse(ReadText(dir + "/manifest.json")).cast<JsonObject>();
  } catch (const OrtError&) {
    throw;
  } catch (const std::exception& err) {
    Fail(dir + "/manifest.json: " + err.what());
  }
  if (Str(manifest.at("format")) != "lstm_tvm.export" ||
      manifest.at("format_version").cast<int64_t>() != 1) {
    Fail(dir + ": not an lstm_tvm export of format version 1");
  }
  std::string library = dir + "/" + Str(manifest.at("library"));
  if (FileSha256(library) != Str(manifest.at("library_sha256"))) {
    Fail(library + " does not match the manifest's library_sha256 (a damaged or replaced "
         "file): export the folder again");
  }
  ffi::Module mod = ffi::Module::LoadFromFile(library);
  std::vector<std::shared_ptr<const ExportedOp>> ops;
  for (const auto& kv : manifest.at("ops").cast<JsonObject>()) {
    auto op = std::make_shared<ExportedOp>();
    op->op = Str(kv.first);
    op->dtype = Str(manifest.at("dtype"));
    op->dir = dir;
    JsonObject entry = kv.second.cast<JsonObject>();
    op->function = Str(entry.at("function"));
    op->func = Function(mod, dir, op->function);
    for (const auto& a : entry.at("attrs").cast<JsonObject>()) {
      op->attrs.push_back(ParseAttr(Str(a.first), a.second));
    }
    for (const ffi::Any& item : entry.at("params").cast<JsonArray>()) {
      JsonObject p = item.cast<JsonObject>();
      Param param;
      param.name = Str(p.at("name"));
      param.input = Str(p.at("role")) == "input";
      param.scalar = Str(p.at("kind")) == "scalar";
      ParseDType(Str(p.at("dtype")), &param);
      for (const ffi::Any& d : p.at("shape").cast<JsonArray>()) param.shape.push_back(ParseDim(d));
      if (auto range = p.Get(ffi::String("range"))) {
        JsonArray bounds = range->cast<JsonArray>();
        param.has_range = true;
        param.lo = ParseDim(bounds[0]);
        param.hi = ParseDim(bounds[1]);
      }
      op->params.push_back(std::move(param));
    }
    if (auto packed = entry.Get(ffi::String("prepacked"))) {
      JsonObject p = packed->cast<JsonObject>();
      op->has_prepacked = true;
      op->prepacked = Function(mod, dir, Str(p.at("function")));
      op->pack = Function(mod, dir, Str(p.at("pack_function")));
      for (const ffi::Any& panel : p.at("panels").cast<JsonArray>()) {
        std::vector<int64_t> shape;
        for (const ffi::Any& d : panel.cast<JsonObject>().at("shape").cast<JsonArray>()) {
          shape.push_back(d.cast<int64_t>());
        }
        op->panels.push_back(std::move(shape));
      }
      while (op->w_input < op->params.size() && op->params[op->w_input].name != "w") {
        ++op->w_input;
      }
      if (op->w_input == op->params.size()) Fail(dir + ": " + op->op + " has no input w");
    }
    ops.push_back(std::move(op));
  }
  g_loaded[dir] = ops;
  return ops;
}

// --- one call --------------------------------------------------------------------------------

using Dims = std::map<std::string, int64_t>;

int64_t Resolve(const Dim& d, const Dims& dims) {
  return d.symbol.empty() ? d.value : dims.at(d.symbol);
}

std::string ShapeStr(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t k = 0; k < shape.size(); ++k) s += (k ? ", " : "") + std::to_string(shape[k]);
  return s + "]";
}

// An input as ONNX Runtime hands it over.
struct Input {
  const OrtValue* value = nullptr;
  ONNXTensorElementDataType type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  std::vector<int64_t> shape;
  void* data = nullptr;
};

// Bind T and B from the inputs and check every static dim; "" if they fit, else why not.
std::string BindDims(const ExportedOp& op, const std::vector<Input>& inputs, Dims* dims) {
  size_t k = 0;
  for (const Param& p : op.params) {
    if (!p.input) continue;
    const Input& in = inputs[k++];
    if (in.type != p.ort_type) return "input " + p.name + ": wrong element type";
    if (in.shape.size() != p.shape.size()) {
      return "input " + p.name + ": expected rank " + std::to_string(p.shape.size()) +
             ", got shape " + ShapeStr(in.shape);
    }
    for (size_t a = 0; a < p.shape.size(); ++a) {
      const Dim& want = p.shape[a];
      if (want.symbol.empty()) {
        if (want.value != in.shape[a]) {
          return "input " + p.name + ": expected dim " + std::to_string(a) + " = " +
                 std::to_string(want.value) + ", got shape " + ShapeStr(in.shape);
        }
        continue;
      }
      auto it = dims->emplace(want.symbol, in.shape[a]).first;
      if (it->second != in.shape[a]) {
        return "input " + p.name + ": dim " + std::to_string(a) + " (" + want.symbol + ") is " +
               std::to_string(in.shape[a]) + ", but " + want.symbol + " = " +
               std::to_string(it->second) + " from an earlier input";
      }
    }
  }
  return "";
}

// Aligned scratch memory for a misaligned tensor (and a non-null pointer for empty ones).
struct Scratch {
  std::vector<std::unique_ptr<void, decltype(&std::free)>> blocks;
  void* Get(size_t nbytes) {
    size_t padded = (nbytes + kAlignment - 1) / kAlignment * kAlignment;
    void* p = std::aligned_alloc(kAlignment, padded ? padded : kAlignment);
    if (p == nullptr) throw std::bad_alloc();
    blocks.emplace_back(p, &std::free);
    return p;
  }
};

bool Aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % kAlignment == 0; }

size_t NumBytes(const std::vector<int64_t>& shape, DLDataType dtype) {
  size_t n = dtype.bits / 8;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  return n;
}

alignas(kAlignment) char g_empty[kAlignment];  // the data of zero-size tensors

// The element type, shape and data of a tensor ONNX Runtime hands over.
Input ReadInput(const OrtValue* value) {
  Input in;
  in.value = value;
  OrtTensorTypeAndShapeInfo* info = nullptr;
  Check(g_api->GetTensorTypeAndShape(value, &info), "input shape");
  size_t rank = 0;
  OrtStatus* st = g_api->GetTensorElementType(info, &in.type);
  if (st == nullptr) st = g_api->GetDimensionsCount(info, &rank);
  in.shape.resize(rank);
  if (st == nullptr && rank) st = g_api->GetDimensions(info, in.shape.data(), rank);
  g_api->ReleaseTensorTypeAndShapeInfo(info);
  Check(st, "input shape");
  Check(g_api->GetTensorMutableData(const_cast<OrtValue*>(value), &in.data), "input data");
  return in;
}

DLTensor CpuTensor(void* data, const std::vector<int64_t>& shape, DLDataType dtype) {
  DLTensor t{};
  t.data = data;
  t.device = DLDevice{kDLCPU, 0};
  t.ndim = static_cast<int32_t>(shape.size());
  t.dtype = dtype;
  t.shape = const_cast<int64_t*>(shape.data());
  return t;
}

// The weight panels of one export's prepacked kernel, made from a constant w (their shapes
// point into the export's, which lives as long as the process).
struct Panels {
  Scratch memory;
  std::vector<DLTensor> tensors;
};

// The panels of `op`'s prepacked kernel made from the node's w when it is a constant
// initializer of the shape and element type `op` takes; else null (w is then an input that may
// change from call to call, and the kernel packs it at every call).
std::unique_ptr<Panels> PackConstantW(const OrtKernelInfo* info, const ExportedOp& op) {
  int is_constant = 0;
  const OrtValue* value = nullptr;
  OrtStatus* st = g_api->KernelInfoGetConstantInput_tensor(info, op.w_input, &is_constant, &value);
  if (st != nullptr) {
    g_api->ReleaseStatus(st);
    return nullptr;
  }
  if (!is_constant || value == nullptr) return nullptr;
  Input w = ReadInput(value);
  const Param& param = op.params[op.w_input];
  if (w.type != param.ort_type || w.shape.size() != param.shape.size()) return nullptr;
  for (size_t a = 0; a < w.shape.size(); ++a) {
    if (w.shape[a] != param.shape[a].value) return nullptr;  // another export's I or H
  }
  auto panels = std::make_unique<Panels>();
  size_t nbytes = NumBytes(w.shape, param.dtype);
  void* data = w.data;
  if (!Aligned(data)) {
    data = panels->memory.Get(nbytes);
    std::memcpy(data, w.data, nbytes);
  }
  DLTensor w_tensor = CpuTensor(data, w.shape, param.dtype);
  const DLDataType f32{kDLFloat, 32, 1};
  for (const std::vector<int64_t>& shape : op.panels) {
    panels->tensors.push_back(CpuTensor(panels->memory.Get(NumBytes(shape, f32)), shape, f32));
  }
  std::vector<ffi::AnyView> args{&w_tensor};
  for (DLTensor& t : panels->tensors) args.emplace_back(&t);
  ffi::Any result;
  op.pack.CallPacked(args.data(), static_cast<int32_t>(args.size()), &result);
  return panels;
}

// Size the calling thread's TVM pool to `threads` (0: TVM's default, every core) before its
// kernel, where a kernel of another session left it at another size.
void SizeCallingThreadsPool(int threads) {
  thread_local int sized = 0;  // 0: the default pool
  if (sized == threads) return;
  static const auto config = ffi::Function::GetGlobal("runtime.config_threadpool");
  if (!config) Fail("TVM's runtime has no runtime.config_threadpool to size its thread pool");
  (*config)(1, threads);  // 1: TVM's kBig affinity mode, every core (x86 has no little ones)
  sized = threads;
  if (threads > 0) g_kernel_threads = threads;
}

struct Kernel {
  std::string op_name, node_name;
  int threads = 0;  // of the session's LSTM_TVM_ORT_CONFIG_KERNEL_THREADS; 0: every core
  std::vector<std::shared_ptr<const ExportedOp>> candidates;  // same op, dtype and attributes
  std::map<const ExportedOp*, std::unique_ptr<Panels>> packed;  // candidates with a constant w

  void Compute(OrtKernelContext* ctx) const {
    size_t n_in = 0;
    Check(g_api->KernelContext_GetInputCount(ctx, &n_in), "input count");
    std::vector<Input> inputs(n_in);
    for (size_t k = 0; k < n_in; ++k) {
      const OrtValue* value = nullptr;
      Check(g_api->KernelContext_GetInput(ctx, k, &value), "input");
      if (value == nullptr) Fail("input " + std::to_string(k) + " is missing");
      inputs[k] = ReadInput(value);
    }
    // the export whose static dims (I, H) fit
    const ExportedOp* op = nullptr;
    Dims dims;
    std::string why;
    for (const auto& c : candidates) {
      Dims d;
      std::string reason = BindDims(*c, inputs, &d);
      if (reason.empty()) {
        op = c.get();
        dims = std::move(d);
        break;
      }
      why += "\n  " + c->Describe() + ": " + reason;
    }
    if (op == nullptr) Fail("no loaded export fits these inputs:" + why);
    Run(*op, inputs, dims, ctx);
  }

  void Run(const ExportedOp& op, const std::vector<Input>& inputs, const Dims& dims,
           OrtKernelContext* ctx) const {
    auto found = packed.find(&op);
    const Panels* panels = found == packed.end() ? nullptr : found->second.get();
    std::vector<DLTensor> tensors(op.params.size());
    std::vector<std::vector<int64_t>> shapes(op.params.size());
    std::vector<ffi::AnyView> args(op.params.size());
    std::vector<std::pair<void*, const DLTensor*>> copy_back;  // (ORT output, aligned scratch)
    Scratch scratch;
    size_t k_in = 0, k_out = 0;
    for (size_t k = 0; k < op.params.size(); ++k) {
      const Param& p = op.params[k];
      void* data = nullptr;
      if (p.input) {
        const Input& in = inputs[k_in++];
        shapes[k] = in.shape;
        data = in.data;
        if (p.scalar) {
          int64_t value;
          std::memcpy(&value, data, sizeof(value));
          if (p.has_range) {
            int64_t lo = Resolve(p.lo, dims), hi = Resolve(p.hi, dims);
            if (value < lo || value > hi) {
              Fail("input " + p.name + ": expected " + std::to_string(lo) + " <= " + p.name +
                   " <= " + std::to_string(hi) + ", got " + std::to_string(value));
            }
          }
          args[k] = value;  // by value, as an int64
          continue;
        }
        size_t nbytes = NumBytes(shapes[k], p.dtype);
        if (nbytes == 0) {
          data = g_empty;
        } else if (!Aligned(data)) {
          void* copy = scratch.Get(nbytes);
          std::memcpy(copy, data, nbytes);
          data = copy;
          ++g_copies;
        }
      } else {
        for (const Dim& d : p.shape) shapes[k].push_back(Resolve(d, dims));
        OrtValue* value = nullptr;
        Check(g_api->KernelContext_GetOutput(ctx, k_out++, shapes[k].data(), shapes[k].size(),
                                             &value),
              "output " + p.name);
        Check(g_api->GetTensorMutableData(value, &data), "output data");
        size_t nbytes = NumBytes(shapes[k], p.dtype);
        if (nbytes == 0) {
          data = g_empty;
        } else if (!Aligned(data)) {
          void* out = data;
          data = scratch.Get(nbytes);
          copy_back.emplace_back(out, &tensors[k]);
          ++g_copies;
        }
      }
      tensors[k] = CpuTensor(data, shapes[k], p.dtype);
      args[k] = &tensors[k];
    }
    SizeCallingThreadsPool(threads);
    ffi::Any result;
    if (panels != nullptr) {  // read only here: calls may run concurrently
      auto at = args.begin() + static_cast<std::ptrdiff_t>(k_in);  // after the inputs
      for (const DLTensor& t : panels->tensors) {
        at = args.insert(at, const_cast<DLTensor*>(&t)) + 1;
      }
      op.prepacked.CallPacked(args.data(), static_cast<int32_t>(args.size()), &result);
    } else {
      op.func.CallPacked(args.data(), static_cast<int32_t>(args.size()), &result);
    }
    for (const auto& [dst, t] : copy_back) {
      std::vector<int64_t> shape(t->shape, t->shape + t->ndim);
      std::memcpy(dst, t->data, NumBytes(shape, t->dtype));
    }
  }
};

// --- the custom ops --------------------------------------------------------------------------

// One registered op: an op type for one dtype, served by the exports that hold it.
struct LstmOp : OrtCustomOp {
  std::string name;
  std::vector<ONNXTensorElementDataType> input_types, output_types;
  std::vector<std::shared_ptr<const ExportedOp>> exports;
  int threads = 0;  // LSTM_TVM_ORT_CONFIG_KERNEL_THREADS of the session options; 0: unset

  explicit LstmOp(const ExportedOp& first) : OrtCustomOp{} {
    name = first.op;
    for (const Param& p : first.params) (p.input ? input_types : output_types).push_back(p.ort_type);
    version = ORT_API_VERSION;
    GetName = [](const OrtCustomOp* op) { return Self(op)->name.c_str(); };
    GetExecutionProviderType = [](const OrtCustomOp*) -> const char* { return nullptr; };
    GetInputTypeCount = [](const OrtCustomOp* op) { return Self(op)->input_types.size(); };
    GetInputType = [](const OrtCustomOp* op, size_t k) { return Self(op)->input_types[k]; };
    GetOutputTypeCount = [](const OrtCustomOp* op) { return Self(op)->output_types.size(); };
    GetOutputType = [](const OrtCustomOp* op, size_t k) { return Self(op)->output_types[k]; };
    GetInputCharacteristic = [](const OrtCustomOp*, size_t) { return INPUT_OUTPUT_REQUIRED; };
    GetOutputCharacteristic = [](const OrtCustomOp*, size_t) { return INPUT_OUTPUT_REQUIRED; };
    GetInputMemoryType = [](const OrtCustomOp*, size_t) { return OrtMemTypeDefault; };
    GetVariadicInputMinArity = [](const OrtCustomOp*) { return 1; };
    GetVariadicInputHomogeneity = [](const OrtCustomOp*) { return 1; };
    GetVariadicOutputMinArity = [](const OrtCustomOp*) { return 1; };
    GetVariadicOutputHomogeneity = [](const OrtCustomOp*) { return 1; };
    GetStartVersion = [](const OrtCustomOp*) { return 1; };
    GetEndVersion = [](const OrtCustomOp*) { return 2147483647; };
    KernelDestroy = [](void* kernel) { delete static_cast<Kernel*>(kernel); };
    CreateKernelV2 = [](const OrtCustomOp* op, const OrtApi*, const OrtKernelInfo* info,
                        void** kernel) -> OrtStatusPtr {
      *kernel = nullptr;
      return Guard(Self(op)->name.c_str(), [&] { *kernel = Self(op)->Create(info); });
    };
    KernelComputeV2 = [](void* kernel, OrtKernelContext* ctx) -> OrtStatusPtr {
      auto* k = static_cast<Kernel*>(kernel);
      std::string where = k->op_name + " (node " + k->node_name + ")";
      return Guard(where.c_str(), [&] { k->Compute(ctx); });
    };
  }

  static const LstmOp* Self(const OrtCustomOp* op) { return static_cast<const LstmOp*>(op); }

  // The node's attribute `a.name` as the export stores it; why not, if it is absent or mistyped.
  static std::string NodeAttr(const OrtKernelInfo* info, const Attr& a, double* value) {
    OrtStatus* st;
    if (a.is_bool) {
      int64_t v = 0;
      st = g_api->KernelInfoGetAttribute_int64(info, a.name.c_str(), &v);
      if (st == nullptr && v != 0 && v != 1) {
        return "attribute " + a.name + ": expected 0 or 1, got " + std::to_string(v);
      }
      *value = static_cast<double>(v);
    } else {
      float v = 0;
      st = g_api->KernelInfoGetAttribute_float(info, a.name.c_str(), &v);
      *value = v;
    }
    if (st == nullptr) return "";
    std::string msg = g_api->GetErrorMessage(st);
    g_api->ReleaseStatus(st);
    return "attribute " + a.name + " (" + (a.is_bool ? "INT 0/1" : "FLOAT") +
           ", required on the node): " + msg;
  }

  Kernel* Create(const OrtKernelInfo* info) const {
    auto kernel = std::make_unique<Kernel>();
    kernel->op_name = name;
    kernel->threads = threads;
    size_t size = 0;
    if (g_api->KernelInfo_GetNodeName(info, nullptr, &size) == nullptr && size > 1) {
      std::string node(size, '\0');
      if (g_api->KernelInfo_GetNodeName(info, node.data(), &size) == nullptr) {
        kernel->node_name = node.c_str();
      }
    }
    std::string why;
    for (const auto& e : exports) {
      std::string reason;
      for (const Attr& a : e->attrs) {
        double v = 0;
        reason = NodeAttr(info, a, &v);
        if (!reason.empty()) Fail("node " + kernel->node_name + ": " + reason);
        // the export's value as the node's type would hold it (FLOAT is float32)
        double want = a.is_bool ? a.value : static_cast<double>(static_cast<float>(a.value));
        if (v != want) {
          std::ostringstream msg;
          msg << a.name << " is " << v << " on the node";
          reason = msg.str();
          break;
        }
      }
      if (reason.empty()) {
        kernel->candidates.push_back(e);
      } else {
        why += "\n  " + e->Describe() + ": " + reason;
      }
    }
    if (kernel->candidates.empty()) {
      Fail("node " + kernel->node_name + ": no loaded export has this node's attributes:" + why);
    }
    for (const auto& e : kernel->candidates) {
      if (!e->has_prepacked) continue;
      if (auto panels = PackConstantW(info, *e)) {
        kernel->packed[e.get()] = std::move(panels);
        ++g_prepacked;
      }
    }
    return kernel.release();
  }
};

// The session config entry `key`; empty if it is not set.
std::string ConfigEntry(const OrtSessionOptions* options, const char* key) {
  int has = 0;
  Check(g_api->HasSessionConfigEntry(options, key, &has), "config");
  if (!has) return "";
  size_t size = 0;
  Check(g_api->GetSessionConfigEntry(options, key, nullptr, &size), "config");
  std::string value(size, '\0');
  Check(g_api->GetSessionConfigEntry(options, key, value.data(), &size), "config");
  return value.c_str();
}

// LSTM_TVM_ORT_CONFIG_KERNEL_THREADS: 0 when unset.
int KernelThreads(const OrtSessionOptions* options) {
  std::string text = ConfigEntry(options, kThreadsKey);
  if (text.empty()) return 0;
  char* end = nullptr;
  errno = 0;
  long value = std::strtol(text.c_str(), &end, 10);
  if (errno != 0 || *end != '\0' || value < 1 || value > 4096) {
    Fail(std::string("session config entry ") + kThreadsKey +
         ": expected an int from 1 to 4096 (threads of each kernel), got '" + text + "'");
  }
  return static_cast<int>(value);
}

// Ops and domains live as long as the process: sessions keep pointers to them.
std::vector<std::unique_ptr<LstmOp>> g_ops;

void Register(OrtSessionOptions* options) {
  std::string dirs = ConfigEntry(options, kConfigKey);
  if (dirs.empty()) {
    Fail(std::string("set the session config entry ") + kConfigKey +
         " (export folders separated by ':') before registering this library");
  }
  int threads = KernelThreads(options);
  std::map<std::pair<std::string, std::string>, std::unique_ptr<LstmOp>> ops;  // (op, dtype)
  std::stringstream ss(dirs);
  std::string dir;
  while (std::getline(ss, dir, ':')) {
    if (dir.empty()) continue;
    for (const auto& e : LoadExport(dir)) {
      auto& op = ops[{e->op, e->dtype}];
      if (!op) {
        op = std::make_unique<LstmOp>(*e);
        op->threads = threads;
      }
      op->exports.push_back(e);
    }
  }
  if (ops.empty()) Fail(std::string(kConfigKey) + " names no export folder: '" + dirs + "'");
  OrtCustomOpDomain* domain = nullptr;
  Check(g_api->CreateCustomOpDomain(LSTM_TVM_ORT_DOMAIN, &domain), "domain");
  std::lock_guard<std::mutex> lock(g_mutex);
  for (auto& kv : ops) {
    Check(g_api->CustomOpDomain_Add(domain, kv.second.get()), "op " + kv.first.first);
    g_ops.push_back(std::move(kv.second));
  }
  Check(g_api->AddCustomOpDomain(options, domain), "domain");
}

// TVM's CPU thread pool reads these when it starts (at the first kernel), as lstm_tvm's Python
// side sets them (lstm_tvm._tvm.configure_threads): one worker per core this process may use
// (TVM's own default is half the cores on x86), no worker pinned to a core (TVM pins its
// workers but not the calling thread, which may then share a worker's core: a sequence kernel
// runs 2.5x slower) and workers that sleep soon after a kernel (LSTM_TVM_POOL_SPIN_COUNT, see
// lstm_tvm.env.POOL_SPIN_COUNT). Only variables the user left unset are set.
void ConfigureTvmThreads() {
  if (std::getenv("TVM_NUM_THREADS") == nullptr && std::getenv("OMP_NUM_THREADS") == nullptr) {
    cpu_set_t cores;
    if (sched_getaffinity(0, sizeof(cores), &cores) == 0 && CPU_COUNT(&cores) > 0) {
      setenv("TVM_NUM_THREADS", std::to_string(CPU_COUNT(&cores)).c_str(), 0);
    }
  }
  setenv("TVM_BIND_THREADS", "0", 0);
  setenv("TVM_THREAD_POOL_SPIN_COUNT", LSTM_TVM_POOL_SPIN_COUNT, 0);
}

}  // namespace

extern "C" {

// Called by ONNX Runtime when the library is registered on a SessionOptions.
__attribute__((visibility("default"))) OrtStatus* ORT_API_CALL
RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* api_base) {
  ConfigureTvmThreads();
  const OrtApi* api = api_base->GetApi(ORT_API_VERSION);
  if (api == nullptr) {  // an ONNX Runtime older than these headers: report with its own API
    const OrtApi* old = api_base->GetApi(1);
    std::string msg = std::string("lstm_tvm ORT library: built for ORT_API_VERSION ") +
                      std::to_string(ORT_API_VERSION) + ", the runtime is " +
                      api_base->GetVersionString();
    return old ? old->CreateStatus(ORT_FAIL, msg.c_str()) : nullptr;
  }
  g_api = api;
  return Guard("lstm_tvm ORT library", [&] { Register(options); });
}

// How many tensors were copied through an aligned buffer (misaligned data) since loading.
__attribute__((visibility("default"))) int64_t lstm_tvm_ort_copy_count() { return g_copies; }

// The threads an ONNX Runtime thread's TVM pool was last sized to
// (LSTM_TVM_ORT_CONFIG_KERNEL_THREADS); 0 while no session asked for it.
__attribute__((visibility("default"))) int64_t lstm_tvm_ort_kernel_threads() {
  return g_kernel_threads;
}

// How many kernels packed a constant w for a prepacked kernel since loading.
__attribute__((visibility("default"))) int64_t lstm_tvm_ort_prepacked_count() {
  return g_prepacked;
}

// The ORT_API_VERSION of the headers this library was built with.
__attribute__((visibility("default"))) int32_t lstm_tvm_ort_api_version() {
  return ORT_API_VERSION;
}

}  // extern "C"
