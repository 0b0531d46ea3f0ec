// Run one op of an lstm_tvm export (default BlockLSTMGradV2) from C++, without Python.
//
//   run_block_lstm_grad EXPORT_DIR IN_DIR OUT_DIR [OP]
//
// EXPORT_DIR is what `lstm-tvm export -o EXPORT_DIR` wrote (manifest.json + lstm_tvm_ops.so).
// Every input of OP is read from IN_DIR/<name>.bin and every output is written to
// OUT_DIR/<name>.bin, in the tensor-file format of lstm_tvm.export.save_tensor:
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

#include <cstdint>
#include <cstdlib>
#include <cstring>
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

// Read the inputs, allocate the outputs and call the function; returns every parameter's tensor.
std::vector<HostTensor> Run(const ffi::Function& func, const JsonArray& params,
                            const std::string& in_dir) {
  std::vector<HostTensor> tensors(params.size());  // never resized: the DLTensor views stay valid
  std::vector<ffi::AnyView> args(params.size());
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
      args[k] = ScalarArg(p, t, dims);  // held by value in the AnyView, as an int64
      continue;
    }
    if (Str(p.at("role")) == "output") {
      for (const ffi::Any& d : p.at("shape").cast<JsonArray>()) t.shape.push_back(Dim(d, dims));
      DLDataType dtype = ParseDType(Str(p.at("dtype")));
      t.Allocate(NumElements(t.shape) * (dtype.bits / 8));
      t.Bind(dtype);
    }
    args[k] = &t.dl;  // a DLTensor* is passed as it is: no copy, no ownership
  }
  ffi::Any result;
  func.CallPacked(args.data(), static_cast<int32_t>(args.size()), &result);
  return tensors;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::cerr << "usage: " << argv[0] << " EXPORT_DIR IN_DIR OUT_DIR [OP]\n";
    return 2;
  }
  const std::string export_dir = argv[1], in_dir = argv[2], out_dir = argv[3];
  const std::string op_name = argc > 4 ? argv[4] : "BlockLSTMGradV2";
  try {
    auto manifest = ffi::json::Parse(ReadText(export_dir + "/manifest.json")).cast<JsonObject>();
    auto ops = manifest.at("ops").cast<JsonObject>();
    if (!ops.Get(ffi::String(op_name))) throw std::runtime_error("not in this export");
    auto op = ops.at(ffi::String(op_name)).cast<JsonObject>();

    ffi::Module mod = ffi::Module::LoadFromFile(export_dir + "/" + Str(manifest.at("library")));
    ffi::Optional<ffi::Function> func = mod->GetFunction(op.at("function").cast<ffi::String>());
    if (!func.has_value()) throw std::runtime_error("function missing from the library");

    JsonArray params = op.at("params").cast<JsonArray>();
    std::vector<HostTensor> tensors = Run(*func, params, in_dir);
    for (size_t k = 0; k < params.size(); ++k) {
      JsonObject p = params[k].cast<JsonObject>();
      if (Str(p.at("role")) != "output") continue;
      WriteTensor(out_dir + "/" + Str(p.at("name")) + ".bin", tensors[k]);
      std::cout << Str(p.at("name")) << "\n";
    }
  } catch (const std::exception& err) {  // tvm::ffi::Error derives from std::exception
    std::cerr << op_name << ": " << err.what() << "\n";
    return 1;
  }
  return 0;
}
