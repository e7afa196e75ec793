"""Compile small real ELF files for the prune tests (with the host's gcc).

Everything is built from tiny C sources with version scripts, so the tests
control exactly which symbol versions a "libstdc++" defines and which ones an
object needs.
"""

from pathlib import Path
import shutil
import subprocess

from hosttools import need_tool


def gcc(*args, cwd=None):
    """Run gcc, failing the test with its stderr on error."""
    compiler = need_tool("gcc", install="apt-get install -y gcc")
    proc = subprocess.run(
        [compiler, *map(str, args)], cwd=cwd, capture_output=True, text=True
    )
    if proc.returncode:
        raise AssertionError(f"gcc {' '.join(map(str, args))} failed:\n{proc.stderr}")


def glibcxx_versions(last):
    """GLIBCXX_3.4, GLIBCXX_3.4.1 ... GLIBCXX_3.4.<last>."""
    return ["GLIBCXX_3.4"] + [f"GLIBCXX_3.4.{i}" for i in range(1, last + 1)]


def symbol_of(version):
    """The C symbol a fake library binds to `version`."""
    return "f_" + version.replace(".", "_")


def fake_libstdcxx(directory, *, versions, filename, soname="libstdc++.so.6"):
    """A shared library defining one symbol per version (a stand-in libstdc++)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    src = directory / f".{filename}.c"
    script = directory / f".{filename}.map"
    src.write_text(
        "".join(
            f"int {symbol_of(v)}(void) {{ return {i}; }}\n"
            for i, v in enumerate(versions)
        )
    )
    nodes = [
        f"{v} {{ global: {symbol_of(v)}; {'local: *; ' if i == 0 else ''}}};"
        for i, v in enumerate(versions)
    ]
    script.write_text("\n".join(nodes) + "\n")
    out = directory / filename
    gcc(
        "-shared",
        "-fPIC",
        "-o",
        out,
        src,
        f"-Wl,-soname,{soname}",
        f"-Wl,--version-script={script}",
    )
    src.unlink()
    script.unlink()
    return out


def consumer(out, *, lib, needs, soname=None, runpath=None):
    """A shared library calling the symbols of `needs` from fake library `lib`.

    Linking against `lib` records a version need for each version in `needs`
    on the SONAME of `lib`.
    """
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    src = out.with_name(f".{out.name}.c")
    decls = "".join(f"extern int {symbol_of(v)}(void);\n" for v in needs)
    calls = " + ".join(f"{symbol_of(v)}()" for v in needs) or "0"
    src.write_text(decls + f"int consumer_sum(void) {{ return {calls}; }}\n")
    args = ["-shared", "-fPIC", "-o", out, src, "-Wl,--no-as-needed", str(lib)]
    if soname:
        args.append(f"-Wl,-soname,{soname}")
    if runpath:
        args.append(f"-Wl,-rpath,{runpath},--enable-new-dtags")
    gcc(*args)
    src.unlink()
    return out


def plain_lib(out, *, soname, needed=(), runpath=None, marker=1, rpath=None):
    """A shared library with a SONAME and DT_NEEDED entries (on full paths).

    `runpath` is written as DT_RUNPATH, `rpath` as DT_RPATH (old dtags).
    """
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    src = out.with_name(f".{out.name}.c")
    src.write_text(
        f"int marker_{abs(hash(out.name)) % 100000}(void) {{ return {marker}; }}\n"
    )
    args = [
        "-shared",
        "-fPIC",
        "-o",
        out,
        src,
        f"-Wl,-soname,{soname}",
        "-Wl,--no-as-needed",
    ]
    for dep in needed:
        dep = Path(dep)
        args += [f"-L{dep.parent}", f"-l:{dep.name}"]
    if runpath:
        args.append(f"-Wl,-rpath,{runpath},--enable-new-dtags")
    if rpath:
        args.append(f"-Wl,-rpath,{rpath},--disable-new-dtags")
    gcc(*args)
    src.unlink()
    return out


def copy_tree(src, dst):
    """Copy a directory tree keeping symlinks as symlinks."""
    shutil.copytree(src, dst, symlinks=True, dirs_exist_ok=True)
    return Path(dst)


class Kit:
    """Compiled ELF files shared by the prune tests (built once per module)."""

    def __init__(self, directory):
        d = Path(directory)
        self.dir = d
        self.sys_versions = glibcxx_versions(20) + ["CXXABI_1.3", "CXXABI_1.3.9"]
        self.env_versions = glibcxx_versions(30) + [
            "CXXABI_1.3",
            "CXXABI_1.3.9",
            "CXXABI_1.3.13",
        ]
        self.sys_lib = fake_libstdcxx(
            d / "sys", versions=self.sys_versions, filename="libstdc++.so.6.0.20"
        )
        self.env_lib = fake_libstdcxx(
            d / "env", versions=self.env_versions, filename="libstdc++.so.6.0.30"
        )
        # A "system" library with every version (for tests that prove it is never read).
        self.host_lib = fake_libstdcxx(
            d / "host", versions=self.env_versions, filename="libstdc++.so.6.0.30"
        )
        self.old_user = consumer(
            d / "users/libold.so",
            lib=self.env_lib,
            needs=["GLIBCXX_3.4.9", "CXXABI_1.3"],
            soname="libold.so",
        )
        self.new_user = consumer(
            d / "users/libnew.so",
            lib=self.env_lib,
            needs=["GLIBCXX_3.4.30", "GLIBCXX_3.4.9", "CXXABI_1.3.13"],
            soname="libnew.so",
        )
        # ROCm-like libraries.
        rocm = d / "rocm"
        self.hsa = plain_lib(
            rocm / "libhsa-runtime64.so.1.13.0", soname="libhsa-runtime64.so.1"
        )
        self.hip = plain_lib(
            rocm / "libamdhip64.so.6.1.60103",
            soname="libamdhip64.so.6",
            needed=[self.hsa],
        )
        self.rccl = plain_lib(
            rocm / "librccl.so.1.0.60103", soname="librccl.so.1", needed=[self.hip]
        )
        self.torch_hsa_other = plain_lib(
            d / "torchonly/libhsa-runtime64.so.1", soname="libhsa-runtime64.so.1.torch"
        )
        self.torch_hip_user = plain_lib(
            d / "torchonly/libtorch_hip.so",
            soname="libtorch_hip.so",
            needed=[self.hip, self.rccl],
            runpath="$ORIGIN",
        )
