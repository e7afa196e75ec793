// cotainr-lumi e2e test extension: compiled against torch at build time.
#include <string>

#include <torch/extension.h>

torch::Tensor add_one(const torch::Tensor &x) { return x + 1; }

std::string built_with_torch() {
  return std::to_string(TORCH_VERSION_MAJOR) + "." +
         std::to_string(TORCH_VERSION_MINOR) + "." +
         std::to_string(TORCH_VERSION_PATCH);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("add_one", &add_one, "x + 1");
  m.def("built_with_torch", &built_with_torch, "torch version at build time");
}
