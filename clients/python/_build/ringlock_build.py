"""A PEP 517 build backend in the standard library alone.

Why not setuptools: with build isolation pip would download setuptools
into a fresh environment (no network, no install), and without isolation
setuptools older than 70.1 also needs the ``wheel`` package, which many
Pythons (this project's CI among them) do not have. The package is pure
Python with one source tree, so a wheel is just a zip with its metadata:
``pip install clients/python`` then works offline on any pip >= 21.3.
"""

from __future__ import annotations

import base64
import hashlib
import os
import tarfile
import zipfile
from typing import Dict, List, Optional, Tuple

NAME = "ringlock"
VERSION = "0.1.0"
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(HERE, "src", NAME)
TAG = "py3-none-any"


def _metadata() -> bytes:
    with open(os.path.join(HERE, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    head = (
        "Metadata-Version: 2.1\n"
        f"Name: {NAME}\n"
        f"Version: {VERSION}\n"
        "Summary: Client for ringlockd's session protocol: session locks, leases, "
        "fencing tokens, lost-lock callbacks\n"
        "License: MIT\n"
        "Requires-Python: >=3.9\n"
        "Classifier: Programming Language :: Python :: 3\n"
        "Classifier: Typing :: Typed\n"
        "Description-Content-Type: text/markdown\n\n"
    )
    return (head + readme).encode("utf-8")


def _wheel_file() -> bytes:
    return (f"Wheel-Version: 1.0\nGenerator: ringlock_build\nRoot-Is-Purelib: true\n"
            f"Tag: {TAG}\n").encode()


def _package_files() -> List[Tuple[str, bytes]]:
    out = []
    for name in sorted(os.listdir(SRC)):
        if name.endswith(".py") or name == "py.typed":
            with open(os.path.join(SRC, name), "rb") as f:
                out.append((f"{NAME}/{name}", f.read()))
    return out


def _write_wheel(directory: str, files: List[Tuple[str, bytes]]) -> str:
    dist_info = f"{NAME}-{VERSION}.dist-info"
    files = files + [(f"{dist_info}/METADATA", _metadata()),
                     (f"{dist_info}/WHEEL", _wheel_file()),
                     (f"{dist_info}/top_level.txt", f"{NAME}\n".encode())]
    record = []
    for path, data in files:
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{dist_info}/RECORD,,")
    name = f"{NAME}-{VERSION}-{TAG}.whl"
    with zipfile.ZipFile(os.path.join(directory, name), "w", zipfile.ZIP_DEFLATED) as z:
        for path, data in files:
            z.writestr(zipfile.ZipInfo(path, (2020, 1, 1, 0, 0, 0)), data)
        z.writestr(zipfile.ZipInfo(f"{dist_info}/RECORD", (2020, 1, 1, 0, 0, 0)),
                   "\n".join(record) + "\n")
    return name


def get_requires_for_build_wheel(config_settings: Optional[Dict[str, str]] = None) -> List[str]:
    return []


def get_requires_for_build_sdist(config_settings: Optional[Dict[str, str]] = None) -> List[str]:
    return []


def get_requires_for_build_editable(config_settings: Optional[Dict[str, str]] = None
                                    ) -> List[str]:
    return []


def build_wheel(wheel_directory: str, config_settings: Optional[Dict[str, str]] = None,
                metadata_directory: Optional[str] = None) -> str:
    return _write_wheel(wheel_directory, _package_files())


def build_editable(wheel_directory: str, config_settings: Optional[Dict[str, str]] = None,
                   metadata_directory: Optional[str] = None) -> str:
    # A .pth file puts src/ on sys.path: edits take effect without reinstalling.
    pth = (os.path.join(HERE, "src") + "\n").encode()
    return _write_wheel(wheel_directory, [(f"__editable__.{NAME}.pth", pth)])


def build_sdist(sdist_directory: str, config_settings: Optional[Dict[str, str]] = None) -> str:
    base = f"{NAME}-{VERSION}"
    name = f"{base}.tar.gz"
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz") as t:
        for rel in ["pyproject.toml", "README.md", "_build/ringlock_build.py"]:
            t.add(os.path.join(HERE, rel), f"{base}/{rel}")
        for path, _ in _package_files():
            t.add(os.path.join(HERE, "src", path), f"{base}/src/{path}")
        pkg_info = tarfile.TarInfo(f"{base}/PKG-INFO")
        data = _metadata()
        pkg_info.size = len(data)
        import io
        t.addfile(pkg_info, io.BytesIO(data))
    return name
