# A tiny package whose build needs torch: it imports torch and compiles a
# C++ extension against it with torch.utils.cpp_extension (like apex or the
# DeepSpeed ops do). Built by the cotainr-lumi pip stage end-to-end tests.
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

setup(
    name="torchext",
    version="0.1.0",
    packages=["torchext"],
    ext_modules=[CppExtension("torchext._C", ["torchext/csrc/ext.cpp"])],
    cmdclass={"build_ext": BuildExtension},
)
