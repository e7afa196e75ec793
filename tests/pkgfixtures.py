"""Python packages and a package index made on the fly for tests and benchmarks.

- :func:`make_wheel`: a minimal pure-Python wheel (no build backend needed);
- :func:`make_sdist`: a setuptools sdist (its build needs an isolated build
  env, i.e. setuptools from an index), optionally with extra files such as a
  ``setup.py`` declaring a C extension;
- :func:`serve_index`: a PEP 503 "simple" index of such files on 127.0.0.1,
  recording the requested paths, stopped when the block ends; with ``auth``
  it answers only requests with those Basic credentials.
"""

import base64
import contextlib
import functools
import hashlib
import http.server
import io
from pathlib import Path
import tarfile
import threading
import zipfile


def make_wheel(directory, name, version, requires=(), modules=None, files=None):
    """Write a minimal pure-Python wheel (plus `modules`: name -> text, and `files`:
    path in site-packages -> text); return its path."""
    dist = name.replace("-", "_")
    filename = Path(directory) / f"{dist}-{version}-py3-none-any.whl"
    info = f"{dist}-{version}.dist-info"
    files = {
        f"{dist}/__init__.py": f"VERSION = {version!r}\n",
        f"{info}/METADATA": "Metadata-Version: 2.1\n"
        f"Name: {name}\nVersion: {version}\n"
        + "".join(f"Requires-Dist: {r}\n" for r in requires),
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        **{f"{dist}/{module}.py": text for module, text in (modules or {}).items()},
        **(files or {}),
    }
    record = []
    with zipfile.ZipFile(filename, "w") as zf:
        for path, text in files.items():
            data = text.encode()
            zf.writestr(path, data)
            digest = (
                base64.urlsafe_b64encode(hashlib.sha256(data).digest())
                .rstrip(b"=")
                .decode()
            )
            record.append(f"{path},sha256={digest},{len(data)}")
        record.append(f"{info}/RECORD,,")
        zf.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
    return filename


def make_sdist(directory, name, version, extra_files=None):
    """Write a setuptools sdist (plus `extra_files`: path -> text); return its path."""
    base = f"{name}-{version}"
    filename = Path(directory) / f"{base}.tar.gz"
    files = {
        "pyproject.toml": (
            '[build-system]\nrequires = ["setuptools>=61"]\n'
            'build-backend = "setuptools.build_meta"\n'
            f'[project]\nname = "{name}"\nversion = "{version}"\n'
        ),
        f"{name}/__init__.py": f"VERSION = {version!r}\n",
        "PKG-INFO": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        **(extra_files or {}),
    }
    with tarfile.open(filename, "w:gz") as tf:
        for path, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{base}/{path}")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return filename


class _RecordingHandler(http.server.SimpleHTTPRequestHandler):
    """Serve files quietly and record the requested paths."""

    requests = None
    auth = None  # "user:password" required (HTTP Basic), or None

    def do_GET(self):
        self.requests.append(self.path)
        wanted = self.auth and "Basic " + base64.b64encode(self.auth.encode()).decode()
        if wanted and self.headers.get("Authorization") != wanted:
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="index"')
            self.end_headers()
            return
        super().do_GET()

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def serve_index(root, files, *, auth=None):
    """
    Serve a simple index of `files` (copied under `root`) on 127.0.0.1.

    With `auth` (``"user:password"``) every request needs those credentials.

    Yields ``(index_url, requests)``; the server stops when the block ends.
    """
    root = Path(root)
    (root / "files").mkdir(parents=True, exist_ok=True)
    for path in files:
        path = Path(path)
        target = root / "files" / path.name
        if path != target:
            target.write_bytes(path.read_bytes())
        project = path.name.split("-", 1)[0].replace("_", "-").lower()
        page = root / "simple" / project
        page.mkdir(parents=True, exist_ok=True)
        page.joinpath("index.html").write_text(
            f'<html><body><a href="../../files/{path.name}">{path.name}</a></body></html>\n'
        )
    requests = []
    handler = type(
        "Handler", (_RecordingHandler,), {"requests": requests, "auth": auth}
    )
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(handler, directory=str(root))
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/simple", requests
    finally:
        server.shutdown()
        server.server_close()
