// Run one op of an lstm_tvm export (default BlockLSTMGradV2) from C++, without Python.
//
//   run_block_lstm_grad EXPORT_DIR IN_DIR OUT_DIR [OP] [--prepacked] [--repeat N]
//
// EXPORT_DIR is what `lstm-tvm export -o EXPORT_DIR` wrote (manifest.json + lstm_tvm_ops.so).
// Every input of OP is read from IN_DIR/<name>.bin and every output is written to
// OUT_DIR/<name>.bin (OUT_DIR is created), in the tensor-file format of
// lstm_tvm.export.save_tensor (write IN_DIR with it from Python):
//
//   char magic[4] = "LTVT"; uint8 dtype code (DLPack: 0 int, 1 uint, 2 float); uint8 bits;
//   uint16 lanes (1); uint32 ndim; uint32 reserved (0); int64 shape[ndim];
//   then the elements, C order, little-endian.
//
// The manifest (parsed with tvm-ffi's JSON parser) gives the function name and the parameters
// in call order (inputs then outputs); "T" and "B" in a shape are bound from the inputs, so the
// output shapes follow. TVM 0.27's runtime API lives in tvm-ffi: tvm::ffi::Module::LoadFromFile
// loads the library, Module->GetFunction finds the kernel, and a raw DLTensor* is a valid
// argument (an AnyView), so plain host buffers are passed without any TVM allocation.
//
// --prepacked is how a deployment with fixed weights calls an op: the op's manifest entry
// "prepacked" names a pack function, called once to fill the float32 panels of w, and a kernel
// that takes those panels between its inputs and its outputs instead of copying w at every
// call. --repeat N calls the kernel N times on the same buffers (the last call's outputs are
// written) and prints the median time of a call to stderr.
//
// Build (see README.md, "Deployment"): link libtvm_ffi.so and libtvm_runtime.so, the latter with
// --no-as-needed: nothing here calls into it, but it must be loaded, because it provides the
// thread pool and workspace allocator that the compiled kernels call.

#include <dlpack/dlpack.h>
#include <tvm/ffi/container/array.h>
#include <tvm/ffi/container/map.h>
#include <tvm/ffi/container/tensor.h>  // TypeTraits<DLTensor*>: a DLTensor* as an argument
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/json.h>
#include <tvm/ffi/extra/module.h>
#include <tvm/ffi/function.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace ffi = tvm::ffi;
using JsonObject = ffi::Map<ffi::Any, ffi::Any>;
using JsonArray = ffi::Array<ffi::Any>;
using Dims = std::map<std::string, int64_t>;

namespace {

// TVM assumes kAllocAlignment (64-byte) aligned tensor data and does not check it: its AVX-512
// code uses aligned stores, so a plain malloc'ed buffer segfaults. Allocate aligned.
constexpr size_t kAlignment = 64;

struct AlignedFree {
  void operator()(char* p) const { std::free(p); }
};

// A host tensor: owns its shape and (aligned) bytes, exposes a DLTensor view of them.
struct HostTensor {
  std::vector<int64_t> shape;
  std::unique_ptr<char, AlignedFree> data;
  size_t nbytes = 0;
  DLTensor dl{};

  void Allocate(size_t n) {
    nbytes = n;
    size_t padded = (n + kAlignment - 1) / kAlignment * kAlignment;
    data.reset(static_cast<char*>(std::aligned_alloc(kAlignment, padded ? padded : kAlignment)));
    if (!data) throw std::bad_alloc();
    std::memset(data.get(), 0, n);
  }

  void Bind(DLDataType dtype) {
    dl.data = data.get();
    dl.device = DLDevice{kDLCPU, 0};
    dl.ndim = static_cast<int32_t>(shape.size());
    dl.dtype = dtype;
    dl.shape = shape.data();
    dl.strides = nullptr;  // compact, C order
    dl.byte_offset = 0;
  }
};

struct Header {
  char magic[4];
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
  uint32_t ndim;
  uint32_t reserved;
};

DLDataType ParseDType(const std::string& name) {
  if (name == "float32") return DLDataType{kDLFloat, 32, 1};
  if (name == "float16") return DLDataType{kDLFloat, 16, 1};
  if (name == "int64") return DLDataType{kDLInt, 64, 1};
  throw std::runtime_error("unsupported dtype " + name);
}

int64_t NumElements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

HostTensor ReadTensor(const std::string& path, DLDataType want) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  Header h{};
  in.read(reinterpret_cast<char*>(&h), sizeof(h));
  if (!in || std::memcmp(h.magic, "LTVT", 4) != 0) {
    throw std::runtime_error(path + ": not a tensor file");
  }
  if (h.code != want.code || h.bits != want.bits || h.lanes != 1) {
    throw std::runtime_error(path + ": dtype does not match the manifest");
  }
  HostTensor t;
  t.shape.resize(h.ndim);
  in.read(reinterpret_cast<char*>(t.shape.data()), 8 * static_cast<std::streamsize>(h.ndim));
  t.Allocate(NumElements(t.shape) * (h.bits / 8));
  in.read(t.data.get(), static_cast<std::streamsize>(t.nbytes));
  if (!in) throw std::runtime_error(path + ": truncated");
  return t;
}

void WriteTensor(const std::string& path, const HostTensor& t) {
  std::ofstream out(path, std::ios::binary);
  Header h{{'L', 'T', 'V', 'T'}, t.dl.dtype.code, t.dl.dtype.bits, 1,
           static_cast<uint32_t>(t.shape.size()), 0};
  out.write(reinterpret_cast<const char*>(&h), sizeof(h));
  out.write(reinterpret_cast<const char*>(t.shape.data()),
            8 * static_cast<std::streamsize>(t.shape.size()));
  out.write(t.data.get(), static_cast<std::streamsize>(t.nbytes));
  if (!out) throw std::runtime_error("cannot write " + path);
}

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string Str(const ffi::Any& v) { return std::string(v.cast<ffi::String>()); }

// A manifest dim: an int (static) or a name ("T", "B") bound from the inputs.
int64_t Dim(const ffi::Any& d, const Dims& dims) {
  auto sym = d.try_cast<ffi::String>();
  return sym ? dims.at(std::string(*sym)) : d.cast<int64_t>();
}

// Bind the dynamic dims of a manifest shape to an input's shape; check the static ones.
void BindDims(const std::string& name, const JsonArray& want, const std::vector<int64_t>& got,
              Dims* dims) {
  if (want.size() != got.size()) throw std::runtime_error("input " + name + ": wrong rank");
  for (size_t k = 0; k < got.size(); ++k) {
    if (auto sym = want[k].try_cast<ffi::String>()) {
      auto it = dims->emplace(std::string(*sym), got[k]).first;
      if (it->second != got[k]) {
        throw std::runtime_error("input " + name + ": inconsistent " + it->first);
      }
    } else if (want[k].cast<int64_t>() != got[k]) {
      throw std::runtime_error("input " + name + ": wrong shape");
    }
  }
}

// A scalar input (seq_len_max), checked against its "range" ([0, "T"]): the kernel does not.
int64_t ScalarArg(const JsonObject& p, const HostTensor& t, const Dims& dims) {
  int64_t value;
  std::memcpy(&value, t.data.get(), sizeof(value));
  if (auto range = p.Get(ffi::String("range"))) {
    JsonArray bounds = range->cast<JsonArray>();
    int64_t lo = Dim(bounds[0], dims), hi = Dim(bounds[1], dims);
    if (value < lo || value > hi) {
      throw std::runtime_error("input " + Str(p.at("name")) + " expected " + std::to_string(lo) +
                               " <= value <= " + std::to_string(hi) + ", got " +
                               std::to_string(value));
    }
  }
  return value;
}

// A function of the library, or an error naming it.
ffi::Function Lookup(const ffi::Module& mod, const std::string& name) {
  ffi::Optional<ffi::Function> func = mod->GetFunction(ffi::String(name));
  if (!func.has_value()) throw std::runtime_error("function " + name + " missing from the library");
  return *func;
}

// One call's tensors: every parameter's (inputs read from files, outputs allocated) and the
// panels of a prepacked kernel, with the argument list that points at them.
struct Call {
  std::vector<HostTensor> tensors;  // never resized: the DLTensor views stay valid
  std::vector<HostTensor> panels;
  std::vector<ffi::AnyView> args;   // inputs, panels (if any), outputs
};

// Read the inputs, allocate the outputs and fill call->args in the manifest's order.
void Prepare(const JsonArray& params, const std::string& in_dir, Call* call) {
  std::vector<HostTensor>& tensors = call->tensors;
  tensors.resize(params.size());
  call->args.resize(params.size());
  Dims dims;
  for (size_t k = 0; k < params.size(); ++k) {  // inputs: read their files, bind T and B
    JsonObject p = params[k].cast<JsonObject>();
    if (Str(p.at("role")) != "input") continue;
    DLDataType dtype = ParseDType(Str(p.at("dtype")));
    tensors[k] = ReadTensor(in_dir + "/" + Str(p.at("name")) + ".bin", dtype);
    tensors[k].Bind(dtype);  // after the move into place, so that dl.shape points at its shape
    BindDims(Str(p.at("name")), p.at("shape").cast<JsonArray>(), tensors[k].shape, &dims);
  }
  for (size_t k = 0; k < params.size(); ++k) {
    JsonObject p = params[k].cast<JsonObject>();
    HostTensor& t = tensors[k];
    if (Str(p.at("kind")) == "scalar") {
      call->args[k] = ScalarArg(p, t, dims);  // held by value in the AnyView, as an int64
      continue;
    }
    if (Str(p.at("role")) == "output") {
      for (const ffi::Any& d : p.at("shape").cast<JsonArray>()) t.shape.push_back(Dim(d, dims));
      DLDataType dtype = ParseDType(Str(p.at("dtype")));
      t.Allocate(NumElements(t.shape) * (dtype.bits / 8));
      t.Bind(dtype);
    }
    call->args[k] = &t.dl;  // a DLTensor* is passed as it is: no copy, no ownership
  }
}

// Allocate the panels the manifest's "prepacked" entry lists, fill them from w with its pack
// function (once), and put them between the inputs and the outputs of call->args.
void Pack(const ffi::Module& mod, const JsonObject& packed, const JsonArray& params,
          Call* call) {
  JsonArray panels = packed.at("panels").cast<JsonArray>();
  call->panels.resize(panels.size());
  std::vector<ffi::AnyView> pack_args;
  size_t inputs = 0;
  for (size_t k = 0; k < params.size(); ++k) {
    JsonObject p = params[k].cast<JsonObject>();
    if (Str(p.at("role")) != "input") continue;
    ++inputs;
    if (Str(p.at("name")) == "w") pack_args.push_back(&call->tensors[k].dl);
  }
  if (pack_args.empty()) throw std::runtime_error("the prepacked kernel has no input w");
  for (size_t k = 0; k < panels.size(); ++k) {
    JsonObject p = panels[k].cast<JsonObject>();
    HostTensor& t = call->panels[k];
    for (const ffi::Any& d : p.at("shape").cast<JsonArray>()) t.shape.push_back(d.cast<int64_t>());
    DLDataType dtype = ParseDType(Str(p.at("dtype")));
    t.Allocate(NumElements(t.shape) * (dtype.bits / 8));
    t.Bind(dtype);
    pack_args.push_back(&t.dl);
  }
  ffi::Function pack = Lookup(mod, Str(packed.at("pack_function")));
  ffi::Any ignored;
  pack.CallPacked(pack_args.data(), static_cast<int32_t>(pack_args.size()), &ignored);
  std::vector<ffi::AnyView> args(call->args.begin(), call->args.begin() + inputs);
  for (HostTensor& t : call->panels) args.push_back(&t.dl);
  args.insert(args.end(), call->args.begin() + inputs, call->args.end());
  call->args = std::move(args);
}

// Call func `repeat` times on the same arguments; returns the median seconds of a call.
double Time(const ffi::Function& func, std::vector<ffi::AnyView>& args, int repeat) {
  std::vector<double> seconds;
  for (int r = 0; r < repeat; ++r) {
    ffi::Any result;
    auto start = std::chrono::steady_clock::now();
    func.CallPacked(args.data(), static_cast<int32_t>(args.size()), &result);
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
                          .count());
  }
  std::nth_element(seconds.begin(), seconds.begin() + seconds.size() / 2, seconds.end());
  return seconds[seconds.size() / 2];
}

struct Options {
  std::string export_dir, in_dir, out_dir, op_name = "BlockLSTMGradV2";
  bool prepacked = false;
  int repeat = 1;
};

Options ParseOptions(int argc, char** argv) {
  Options o;
  std::vector<std::string> positional;
  for (int k = 1; k < argc; ++k) {
    std::string arg = argv[k];
    if (arg == "--prepacked") {
      o.prepacked = true;
    } else if (arg == "--repeat" && k + 1 < argc) {
      char* end = nullptr;
      long n = std::strtol(argv[++k], &end, 10);
      if (*end != '\0' || n < 1 || n > 1000000) {
        throw std::invalid_argument("--repeat expects an integer in [1, 1000000], got " +
                                    std::string(argv[k]));
      }
      o.repeat = static_cast<int>(n);
    } else if (arg.rfind("--", 0) == 0) {
      throw std::invalid_argument("unknown option " + arg);
    } else {
      positional.push_back(arg);
    }
  }
  if (positional.size() < 3 || positional.size() > 4) {
    throw std::invalid_argument("expected EXPORT_DIR IN_DIR OUT_DIR [OP]");
  }
  o.export_dir = positional[0];
  o.in_dir = positional[1];
  o.out_dir = positional[2];
  if (positional.size() == 4) o.op_name = positional[3];
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  try {
    o = ParseOptions(argc, argv);
  } catch (const std::invalid_argument& err) {
    std::cerr << err.what() << "\nusage: " << argv[0]
              << " EXPORT_DIR IN_DIR OUT_DIR [OP] [--prepacked] [--repeat N]\n";
    return 2;
  }
  try {
    auto manifest = ffi::json::Parse(ReadText(o.export_dir + "/manifest.json")).cast<JsonObject>();
    auto ops = manifest.at("ops").cast<JsonObject>();
    if (!ops.Get(ffi::String(o.op_name))) throw std::runtime_error("not in this export");
    auto op = ops.at(ffi::String(o.op_name)).cast<JsonObject>();
    auto packed = op.Get(ffi::String("prepacked"));
    if (o.prepacked && !packed) {
      throw std::runtime_error("no prepacked kernel in this export (the op packs no weights, "
                               "or it was exported with --no-prepacked)");
    }

    ffi::Module mod = ffi::Module::LoadFromFile(o.export_dir + "/" + Str(manifest.at("library")));
    JsonArray params = op.at("params").cast<JsonArray>();
    Call call;
    Prepare(params, o.in_dir, &call);
    std::string function = Str(op.at("function"));
    if (o.prepacked) {
      JsonObject entry = packed->cast<JsonObject>();
      Pack(mod, entry, params, &call);
      function = Str(entry.at("function"));
    }
    double median = Time(Lookup(mod, function), call.args, o.repeat);
    if (o.repeat > 1) {
      std::cerr << o.op_name << (o.prepacked ? " (prepacked)" : "") << ": " << o.repeat
                << " calls, median " << median * 1e6 << " us\n";
    }
    std::filesystem::create_directories(o.out_dir);
    for (size_t k = 0; k < params.size(); ++k) {
      JsonObject p = params[k].cast<JsonObject>();
      if (Str(p.at("role")) != "output") continue;
      WriteTensor(o.out_dir + "/" + Str(p.at("name")) + ".bin", call.tensors[k]);
      std::cout << Str(p.at("name")) << "\n";
    }
  } catch (const std::exception& err) {  // tvm::ffi::Error derives from std::exception
    std::cerr << o.op_name << ": " << err.what() << "\n";
    return 1;
  }
  return 0;
}
