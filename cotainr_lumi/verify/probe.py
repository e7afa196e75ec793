"""
Facts gathered inside an image for ``cotainr-lumi verify``, printed as JSON.

Run by the image's own ``python`` (``python -c <this source> <this source>
<inputs>``), so standard library only; the image layout comes in the inputs
(:func:`cotainr_lumi.verify.checks.probe_inputs`).
"""

import glob
import importlib.util
import json
import os
import re
import subprocess
import sys

#: The image paths and names to look at (checks.probe_inputs).
INPUTS = json.loads(sys.argv[2])
#: Why a record could not be used ({path or section: reason}; a FAIL row).
PROBLEMS = {}


def run(args):
    """Run a command; return its exit status and output tails."""
    try:
        p = subprocess.run(args, capture_output=True, text=True, timeout=120)
        return {"rc": p.returncode, "out": p.stdout[-4000:], "err": p.stderr[-2000:]}
    except Exception as e:  # noqa: BLE001 - report anything
        return {"rc": None, "out": "", "err": f"{type(e).__name__}: {e}"}


def ldd(path):
    """The image's ``ldd`` of `path`: {soname: resolved path or None}."""
    result = run(["ldd", path])
    deps = {}
    for line in result["out"].splitlines():
        name, sep, rest = line.strip().partition("=>")
        if sep:
            target = rest.split("(")[0].strip()
            deps[name.strip()] = None if target in ("", "not found") else target
    return {"rc": result["rc"], "deps": deps, "err": result["err"][-500:]}


def read(path):
    """Read a text file, or "" (also for a FIFO or device: never opened)."""
    if not os.path.isfile(path):
        return ""
    try:
        with open(path, errors="replace") as f:
            return f.read(200000)
    except OSError:
        return ""


def guarded(name, facts_of, *args):
    """facts_of(*args), or None with the reason in PROBLEMS (nothing ends the probe)."""
    try:
        return facts_of(*args)
    except Exception as e:  # noqa: BLE001 - a malformed image is a FAIL row
        PROBLEMS[name] = f"{type(e).__name__}: {str(e)[:200]}"
        return None


def check_depth(value, level=0):
    """Raise ValueError for JSON nested deeper than the bound (it goes back as JSON)."""
    if level > INPUTS["max_record_depth"]:
        raise ValueError(f"nested deeper than {INPUTS['max_record_depth']} levels")
    if isinstance(value, (dict, list)):
        for item in value.values() if isinstance(value, dict) else value:
            check_depth(item, level + 1)


def parse(data, kind):
    """The JSON value of a record's bytes (ValueError: too large, deep or odd)."""
    if len(data) > INPUTS["max_record_bytes"]:
        raise ValueError(f"larger than {INPUTS['max_record_bytes']} bytes, not read")
    value = json.loads(data)
    check_depth(value)
    found = {dict: "object", list: "array"}.get(type(value), type(value).__name__)
    if found != kind:
        raise ValueError(f"a JSON {found}, not an {kind}")
    return value


def load(path, kind="object"):
    """A JSON record, or None (absent; malformed: the reason goes to PROBLEMS)."""
    if os.path.exists(path) and not os.path.isfile(path):
        PROBLEMS[path] = "not a regular file (not read)"
        return None
    try:
        with open(path, "rb") as f:
            data = f.read(INPUTS["max_record_bytes"] + 1)
    except OSError:
        return None
    return guarded(path, parse, data, kind)


def entry(path):
    """Describe a directory entry (kind, link target)."""
    info = {"name": os.path.basename(path), "link": None, "kind": "missing"}
    if os.path.isdir(path):
        info["kind"] = "dir"
    elif os.path.isfile(path):
        info["kind"] = "file"
    if os.path.islink(path):
        info["link"] = os.readlink(path)
        info["target"] = os.path.realpath(path)
    return info


# The build's answer to "which Python environment" (engine/targetenv.py).
target_env = load(INPUTS["target_env_file"])
# Run as the target env's own interpreter (not whatever `python` is first
# on PATH): verify looks at the env the build installed into.
if (
    target_env
    and isinstance(target_env.get("python"), str)
    and target_env.get("prefix") != sys.prefix
    and os.environ.get("COTAINR_LUMI_VERIFY_REEXEC") != "1"
    and os.access(target_env["python"], os.X_OK)
):
    os.environ["COTAINR_LUMI_VERIFY_REEXEC"] = "1"
    python = target_env["python"]
    # argv[1] twice: the code to run, and again as its own argv[1].
    argv = [python, "-c", sys.argv[1], *sys.argv[1:]]
    guarded(INPUTS["target_env_file"], os.execv, python, argv)

labels = load(INPUTS["labels_file"]) or {}
odd = ", ".join(sorted(k for k, v in labels.items() if not isinstance(v, str)))
if odd:
    PROBLEMS[INPUTS["labels_file"]] = f"labels that are not strings: {odd[:300]}"
rocm = os.environ.get("ROCM_PATH") or "/opt/rocm"
rocm_libs = [os.path.join(rocm, "lib"), "/opt/amdgpu/lib64"]
# The env's own lib/ and, for a venv, its base env's (a conda env), never /usr.
env_prefixes = {sys.prefix}
if sys.base_prefix not in ("/usr", "/usr/local", "/"):
    env_prefixes.add(sys.base_prefix)
# Every record is read once (a malformed one goes to PROBLEMS); verify uses
# the prune manifest's content and the other records' sizes.
records = {path: load(path, kind) for path, kind in INPUTS["records"].items()}
facts = {
    "python": sys.executable,
    "prefix": sys.prefix,
    "target_env": target_env,
    # The whole environment (the image's own, under --cleanenv): a profile can
    # add variables of its own that verify must find.
    "env": dict(os.environ),
    "labels": {k: v for k, v in labels.items() if isinstance(v, str)},
    "rocm": {
        "exists": os.path.isdir(rocm),
        "opt_rocm": entry("/opt/rocm"),
        "realpath": os.path.realpath(rocm),
        "version_file": read(os.path.join(rocm, ".info/version")).strip() or None,
        "lib_names": sorted(
            {n for d in rocm_libs if os.path.isdir(d) for n in os.listdir(d)}
        ),
    },
    "env_libstdcxx": sorted(
        p
        for d in env_prefixes
        for p in glob.glob(os.path.join(d, "lib", "libstdc++.so*"))
    ),
    "files": {p: os.path.getsize(p) if os.path.isfile(p) else None for p in records},
    "prune_manifest": records.get(INPUTS["prune_manifest_file"]),
}


def torch_facts(tdir):
    """Where torch is, its versions, its lib/ entries and the librccl it loads."""
    lib = os.path.join(tdir, "lib")
    pattern = r"^(__version__|hip)\s*(?::[^=\n]*)?=\s*['\"]([^'\"\n]*)"
    found = dict(re.findall(pattern, read(os.path.join(tdir, "version.py")), re.M))
    torch = {
        "dir": tdir,
        "hip": found.get("hip") or None,
        "lib": [entry(p) for p in sorted(glob.glob(os.path.join(lib, "*")))],
        "version": found.get("__version__") or None,
    }
    hip_lib = os.path.join(lib, "libtorch_hip.so")
    if os.path.exists(hip_lib):
        torch["ldd_torch_hip"] = ldd(hip_lib)
        for name, target in torch["ldd_torch_hip"]["deps"].items():
            if name.startswith("librccl") and target and target.startswith("/"):
                torch["rccl_realpath"] = os.path.realpath(target)
    return torch


spec = importlib.util.find_spec("torch")
if spec is not None and spec.submodule_search_locations:
    facts["torch"] = torch_facts(list(spec.submodule_search_locations)[0])
else:
    facts["torch"] = None


def conf_dirs():
    """The directories /etc/ld.so.conf.d names (the loader's cache has them)."""
    lines = [
        line.split("#")[0].strip()
        for path in sorted(glob.glob("/etc/ld.so.conf.d/*.conf"))
        for line in read(path).splitlines()
    ]
    return list(dict.fromkeys(os.path.normpath(ln) for ln in lines if ln[:1] == "/"))


def plugin_files(dirs, named):
    """{dir: {plugin file name: link target or None}} (RCCL's and NCCL's names)."""
    files = {}
    for d in dirs:
        names = {
            os.path.basename(p)
            for pattern in INPUTS["plugin_patterns"]
            for p in glob.glob(os.path.join(d, pattern))
        }
        if named and os.path.dirname(named) == d and os.path.exists(named):
            names.add(os.path.basename(named))
        entries = {name: entry(os.path.join(d, name))["link"] for name in sorted(names)}
        if entries:
            files[d] = entries
    return files


def plugin_ldd(files, named):
    """``ldd`` of each file RCCL could open, each real file once (8 at most).

    RCCL opens librccl-net*.so (never a versioned name) or the file named.
    """
    done = {}
    result = {}
    for d, names in files.items():
        for name in names:
            rccl_name = name.startswith("librccl-net") and name.endswith(".so")
            if not (rccl_name or (named and name == os.path.basename(named))):
                continue
            path = os.path.join(d, name)
            real = os.path.realpath(path)
            if real not in done and len(done) < 8:
                done[real] = ldd(path)
            if real in done:
                result[path] = done[real]
    return result


def plugin_dirs(record, named, loader):
    """Where to look for the plugin: recorded, known, /opt/aws-ofi-*, the loader's."""
    dirs = list(record.get("net-plugin-dirs") or []) + INPUTS["plugin_dirs"]
    for opt in sorted(glob.glob("/opt/aws-ofi-*")):
        dirs += [opt, f"{opt}/lib", f"{opt}/lib64"]
    if named and "/" in named:
        dirs.append(os.path.dirname(named))
    return list(dict.fromkeys(os.path.normpath(d) for d in dirs + loader if d))


def rccl_tests(dirs):
    """The first rccl-tests directory there is, and whether it runs all_reduce_perf."""
    for d in filter(os.path.isdir, dirs):
        return {"dir": d, "all_reduce_perf": os.access(f"{d}/all_reduce_perf", os.X_OK)}
    return None


def network_facts():
    """Where the plugin, its libraries, libfabric and rccl-tests are in the image."""
    runtime = load(INPUTS["runtime_file"])
    record = runtime or {}
    ld_path = [p for p in (os.environ.get("LD_LIBRARY_PATH") or "").split(":") if p]
    named = os.environ.get("NCCL_NET_PLUGIN") or None
    conf = conf_dirs()
    # Where the loader looks for a bare name, after the plugin's own places.
    loader = ld_path + conf + INPUTS["loader_dirs"]
    dirs = plugin_dirs(record, named, loader)
    files = plugin_files(dirs, named)
    tests_dirs = INPUTS["rccl_tests_dirs"]
    if record.get("rccl-tests"):
        tests_dirs = [record["rccl-tests"]]
    return {
        "runtime": runtime,
        "searched": dirs,
        "conf_dirs": conf,
        "named": named,
        "plugin_files": files,
        "ldd": plugin_ldd(files, named),
        "image_libfabric": sorted(
            {
                os.path.realpath(p)
                for d in loader
                for p in glob.glob(f"{d}/libfabric.so.1")
            }
        ),
        "rccl_tests": rccl_tests(tests_dirs),
        "rccl_tests_dirs": tests_dirs,
    }


facts["network"] = guarded("network", network_facts)

runscripts_dir = INPUTS["runscripts_dir"]
scripts = {
    name: {"executable": os.access(os.path.join(runscripts_dir, name), os.X_OK)}
    for name in INPUTS["runscripts"]
}
if scripts["get-master"]["executable"]:
    get_master = os.path.join(runscripts_dir, "get-master")
    scripts["get-master"]["run"] = run([get_master, INPUTS["sample_nodelist"]])
facts["runscripts"] = scripts
facts["runscripts_on_path"] = runscripts_dir in os.environ.get("PATH", "").split(":")
if os.environ.get("WITH_CONDA") is not None:
    # Exactly as the LUMI EasyBuild modules use it: an unquoted expansion.
    facts["with_conda"] = run(
        ["bash", "-c", '$WITH_CONDA && python -c "import sys; print(sys.prefix)"']
    )


def mpi_facts():
    """The lumi-env stage's MPI record; which libmpi mpi4py loads, ldd of it."""
    check = run([sys.executable, "-c", INPUTS["load_check"]])
    found = {"record": records.get(INPUTS["mpi_file"]), "check": check, "ldd": {}}
    mark = INPUTS["load_check_mark"]
    for line in check["out"].splitlines():
        if line.startswith(mark):
            for library in json.loads(line[len(mark) :]).get("libmpi") or []:
                found["ldd"][library] = ldd(library)
    return found


facts["mpi"] = guarded("mpi", mpi_facts)
facts["problems"] = PROBLEMS
print(json.dumps(facts))
